#include "host_ir/timeout_policy.h"

#include <cstdlib>
#include <cstring>

#include "backends/wait_interrupt.h"
#include "multidevice/communicator.h"

namespace meshfuse {

bool abortOnTimeout() {
  const char* env = std::getenv("MESHFUSE_ABORT_ON_TIMEOUT");
  return env == nullptr || *env == '\0' || std::strcmp(env, "0") != 0;
}

void handleCommunicationTimeout(const CommunicationTimeout& e, const char* during) {
  // Ctrl-C ends a wait as a timeout does: the collective is left half done either way.
  const bool interrupted = dynamic_cast<const WaitInterrupted*>(&e) != nullptr;
  const std::string message =
      std::string(interrupted ? "interrupted " : "communication timeout ") + during + ": " + e.what();
  if (!abortOnTimeout()) {
    Communicator::instance().markBroken();            // so that the process can still exit (without MPI_Finalize)
    if (interrupted) throw WaitInterrupted(message);  // KeyboardInterrupt in Python
    throw CommunicationTimeout(message);
  }
  // abort() prints the reason, with the rank, before ending the job.
  Communicator::instance().abort(1, message + " (MESHFUSE_ABORT_ON_TIMEOUT=0 raises this instead of ending the job)");
}

}  // namespace meshfuse
