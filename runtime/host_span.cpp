// The thread's host-span recorder (see host_span.h).
#include "runtime/host_span.h"

namespace meshfuse::host_span {

namespace {
thread_local Recorder* t_recorder = nullptr;
}

Recorder* current() { return t_recorder; }

RecorderGuard::RecorderGuard(Recorder* recorder) : previous_(t_recorder) { t_recorder = recorder; }
RecorderGuard::~RecorderGuard() { t_recorder = previous_; }

}  // namespace meshfuse::host_span
