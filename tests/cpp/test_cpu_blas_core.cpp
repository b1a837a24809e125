// OpenBLAS's core type (runtime/cpu/blas_core.h): what libmeshfuse decided at load, and switching
// the core family at run time, with a linear segment checked against the float64 reference under
// each family.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ops/ops.h"
#include "runtime/cpu/blas_core.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using testing::checkAgainstReference;
using testing::randomTensor;

// y = x @ w^T + b on [67, 300] x [130, 300]: several of the kernels' register blocks and a ragged edge.
void checkLinear(const std::string& what) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {67, 300});
  TensorView* w = f.newTensor(DataType::Float, {130, 300});
  TensorView* b = f.newTensor(DataType::Float, {130});
  for (TensorView* tv : {x, w, b}) f.addInput(tv);
  f.addOutput(ops::linear(x, w, b));
  ValueMap v;
  v.tensors[x] = randomTensor({67, 300}, DataType::Float, 1);
  v.tensors[w] = randomTensor({130, 300}, DataType::Float, 2);
  v.tensors[b] = randomTensor({130}, DataType::Float, 3);
  checkAgainstReference(f, Segment::Kind::Matmul, v, what, 20.0);
}

TEST(CpuBlasCore, DecidedAtLoad) {
  const cpu::BlasCore& core = cpu::blasCore();
  EXPECT_FALSE(core.reason.empty());
  EXPECT_EQ(core.active, cpu::blasCoreName());
  if (std::getenv("OPENBLAS_CORETYPE")) {
    EXPECT_FALSE(core.switched) << core.reason;  // the user's choice stands
  } else if (!cpu::blasCoreForCpu().empty() && core.reason.find("DYNAMIC_ARCH") == std::string::npos) {
    // A CPU with AVX2 and FMA never runs OpenBLAS's SSE fallback kernels.
    EXPECT_FALSE(cpu::isFallbackBlasCore(core.active)) << core.active << ": " << core.reason;
  }
  checkLinear("linear on the core chosen at load (" + core.active + ")");
}

TEST(CpuBlasCore, FamilyForCpu) {
  const std::string family = cpu::blasCoreForCpu();
  EXPECT_TRUE(family.empty() || family == "SkylakeX" || family == "Haswell") << family;
  EXPECT_TRUE(cpu::isFallbackBlasCore("Prescott"));
  EXPECT_FALSE(cpu::isFallbackBlasCore("SkylakeX"));
  EXPECT_FALSE(cpu::isFallbackBlasCore("Haswell"));
}

TEST(CpuBlasCore, SwitchAndBack) {
  const std::string before = cpu::blasCoreName();
  if (!cpu::switchBlasCore("Prescott")) GTEST_SKIP() << "OpenBLAS is not a DYNAMIC_ARCH build";
  EXPECT_EQ(cpu::blasCoreName(), "Prescott");
  checkLinear("linear on Prescott kernels");
  const std::string family = cpu::blasCoreForCpu();
  if (!family.empty()) {
    ASSERT_TRUE(cpu::switchBlasCore(family));
    checkLinear("linear on " + cpu::blasCoreName() + " kernels");
  }
  const char* env_before = std::getenv("OPENBLAS_CORETYPE");
  ASSERT_TRUE(cpu::switchBlasCore(before));
  EXPECT_EQ(cpu::blasCoreName(), before);
  // The environment is left as it was.
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE") == nullptr, env_before == nullptr);
}

}  // namespace
}  // namespace meshfuse
