#include "backends/ucc/ucc_team.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/backend.h"
#include "backends/poll_until.h"
#include "backends/ucc/ucc_context.h"
#include "multidevice/communicator.h"

namespace meshfuse::ucc {

namespace {

using Clock = std::chrono::steady_clock;

// UCC's OOB allgather is non-blocking (post, then test). Ours completes inside the post: every
// member makes the same exchanges in the same order, and allgatherBytes has the deadline.
ucc_status_t oobAllgather(void* src, void* dst, size_t size, void* info, void** request) {
  auto* oob = static_cast<Team::Oob*>(info);
  *request = oob;
  try {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(oob->deadline - Clock::now());
    const auto parts = oob->communicator->allgatherBytes(oob->team, std::string(static_cast<const char*>(src), size),
                                                         std::max(left, std::chrono::milliseconds(1)));
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].size() != size)
        throw std::runtime_error("ucc team creation: members sent OOB blocks of different sizes");
      std::memcpy(static_cast<char*>(dst) + i * size, parts[i].data(), size);
    }
    return UCC_OK;
  } catch (...) {  // no exception may cross UCC's C frames
    if (!oob->error) oob->error = std::current_exception();
    return UCC_ERR_NO_MESSAGE;
  }
}
ucc_status_t oobTest(void*) { return UCC_OK; }
ucc_status_t oobFree(void*) { return UCC_OK; }

}  // namespace

Team::Team(Communicator& communicator, const std::vector<int64_t>& team, int64_t rank_in_team,
           std::chrono::milliseconds timeout)
    : communicator_(communicator), oob_(new Oob{&communicator, team, Clock::now() + timeout, nullptr}) {
  Context& context = Context::instance();
  ucc_team_params_t params;
  std::memset(&params, 0, sizeof params);
  params.mask = UCC_TEAM_PARAM_FIELD_OOB | UCC_TEAM_PARAM_FIELD_EP | UCC_TEAM_PARAM_FIELD_EP_RANGE;
  params.oob.allgather = oobAllgather;
  params.oob.req_test = oobTest;
  params.oob.req_free = oobFree;
  params.oob.coll_info = oob_.get();
  params.oob.n_oob_eps = static_cast<uint32_t>(team.size());
  params.oob.oob_ep = static_cast<uint32_t>(rank_in_team);
  params.ep = static_cast<uint64_t>(rank_in_team);
  params.ep_range = UCC_COLLECTIVE_EP_RANGE_CONTIG;
  ucc_context_h handle = context.handle();
  ucc_status_t status = ucc_team_create_post(&handle, 1, &params, &team_);
  if (status == UCC_OK) {
    pollUntil(
        [&] {
          context.progress();
          status = ucc_team_create_test(team_);
          return status != UCC_INPROGRESS;
        },
        oob_->deadline);
  }
  if (oob_->error) std::rethrow_exception(oob_->error);  // a timeout of the exchange, most likely
  if (status == UCC_INPROGRESS) {
    team_ = nullptr;  // half-created: left alone
    throw CommunicationTimeout("ucc team creation on team " + teamToString(team) + " at team rank " +
                               std::to_string(rank_in_team) + ": waited " + std::to_string(timeout.count()) +
                               " ms for the other members");
  }
  if (status != UCC_OK) team_ = nullptr;
  check(status, ("ucc team creation on team " + teamToString(team)).c_str());
}

Team::~Team() {
  if (!team_ || communicator_.broken()) return;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  Context& context = Context::instance();
  pollUntil(
      [&] {
        if (ucc_team_destroy(team_) != UCC_INPROGRESS) return true;
        context.progress();
        return false;
      },
      deadline);
}

}  // namespace meshfuse::ucc
