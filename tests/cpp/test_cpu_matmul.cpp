// CPU executor, matmul and linear segments (OpenBLAS): dtypes, 1-D operands, batch broadcasting,
// transposed and non-contiguous operands, and linear with and without bias, against the float64
// reference.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "runtime/cpu/float_gemm.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using testing::checkAgainstReference;
using testing::randomTensor;

// The next seed of a test's sequence. (The two operands of one call draw theirs in an unspecified
// order; each check compares with a reference of the same tensors, so the order does not matter.)
uint64_t nextSeed(uint64_t& seed) { return seed++; }
using Kind = Segment::Kind;

// Accumulating K products in float32 loses about sqrt(K) ulps; allow some headroom.
constexpr double kGemmScale = 20.0;

void checkMatmul(DataType dt, const Tensor& a, const Tensor& b, const std::string& what) {
  Fusion f;
  TensorView* ta = f.newTensor(dt, a.shape());
  TensorView* tb = f.newTensor(dt, b.shape());
  f.addInput(ta);
  f.addInput(tb);
  f.addOutput(ops::matmul(ta, tb));
  ValueMap v;
  v.tensors[ta] = a;
  v.tensors[tb] = b;
  checkAgainstReference(f, Kind::Matmul, v, what + " " + toString(dt), kGemmScale);
}

void checkLinear(DataType dt, const Tensor& x, const Tensor& w, const Tensor* bias, const std::string& what) {
  Fusion f;
  TensorView* tx = f.newTensor(dt, x.shape());
  TensorView* tw = f.newTensor(dt, w.shape());
  f.addInput(tx);
  f.addInput(tw);
  TensorView* tb = nullptr;
  if (bias) {
    tb = f.newTensor(dt, bias->shape());
    f.addInput(tb);
  }
  f.addOutput(ops::linear(tx, tw, tb));
  ValueMap v;
  v.tensors[tx] = x;
  v.tensors[tw] = w;
  if (bias) v.tensors[tb] = *bias;
  checkAgainstReference(f, Kind::Matmul, v, what + " " + toString(dt), kGemmScale);
}

const DataType kDtypes[] = {DataType::Float,    DataType::Double, DataType::Half,
                            DataType::BFloat16, DataType::Int,    DataType::Int32};

TEST(CpuMatmul, TwoDimensionalEveryDtype) {
  uint64_t seed = 1;
  for (DataType dt : kDtypes) {
    checkMatmul(dt, randomTensor({37, 29}, dt, nextSeed(seed)), randomTensor({29, 41}, dt, nextSeed(seed)), "2d");
    checkMatmul(dt, randomTensor({1, 8}, dt, nextSeed(seed)), randomTensor({8, 1}, dt, nextSeed(seed)), "1x1");
  }
}

TEST(CpuMatmul, VectorOperands) {
  uint64_t seed = 10;
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Int}) {
    checkMatmul(dt, randomTensor({29}, dt, nextSeed(seed)), randomTensor({29, 13}, dt, nextSeed(seed)), "vec@mat");
    checkMatmul(dt, randomTensor({13, 29}, dt, nextSeed(seed)), randomTensor({29}, dt, nextSeed(seed)), "mat@vec");
    checkMatmul(dt, randomTensor({29}, dt, nextSeed(seed)), randomTensor({29}, dt, nextSeed(seed)), "vec@vec");
    checkMatmul(dt, randomTensor({29}, dt, nextSeed(seed)), randomTensor({3, 29, 5}, dt, nextSeed(seed)), "vec@batch");
    checkMatmul(dt, randomTensor({2, 4, 29}, dt, nextSeed(seed)), randomTensor({29}, dt, nextSeed(seed)), "batch@vec");
  }
}

TEST(CpuMatmul, BatchedWithBroadcasting) {
  uint64_t seed = 20;
  for (DataType dt : {DataType::Float, DataType::Half, DataType::Int32}) {
    checkMatmul(dt, randomTensor({4, 9, 11}, dt, nextSeed(seed)), randomTensor({4, 11, 6}, dt, nextSeed(seed)),
                "batched");
    checkMatmul(dt, randomTensor({2, 1, 9, 11}, dt, nextSeed(seed)), randomTensor({3, 11, 6}, dt, nextSeed(seed)),
                "broadcast batch");
    checkMatmul(dt, randomTensor({5, 9, 11}, dt, nextSeed(seed)), randomTensor({11, 6}, dt, nextSeed(seed)),
                "batch folded into rows");
    checkMatmul(dt, randomTensor({9, 11}, dt, nextSeed(seed)), randomTensor({5, 11, 6}, dt, nextSeed(seed)),
                "shared A");
  }
}

TEST(CpuMatmul, TransposedAndNonContiguousOperands) {
  uint64_t seed = 30;
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Int}) {
    Tensor at = randomTensor({31, 17}, dt, nextSeed(seed)).permute({1, 0});       // [17, 31], transposed
    Tensor bt = randomTensor({23, 31}, dt, nextSeed(seed)).permute({1, 0});       // [31, 23], transposed
    Tensor a_slice = randomTensor({17, 40}, dt, nextSeed(seed)).slice(1, 5, 31);  // lda 40
    Tensor b_strided = randomTensor({31, 46}, dt, nextSeed(seed)).permute({1, 0}).slice(0, 0, 23).permute({1, 0});
    Tensor b_every_other = randomTensor({31, 46}, dt, nextSeed(seed));
    b_every_other = Tensor(b_every_other.storage(), 0, dt, {31, 23}, {46, 2});  // column stride 2: a copy
    checkMatmul(dt, at, randomTensor({31, 23}, dt, nextSeed(seed)), "A^T");
    checkMatmul(dt, randomTensor({17, 31}, dt, nextSeed(seed)), bt, "B^T");
    checkMatmul(dt, at, bt, "A^T B^T");
    checkMatmul(dt, a_slice, b_strided, "sliced");
    checkMatmul(dt, a_slice, b_every_other, "column stride 2");
    Tensor batched_t = randomTensor({3, 31, 17}, dt, nextSeed(seed)).permute({0, 2, 1});  // [3, 17, 31]
    checkMatmul(dt, batched_t, randomTensor({3, 31, 23}, dt, nextSeed(seed)), "batched A^T");
  }
}

TEST(CpuLinear, WithAndWithoutBias) {
  uint64_t seed = 40;
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16, DataType::Int}) {
    Tensor x = randomTensor({2, 7, 33}, dt, nextSeed(seed));
    Tensor w = randomTensor({19, 33}, dt, nextSeed(seed));
    Tensor bias = randomTensor({19}, dt, nextSeed(seed));
    checkLinear(dt, x, w, nullptr, "linear");
    checkLinear(dt, x, w, &bias, "linear+bias");
    checkLinear(dt, randomTensor({33}, dt, nextSeed(seed)), w, &bias, "1-D x");
    Tensor w1 = randomTensor({33}, dt, nextSeed(seed));
    Tensor b0 = randomTensor({}, dt, nextSeed(seed));
    checkLinear(dt, x, w1, nullptr, "1-D w");
    checkLinear(dt, x, w1, &b0, "1-D w + scalar bias");
  }
}

TEST(CpuLinear, StridedInputs) {
  uint64_t seed = 50;
  Tensor x_perm =
      randomTensor({7, 2, 33}, DataType::Float, nextSeed(seed)).permute({1, 0, 2});         // leading axes don't fold
  Tensor w_t = randomTensor({33, 19}, DataType::Float, nextSeed(seed)).permute({1, 0});     // w stored transposed
  Tensor x_rows = randomTensor({14, 40}, DataType::Float, nextSeed(seed)).slice(1, 0, 33);  // row stride 40
  Tensor bias = randomTensor({19}, DataType::Float, nextSeed(seed));
  checkLinear(DataType::Float, x_perm, randomTensor({19, 33}, DataType::Float, nextSeed(seed)), &bias, "permuted x");
  checkLinear(DataType::Float, x_rows, w_t, &bias, "sliced x, transposed w");
}

// float32 GEMMs through each library this build has (OpenBLAS; oneDNN's sgemm with MESHFUSE_DNNL):
// every operand layout the scheduler passes in place, batches, and linear's bias accumulation, on
// shapes past the libraries' register and cache blocks.
TEST(CpuMatmul, EveryFloatGemmLibrary) {
  const cpu::FloatGemm chosen = cpu::floatGemm();
  std::vector<cpu::FloatGemm> libraries{cpu::FloatGemm::OpenBlas};
  if (cpu::haveOneDnnGemm()) libraries.push_back(cpu::FloatGemm::OneDnn);
  const DataType dt = DataType::Float;
  for (cpu::FloatGemm library : libraries) {
    cpu::setFloatGemm(library);
    const std::string name = library == cpu::FloatGemm::OneDnn ? "oneDNN " : "OpenBLAS ";
    uint64_t seed = 60;
    Tensor at = randomTensor({290, 97}, dt, nextSeed(seed)).permute({1, 0});   // [97, 290], transposed
    Tensor bt = randomTensor({133, 290}, dt, nextSeed(seed)).permute({1, 0});  // [290, 133], transposed
    checkMatmul(dt, randomTensor({97, 290}, dt, nextSeed(seed)), randomTensor({290, 133}, dt, nextSeed(seed)),
                name + "A B");
    checkMatmul(dt, at, randomTensor({290, 133}, dt, nextSeed(seed)), name + "A^T B");
    checkMatmul(dt, randomTensor({97, 290}, dt, nextSeed(seed)), bt, name + "A B^T");
    checkMatmul(dt, at, bt, name + "A^T B^T");
    checkMatmul(dt, randomTensor({97, 300}, dt, nextSeed(seed)).slice(1, 3, 290),
                randomTensor({290, 133}, dt, nextSeed(seed)), name + "lda 300");
    checkMatmul(dt, randomTensor({3, 41, 57}, dt, nextSeed(seed)).permute({0, 2, 1}),
                randomTensor({3, 41, 29}, dt, nextSeed(seed)), name + "batched A^T");
    checkMatmul(dt, randomTensor({4, 37, 64}, dt, nextSeed(seed)), randomTensor({64, 70}, dt, nextSeed(seed)),
                name + "batch in rows");
    checkMatmul(dt, randomTensor({1, 8}, dt, nextSeed(seed)), randomTensor({8, 1}, dt, nextSeed(seed)), name + "1x1");
    Tensor bias = randomTensor({136}, dt, nextSeed(seed));
    checkLinear(dt, randomTensor({2, 48, 200}, dt, nextSeed(seed)), randomTensor({136, 200}, dt, nextSeed(seed)), &bias,
                name + "linear+bias");
    checkLinear(dt, randomTensor({2, 48, 200}, dt, nextSeed(seed)), randomTensor({136, 200}, dt, nextSeed(seed)),
                nullptr, name + "linear");
  }
  cpu::setFloatGemm(chosen);
  if (!cpu::haveOneDnnGemm()) EXPECT_THROW(cpu::setFloatGemm(cpu::FloatGemm::OneDnn), std::invalid_argument);
}

}  // namespace
}  // namespace meshfuse
