// Records what each instruction did and when, per lane (the main compute lane and the
// communication streams), and writes it as Chrome-trace / Perfetto JSON ("traceEvents").
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace meshfuse {

class Tracer {
 public:
  struct Event {
    std::string name;
    std::string category;  // "compute" or "communication"
    int64_t lane = 0;      // 0 = compute; 1 + k = communication stream k
    double begin_us = 0;
    double end_us = 0;
  };
  Tracer() : origin_(std::chrono::steady_clock::now()) {}
  double nowUs() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
  }
  void add(std::string name, std::string category, int64_t lane, double begin_us, double end_us) {
    events_.push_back({std::move(name), std::move(category), lane, begin_us, end_us});
  }
  const std::vector<Event>& events() const { return events_; }
  // The events as JSON objects (without the enclosing array), with pid = rank.
  std::string toJsonEvents(int64_t rank) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  std::vector<Event> events_;
};

// Writes {"traceEvents": [...]} from per-rank event lists (each from toJsonEvents).
void writeTrace(const std::string& path, const std::vector<std::string>& per_rank_events);
// Throws UserError when `path` cannot be written (its folder, where it does not exist yet): checked before
// an execution runs, so that every rank raises instead of rank 0 alone once the program has run.
void checkTraceWritable(const std::string& path);

}  // namespace meshfuse
