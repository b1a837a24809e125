#include "backends/ucc/ucc_oob.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "multidevice/communicator.h"
#include "multidevice/timeout_env.h"

namespace meshfuse::ucc {

namespace {

ucc_status_t allgather(void* src, void* dst, size_t size, void* info, void** request) {
  auto* oob = static_cast<Oob*>(info);
  *request = oob;
  try {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(oob->deadline - std::chrono::steady_clock::now());
    const auto parts = oob->communicator->allgatherBytes(oob->members, std::string(static_cast<const char*>(src), size),
                                                         std::max(left, std::chrono::milliseconds(1)));
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].size() != size) throw std::runtime_error("ucc: members sent OOB blocks of different sizes");
      std::memcpy(static_cast<char*>(dst) + i * size, parts[i].data(), size);
    }
    return UCC_OK;
  } catch (...) {  // no exception may cross UCC's C frames
    if (!oob->error) oob->error = std::current_exception();
    return UCC_ERR_NO_MESSAGE;
  }
}
ucc_status_t test(void*) { return UCC_OK; }
ucc_status_t release(void*) { return UCC_OK; }

}  // namespace

ucc_oob_coll_t Oob::coll(int64_t my_index) {
  ucc_oob_coll_t c;
  std::memset(&c, 0, sizeof c);
  c.allgather = allgather;
  c.req_test = test;
  c.req_free = release;
  c.coll_info = this;
  c.n_oob_eps = static_cast<uint32_t>(members.size());
  c.oob_ep = static_cast<uint32_t>(my_index);
  return c;
}

void Oob::rethrow() const {
  if (error) std::rethrow_exception(error);
}

std::chrono::milliseconds timeoutFromEnvironment() { return timeoutFromEnvironmentOr(std::chrono::seconds(300)); }

}  // namespace meshfuse::ucc
