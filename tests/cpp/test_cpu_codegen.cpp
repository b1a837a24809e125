// CPU codegen (runtime/cpu/pointwise_codegen.h, host_compiler.h): generated tile kernels compile
// with the host's compiler, are cached on disk, and compute what the interpreter does, for
// pointwise segments and for the rows of normalization segments. ctest also
// reruns the CpuPointwise and CpuRandom suites with MESHFUSE_CPU_CODEGEN=always
// (tests/CMakeLists.txt), which checks every expressible op against the float64 reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "norm_fusions.h"
#include "ops/ops.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/fast_exp.h"
#include "runtime/cpu/host_compiler.h"
#include "runtime/cpu/pointwise_codegen.h"
#include "scoped_env.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

namespace fs = std::filesystem;
using cpu::TileProgram;
using testing::ScopedEnv;

fs::path freshCacheDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("meshfuse-codegen-test-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

size_t countObjects(const fs::path& dir) {
  size_t n = 0;
  if (!fs::exists(dir)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".so" ? 1 : 0;
  return n;
}

TileProgram::Step step(OpType op, int a, int b, int out, double sb = 0) {
  TileProgram::Step s;
  s.op = op;
  s.a.slot = a;
  s.b.slot = b;
  s.b.scalar = sb;
  s.out = out;
  return s;
}

TEST(CpuCodegen, KernelComputesTheOpsWithTheInterpretersNanAndSelectRules) {
  const fs::path dir = freshCacheDir("ops");
  const ScopedEnv cache("MESHFUSE_CACHE_DIR", dir.string());
  // out0 = max(x, y); out1 = where(x < 0.5, min(x, y), x * 2); out2 = tanh(x) (a final output).
  TileProgram p;
  p.num_slots = 6;
  p.input_slots = {0, 1};
  TileProgram::Step mx = step(OpType::Max, 0, 1, 2);
  mx.writes_output = true;
  p.steps.push_back(mx);
  p.steps.push_back(step(OpType::Lt, 0, -1, 3, 0.5));
  p.steps.push_back(step(OpType::Min, 0, 1, 4));
  p.steps.push_back(step(OpType::Mul, 0, -1, 5, 2.0));
  TileProgram::Step wh = step(OpType::Where, 3, 4, 2);
  wh.c.slot = 5;
  wh.writes_output = true;
  p.steps.push_back(wh);
  p.steps.push_back(step(OpType::Tanh, 0, -1, 3));
  p.final_outputs = {3};
  const auto source = cpu::tileKernelSource(p);
  ASSERT_TRUE(source.has_value());
  const cpu::TileKernel kernel = cpu::compiledTileKernel(*source, cpu::kTileKernelSymbol);
  ASSERT_NE(kernel, nullptr) << "the host compiler could not build the kernel";
  EXPECT_EQ(countObjects(dir), 1U);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {1.0f, -3.0f, nan, 0.25f, 2.0f, -0.0f, 7.0f};
  std::vector<float> y = {2.0f, nan, 1.0f, -1.0f, 2.0f, 0.0f, -7.0f};
  const size_t n = x.size();
  std::vector<float> o0(n), o1(n), o2(n);
  const float* in[] = {x.data(), y.data()};
  float* out[] = {o0.data(), o1.data(), o2.data()};
  kernel(in, out, static_cast<long>(n));
  for (size_t i = 0; i < n; ++i) {
    const float a = x[i], b = y[i];
    const float want_max = (a != a || a > b) ? a : b;  // NaN from either side
    const float want_min = (a != a || a < b) ? a : b;
    const float want_where = a < 0.5f ? want_min : a * 2.0f;
    const auto same = [](float u, float v) { return (std::isnan(u) && std::isnan(v)) || u == v; };
    EXPECT_TRUE(same(o0[i], want_max)) << i << ": max " << o0[i] << " want " << want_max;
    EXPECT_TRUE(same(o1[i], want_where)) << i << ": where " << o1[i] << " want " << want_where;
    EXPECT_TRUE(same(o2[i], cpu::tanhFloat(a))) << i << ": tanh " << o2[i];
  }
  // A second request for the same source is served from memory, a new process from the disk.
  EXPECT_EQ(cpu::compiledTileKernel(*source, cpu::kTileKernelSymbol), kernel);
  fs::remove_all(dir);
}

TEST(CpuCodegen, OpsWithoutAGeneratedFormAreLeftToTheInterpreter) {
  TileProgram p;
  p.num_slots = 3;
  p.input_slots = {0, 1};
  p.steps.push_back(step(OpType::Pow, 0, 1, 2));
  p.final_outputs = {2};
  EXPECT_FALSE(cpu::tileKernelSource(p).has_value());
  TileProgram::Step half_cast = step(OpType::Cast, 0, -1, 2);
  half_cast.cast_to = DataType::Half;
  p.steps = {half_cast};
  EXPECT_FALSE(cpu::tileKernelSource(p).has_value());
}

TEST(CpuCodegen, AFailingCompilerFallsBackToNothing) {
  const fs::path dir = freshCacheDir("fail");
  const ScopedEnv cache("MESHFUSE_CACHE_DIR", dir.string());
  const ScopedEnv cxx("MESHFUSE_CXX", "false");  // runs, and fails
  TileProgram p;
  p.num_slots = 2;
  p.input_slots = {0};
  p.steps.push_back(step(OpType::Add, 0, -1, 1, 42.0));  // a source no other test compiles
  p.final_outputs = {1};
  EXPECT_EQ(cpu::compiledTileKernel(*cpu::tileKernelSource(p), cpu::kTileKernelSymbol), nullptr);
  EXPECT_EQ(countObjects(dir), 0U);
  fs::remove_all(dir);
}

TEST(CpuCodegen, ModeComesFromTheEnvironment) {
  {
    const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", "off");
    EXPECT_EQ(cpu::codegenModeFromEnvironment(), cpu::CodegenMode::Off);
  }
  {
    const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", "always");
    EXPECT_EQ(cpu::codegenModeFromEnvironment(), cpu::CodegenMode::Always);
  }
  const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", "sometimes");
  EXPECT_THROW(cpu::codegenModeFromEnvironment(), std::invalid_argument);
}

// A whole segment: the layer's GELU backward chain at a size MESHFUSE_CPU_CODEGEN=auto compiles,
// against the float64 reference, and compiled for real (an object lands in the cache).
TEST(CpuCodegen, AutoCompilesALargeChainThatMatchesTheReference) {
  const fs::path dir = freshCacheDir("auto");
  const ScopedEnv cache("MESHFUSE_CACHE_DIR", dir.string());
  const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", "auto");
  Fusion f;
  TensorView* u = f.newTensor(DataType::Float, {256, 1024});
  TensorView* dy = f.newTensor(DataType::Float, {256, 1024});
  f.addInput(u);
  f.addInput(dy);
  const auto k = [&](double value) { return f.newScalar(DataType::Double, value); };
  const auto mul = [](Val* x, Val* y) { return ops::binary(OpType::Mul, x, y); };
  const auto add = [](Val* x, Val* y) { return ops::binary(OpType::Add, x, y); };
  const double c = 0.7978845608028654, a = 0.044715;
  TensorView* u3 = mul(mul(u, u), u);
  TensorView* t = ops::unary(OpType::Tanh, mul(add(u, mul(u3, k(a))), k(c)));
  TensorView* left = mul(add(t, k(1.0)), k(0.5));
  TensorView* right = mul(mul(mul(u, k(0.5)), ops::binary(OpType::Sub, k(1.0), mul(t, t))),
                          mul(add(mul(mul(u, u), k(3 * a)), k(1.0)), k(c)));
  f.addOutput(mul(dy, add(left, right)));
  ValueMap v;
  v.tensors[u] = testing::randomTensor(u->shape(), DataType::Float, 7, -4.0, 4.0);
  v.tensors[dy] = testing::randomTensor(dy->shape(), DataType::Float, 8);
  testing::checkAgainstReference(f, Segment::Kind::Pointwise, v, "gelu backward, compiled");
  EXPECT_EQ(countObjects(dir), 1U) << "auto did not compile a 256 x 1024, 17-op chain";
  fs::remove_all(dir);
}

// Normalization segments (runtime/cpu/normalization.cpp) compile each stage of a row (its
// elementwise steps with the reduction that ends it and any outer-reduction accumulations) into one
// loop: every norm, forward and backward, at row lengths with a partial block of 16 (37, 1000) and
// over more than one 4096-element chunk (5000), against the float64 reference.
TEST(CpuCodegen, NormalizationStagesCompileAndMatchTheReference) {
  const fs::path dir = freshCacheDir("norms");
  const ScopedEnv cache("MESHFUSE_CACHE_DIR", dir.string());
  const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", "always");
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{53, 37}, {19, 1000}, {5, 5000}};
  uint64_t seed = 40;
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    for (const auto& [rows, row] : shapes) {
      Fusion f;
      ValueMap v;
      auto input = [&](DataType dt, std::vector<int64_t> shape, double lo, double hi) {
        TensorView* tv = f.newTensor(dt, shape);
        f.addInput(tv);
        v.tensors[tv] = testing::randomTensor(shape, dt, seed++, lo, hi);
        return tv;
      };
      for (TensorView* out : testing_norms::defineNorm(norm, f, DataType::Float, rows, row, input)) f.addOutput(out);
      const cpu::NormalizationCodegenCounts before = cpu::normalizationCodegenCounts();
      const std::string what =
          testing_norms::toString(norm) + " [" + std::to_string(rows) + ", " + std::to_string(row) + "]";
      testing::checkAgainstReference(f, Segment::Kind::Normalization, v, what + ", compiled");
      const cpu::NormalizationCodegenCounts after = cpu::normalizationCodegenCounts();
      EXPECT_GE(after.compiled - before.compiled, 2) << what << ": the row's stages did not run compiled";
      EXPECT_EQ(after.interpreted, before.interpreted) << what;
    }
  }
  EXPECT_GE(countObjects(dir), 5U);
  fs::remove_all(dir);
}

// A stage with an op that has no generated form (pow) runs interpreted, the others compiled, and
// the whole still matches the reference; with MESHFUSE_CPU_CODEGEN=off nothing compiles.
TEST(CpuCodegen, NormalizationStageWithoutAGeneratedFormIsInterpreted) {
  const fs::path dir = freshCacheDir("norm-pow");
  const ScopedEnv cache("MESHFUSE_CACHE_DIR", dir.string());
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {24, 1000});
  TensorView* w = f.newTensor(DataType::Float, {1000});
  f.addInput(x);
  f.addInput(w);
  const auto k = [&](double value) { return f.newScalar(DataType::Double, value); };
  // RMSNorm written with pow: stage 1 (pow, then the mean) has no generated form; stage 2 has.
  TensorView* ms = ops::reduction(OpType::Mean, ops::binary(OpType::Pow, x, k(2.0)), {1}, false);
  TensorView* rstd = ops::unary(OpType::Rsqrt, ops::binary(OpType::Add, ms, k(1e-6)));
  f.addOutput(ops::binary(OpType::Mul, ops::binary(OpType::Mul, x, ops::broadcastInDim(rstd, {24, 1000}, {0})), w));
  ValueMap v;
  v.tensors[x] = testing::randomTensor(x->shape(), DataType::Float, 50);
  v.tensors[w] = testing::randomTensor(w->shape(), DataType::Float, 51, 0.5, 1.5);
  for (const char* setting : {"always", "off"}) {
    const ScopedEnv mode("MESHFUSE_CPU_CODEGEN", setting);
    const cpu::NormalizationCodegenCounts before = cpu::normalizationCodegenCounts();
    testing::checkAgainstReference(f, Segment::Kind::Normalization, v, std::string("rms norm with pow, ") + setting);
    const cpu::NormalizationCodegenCounts after = cpu::normalizationCodegenCounts();
    const bool on = std::string(setting) == "always";
    EXPECT_EQ(after.interpreted - before.interpreted, on ? 1 : 0) << setting;
    EXPECT_EQ(after.compiled - before.compiled, on ? 1 : 0) << setting;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshfuse
