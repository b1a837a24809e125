// Host spans (runtime/host_span.h): recorded only while a recorder is installed on the thread,
// nested in the order they close, and the previous recorder restored after a guard.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/host_span.h"

namespace meshfuse {
namespace {

struct Span {
  std::string name;
  double begin_us, end_us;
};

class ListRecorder final : public host_span::Recorder {
 public:
  double nowUs() const override { return ++clock_; }
  void record(const char* name, double begin_us, double end_us) override { spans.push_back({name, begin_us, end_us}); }
  std::vector<Span> spans;

 private:
  mutable double clock_ = 0;
};

TEST(HostSpan, NothingIsRecordedWithoutARecorder) {
  ASSERT_EQ(host_span::current(), nullptr);
  { host_span::Scope span("unseen"); }
  ListRecorder recorder;
  {
    host_span::RecorderGuard guard(&recorder);
    EXPECT_EQ(host_span::current(), &recorder);
  }
  EXPECT_EQ(host_span::current(), nullptr);
  { host_span::Scope span("after the guard"); }
  EXPECT_TRUE(recorder.spans.empty());
}

TEST(HostSpan, NestedSpansCloseInnerFirstInsideTheOuter) {
  ListRecorder recorder;
  host_span::RecorderGuard guard(&recorder);
  {
    host_span::Scope outer("outer");
    { host_span::Scope inner("inner"); }
  }
  ASSERT_EQ(recorder.spans.size(), 2u);
  EXPECT_EQ(recorder.spans[0].name, "inner");
  EXPECT_EQ(recorder.spans[1].name, "outer");
  EXPECT_LT(recorder.spans[1].begin_us, recorder.spans[0].begin_us);
  EXPECT_LT(recorder.spans[0].begin_us, recorder.spans[0].end_us);
  EXPECT_LT(recorder.spans[0].end_us, recorder.spans[1].end_us);
}

TEST(HostSpan, AGuardRestoresThePreviousRecorderAndStaysOnItsThread) {
  ListRecorder first, second;
  host_span::RecorderGuard outer(&first);
  {
    host_span::RecorderGuard inner(&second);
    host_span::Scope span("to the second");
  }
  { host_span::Scope span("to the first"); }
  std::thread([] {
    EXPECT_EQ(host_span::current(), nullptr);  // another thread: none installed there
    host_span::Scope span("on another thread");
  }).join();
  ASSERT_EQ(first.spans.size(), 1u);
  EXPECT_EQ(first.spans[0].name, "to the first");
  ASSERT_EQ(second.spans.size(), 1u);
  EXPECT_EQ(second.spans[0].name, "to the second");
}

}  // namespace
}  // namespace meshfuse
