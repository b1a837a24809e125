#include "backends/mpi/mpi_work.h"

#include "backends/mpi/mpi_helpers.h"

namespace meshfuse::mpi {

namespace {
// What an abandoned operation still needs: MPI may write into the buffers whenever the late peer
// arrives, so they must never be freed. Only reached after a timeout (the job is broken then) or
// when a Work is dropped unwaited.
struct Abandoned {
  std::vector<MPI_Request> requests;
  std::vector<std::shared_ptr<Storage>> buffers;
  std::vector<std::pair<Tensor, Tensor>> copies_back;
};
}  // namespace

MpiWork::~MpiWork() {
  if (!finished_ && !isFinalized()) abandon();
}

bool MpiWork::test() {
  if (finished_) return true;
  int done = 0;
  const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) check(rc, label_.toString().c_str());
  if (done) finish();
  return finished_;
}

void MpiWork::wait(std::chrono::milliseconds timeout) {
  if (test()) return;  // a small operation is often done already: no clock reads
  const auto start = std::chrono::steady_clock::now();
  bool done = false;
  try {
    done = pollUntil(requests, start + timeout);
  } catch (const std::runtime_error& e) {  // an MPI error: say which operation met it
    throw std::runtime_error(label_.toString() + ": " + e.what());
  }
  if (done) {
    finish();
    return;
  }
  const std::string waited = secondsToString(std::chrono::steady_clock::now() - start);
  if (cancellable_) {
    for (MPI_Request& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    // A cancelled receive completes at once; afterwards nothing refers to the buffers.
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    finished_ = true;  // cancelled, not completed: no copy back
  } else {
    abandon();
  }
  throw CommunicationTimeout(label_.toString() + ": waited " + waited + " (timeout " + std::to_string(timeout.count()) +
                             " ms); a member of the team did not take part");
}

void MpiWork::finish() {
  for (auto& [host, device] : copies_back) device.copyFrom(host);  // host -> CUDA
  copies_back.clear();
  buffers.clear();
  finished_ = true;
}

// The Abandoned block is never deleted, by design (see the header): the analyzer's leak is meant.
// NOLINTBEGIN(clang-analyzer-cplusplus.NewDeleteLeaks)
void MpiWork::abandon() {
  static_cast<void>(new Abandoned{std::move(requests), std::move(buffers), std::move(copies_back)});
  requests.clear();
  buffers.clear();
  copies_back.clear();
  finished_ = true;
}
// NOLINTEND(clang-analyzer-cplusplus.NewDeleteLeaks)

}  // namespace meshfuse::mpi
