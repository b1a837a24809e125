// MESHFUSE_DEBUG: INFO prints each newly lowered program (once, not on cache hits) with the rank
// prefix; WARN prints warnings only; off prints nothing.
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "multidevice/debug_log.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

std::string stderrOf(const std::function<void()>& fn) {
  ::testing::internal::CaptureStderr();
  fn();
  return ::testing::internal::GetCapturedStderr();
}

struct LevelGuard {
  debug::Level saved = debug::level();
  ~LevelGuard() { debug::setLevel(saved); }
};

TEST(DebugLog, ParsesLevels) {
  EXPECT_EQ(debug::parseLevel("INFO"), debug::Level::Info);
  EXPECT_EQ(debug::parseLevel("info"), debug::Level::Info);
  EXPECT_EQ(debug::parseLevel("WARN"), debug::Level::Warn);
  EXPECT_EQ(debug::parseLevel(nullptr), debug::Level::Off);
  EXPECT_EQ(debug::parseLevel("VERBOSE"), debug::Level::Off);
}

TEST(DebugLog, InfoPrintsEachNewProgramOnceWithTheRankPrefix) {
  LevelGuard guard;
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {2, 3});
  f->addInput(x);
  f->addOutput(ops::unary(OpType::Relu, x));
  FusionExecutorCache fec(f);
  Tensor in = Tensor::zeros({2, 3}, DataType::Float);

  debug::setLevel(debug::Level::Info);
  std::string first = stderrOf([&] { fec.execute({in}); });
  EXPECT_NE(first.find("[meshfuse rank 0] lowered a new host program:"), std::string::npos) << first;
  EXPECT_NE(first.find("[meshfuse rank 0]   LaunchSegment"), std::string::npos) << "every line prefixed:\n" << first;
  std::string cached = stderrOf([&] { fec.execute({in}); });
  EXPECT_EQ(cached.find("lowered a new host program"), std::string::npos) << cached;

  debug::setLevel(debug::Level::Warn);
  std::string warn = stderrOf([&] {
    debug::info("an info line");
    debug::warn("a warning line");
  });
  EXPECT_EQ(warn, "[meshfuse rank 0] WARN a warning line\n");

  debug::setLevel(debug::Level::Off);
  FusionExecutorCache fresh(f);
  std::string off = stderrOf([&] {
    fresh.execute({in});
    debug::warn("not shown");
  });
  EXPECT_EQ(off, "");
}

}  // namespace
}  // namespace meshfuse
