// Ctrl-C during a long wait. A rank waiting in a collective for a late peer polls (poll_until.h)
// with the GIL released, so Python saw SIGINT only when the wait ended: after the peer arrived, or
// MESHFUSE_TIMEOUT later (600 s by default). The front end installs a check that runs Python's
// signal handlers; a long wait asks it every 100 ms and, when it reports an interrupt, ends with
// WaitInterrupted, which the timeout policy treats as a timeout (the half-done collective leaves
// the world unusable: the job ends, or with MESHFUSE_ABORT_ON_TIMEOUT=0 Python gets KeyboardInterrupt).
#pragma once
#include "backends/backend.h"

namespace meshfuse {

class WaitInterrupted : public CommunicationTimeout {
 public:
  using CommunicationTimeout::CommunicationTimeout;
};

// Whether the user asked to interrupt (a pending SIGINT): set by the Python bindings, null in C++ programs.
using InterruptCheck = bool (*)();
void setWaitInterruptCheck(InterruptCheck check);

// Throws WaitInterrupted when the installed check reports an interrupt.
void throwIfWaitInterrupted();

}  // namespace meshfuse
