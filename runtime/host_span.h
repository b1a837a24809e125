// Named spans of host time inside one segment's launch (a CUDA executor's steps: planning, allocating,
// each library call), recorded only while a host trace is taken (execute(trace=..., trace_host=True),
// host_ir/evaluator.cpp installs the recorder): where a host-bound pass spends each segment's tens of
// microseconds, which the segment's own span does not say. Off (no recorder on the thread) a scope costs
// one thread-local read.
#pragma once

namespace meshfuse::host_span {

// Receives each finished span; times in microseconds on the recorder's own clock.
class Recorder {
 public:
  virtual ~Recorder() = default;
  virtual double nowUs() const = 0;
  virtual void record(const char* name, double begin_us, double end_us) = 0;
};

// The calling thread's recorder (nullptr: none, spans cost nothing).
Recorder* current();

// Installs `recorder` on the calling thread for the guard's lifetime (the previous one after it).
class RecorderGuard {
 public:
  explicit RecorderGuard(Recorder* recorder);
  ~RecorderGuard();
  RecorderGuard(const RecorderGuard&) = delete;
  RecorderGuard& operator=(const RecorderGuard&) = delete;

 private:
  Recorder* previous_;
};

// One span from construction to destruction, named by a string literal (kept by pointer).
class Scope {
 public:
  explicit Scope(const char* name) : recorder_(current()), name_(name) {
    if (recorder_ != nullptr) begin_us_ = recorder_->nowUs();
  }
  ~Scope() {
    if (recorder_ != nullptr) recorder_->record(name_, begin_us_, recorder_->nowUs());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Recorder* recorder_;
  const char* name_;
  double begin_us_ = 0;
};

}  // namespace meshfuse::host_span
