#include "backends/ucc/ucc_work.h"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends/poll_until.h"
#include "backends/ucc/ucc_context.h"
#include "backends/ucc/ucc_types.h"

namespace meshfuse::ucc {

namespace {
// What an abandoned operation still needs: UCC may write into the buffers whenever the late peer
// arrives, so they are never freed, and its requests are never finalized.
struct Abandoned {
  std::vector<ucc_coll_req_h> requests;
  std::vector<std::shared_ptr<Storage>> buffers;
  std::vector<std::pair<Tensor, Tensor>> copies_back;
  std::vector<std::pair<Tensor, Tensor>> keys_back;
};
}  // namespace

UccWork::UccWork(OpLabel label) : label_(std::move(label)) { Context::instance().started(); }

UccWork::~UccWork() { abandon(); }

void UccWork::post(ucc_team_h team, ucc_coll_args_t& args) {
  ucc_coll_req_h request = nullptr;
  ucc_status_t status = ucc_collective_init(&args, &request, team);
  if (status == UCC_OK) {
    status = ucc_collective_post(request);
    if (status != UCC_OK) ucc_collective_finalize(request);
  }
  if (status != UCC_OK)
    throw std::runtime_error(label_.toString() + ": UCC could not post it: " + ucc_status_string(status));
  requests_.push_back(request);
}

bool UccWork::test() {
  if (finished_) return true;
  if (abandoned_) return false;
  Context::instance().progress();
  for (ucc_coll_req_h& request : requests_) {
    if (!request) continue;
    const ucc_status_t status = ucc_collective_test(request);
    if (status == UCC_INPROGRESS || status == UCC_OPERATION_INITIALIZED) return false;
    ucc_collective_finalize(request);
    request = nullptr;
    if (status != UCC_OK) {
      abandon();
      throw std::runtime_error(label_.toString() + " failed: " + ucc_status_string(status));
    }
  }
  if (from_self.valid()) {
    if (from_self.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    from_self.get();  // a size or dtype mismatch with the matching send throws here
  }
  finish();
  return true;
}

void UccWork::wait(std::chrono::milliseconds timeout) {
  if (test()) return;  // a small operation is often done already: no clock reads
  if (abandoned_) throw CommunicationTimeout(label_.toString() + ": abandoned after an earlier timeout or error");
  const auto start = std::chrono::steady_clock::now();
  if (pollUntil([&] { return test(); }, start + timeout)) return;
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.3f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  abandon();
  throw CommunicationTimeout(label_.toString() + ": waited " + waited + " (timeout " + std::to_string(timeout.count()) +
                             " ms); a member of the team did not take part");
}

void UccWork::finish() {
  for (auto& [result, destination] : copies_back) destination.copyFrom(result);
  copies_back.clear();
  for (auto& [keys, destination] : keys_back) ucc::fromOrderedKeys(keys, destination);
  keys_back.clear();
  buffers.clear();
  finished_ = true;
  Context::instance().finished();
}

// The Abandoned block is never freed, by design (see the header): the analyzer's leak is meant.
// NOLINTBEGIN(clang-analyzer-cplusplus.NewDeleteLeaks)
void UccWork::abandon() {
  if (finished_ || abandoned_) return;
  new Abandoned{std::move(requests_), std::move(buffers), std::move(copies_back), std::move(keys_back)};
  requests_.clear();
  abandoned_ = true;
  Context::instance().finished();
}
// NOLINTEND(clang-analyzer-cplusplus.NewDeleteLeaks)

}  // namespace meshfuse::ucc
