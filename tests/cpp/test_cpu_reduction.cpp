// CPU executor, reduction segments: sum / max / mean over inner, outer, middle and all axes, with
// and without keepdim, every dtype, strided inputs, and reductions large enough to be split
// across threads, against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/ops.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using testing::checkAgainstReference;
using testing::randomTensor;
using testing::runOnCpu;
using Kind = Segment::Kind;

void checkReduction(OpType op, DataType dt, const std::vector<int64_t>& shape, const std::vector<int64_t>& axes,
                    bool keepdim, const Tensor& data, double scale = 1.0) {
  Fusion f;
  TensorView* x = f.newTensor(dt, shape);
  f.addInput(x);
  f.addOutput(ops::reduction(op, x, axes, keepdim));
  ValueMap v;
  v.tensors[x] = data;
  std::string what = toString(op) + " " + toString(dt) + " " + shapeToString(shape) + " axes " + shapeToString(axes) +
                     (keepdim ? " keepdim" : "");
  checkAgainstReference(f, Kind::Reduction, v, what, scale);
}

TEST(CpuReduction, EveryOpDtypeAndAxisSet) {
  const std::vector<std::vector<int64_t>> axis_sets = {{2}, {0}, {1}, {0, 2}, {1, 2}, {0, 1, 2}, {-1}};
  const DataType dtypes[] = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16,
                             DataType::Int,   DataType::Int32,  DataType::Bool};
  const std::vector<int64_t> shape = {6, 35, 19};
  uint64_t seed = 1;
  for (OpType op : {OpType::Sum, OpType::ReduceMax, OpType::Mean})
    for (DataType dt : dtypes)
      for (const auto& axes : axis_sets)
        for (bool keepdim : {false, true}) {
          Tensor data = randomTensor(shape, dt, seed++, -10, 10);
          // A sum of 16-bit floats is rounded once at the end, but its magnitude grows with the count.
          checkReduction(op, dt, shape, axes, keepdim, data, dt == DataType::BFloat16 ? 2.0 : 1.0);
        }
}

TEST(CpuReduction, AxesOfExtentOneAreAConvertingCopy) {
  // Every reduced axis has extent 1 (the runtime's copy path), strided input included.
  const DataType dtypes[] = {DataType::Float, DataType::Half, DataType::Int32, DataType::Bool};
  uint64_t seed = 500;
  for (OpType op : {OpType::Sum, OpType::ReduceMax, OpType::Mean})
    for (DataType dt : dtypes)
      for (bool keepdim : {false, true}) {
        checkReduction(op, dt, {1, 33, 7}, {0}, keepdim, randomTensor({1, 33, 7}, dt, seed++, -10, 10));
        checkReduction(op, dt, {5, 1, 3, 1}, {1, 3}, keepdim, randomTensor({5, 1, 3, 1}, dt, seed++, -10, 10));
        Tensor wide = randomTensor({9, 1, 8}, dt, seed++, -10, 10);
        checkReduction(op, dt, {8, 1, 9}, {1}, keepdim, wide.permute({2, 1, 0}));  // strided
      }
}

TEST(CpuReduction, IntegerResultTypes) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Int32, {10, 4});
  f.addInput(x);
  TensorView* s = ops::reduction(OpType::Sum, x, {0}, false);
  TensorView* m = ops::reduction(OpType::Mean, x, {0}, false);
  f.addOutput(s);
  f.addOutput(m);
  EXPECT_EQ(s->dtype(), DataType::Int);
  EXPECT_EQ(m->dtype(), DataType::Float);
  for (const TensorView* out : {s, m}) {
    Fusion g;
    TensorView* y = g.newTensor(DataType::Int32, {10, 4});
    g.addInput(y);
    g.addOutput(ops::reduction(out == s ? OpType::Sum : OpType::Mean, y, {0}, false));
    ValueMap v;
    v.tensors[y] = randomTensor({10, 4}, DataType::Int32, 77, -100, 100);
    checkAgainstReference(g, Kind::Reduction, v, "int32 " + toString(out == s ? OpType::Sum : OpType::Mean));
  }
}

TEST(CpuReduction, StridedAndBroadcastInputs) {
  uint64_t seed = 500;
  for (OpType op : {OpType::Sum, OpType::ReduceMax})
    for (const auto& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}}) {
      // A permuted input: the logically inner axis is the one with the largest stride.
      checkReduction(op, DataType::Float, {19, 35, 6}, axes, false,
                     randomTensor({6, 35, 19}, DataType::Float, seed++).permute({2, 1, 0}));
      // A slice: rows of stride 40 with 35 of them used.
      checkReduction(op, DataType::Double, {6, 19, 35}, axes, true,
                     randomTensor({6, 19, 40}, DataType::Double, seed++).slice(2, 3, 35));
      // Broadcast (stride 0) along axis 1.
      checkReduction(op, DataType::Float, {6, 35, 19}, axes, false,
                     randomTensor({6, 1, 19}, DataType::Float, seed++).expand({6, 35, 19}));
    }
}

TEST(CpuReduction, LargeReductionsSplitAcrossThreads) {
  // One output over 2^20 elements (chunked partial sums), column sums of a tall matrix (the
  // column kernel with a chunked reduced range), row sums, and a tall-and-skinny column sum.
  checkReduction(OpType::Sum, DataType::Float, {1 << 20}, {0}, false, randomTensor({1 << 20}, DataType::Float, 1));
  checkReduction(OpType::Mean, DataType::Float, {4096, 300}, {0}, false, randomTensor({4096, 300}, DataType::Float, 2));
  checkReduction(OpType::ReduceMax, DataType::Float, {4096, 300}, {0}, true,
                 randomTensor({4096, 300}, DataType::Float, 3));
  checkReduction(OpType::Sum, DataType::Half, {300, 4096}, {1}, false, randomTensor({300, 4096}, DataType::Half, 4));
  checkReduction(OpType::Sum, DataType::Float, {200000, 3}, {0}, false, randomTensor({200000, 3}, DataType::Float, 5));
  checkReduction(OpType::Sum, DataType::Int, {64, 5000, 3}, {0, 1}, false,
                 randomTensor({64, 5000, 3}, DataType::Int, 6, -1000, 1000));
}

TEST(CpuReduction, AccumulatesInDouble) {
  // 2^24 + many ones: a float accumulator would stop growing at 2^24.
  const int64_t n = 1 << 21;
  Tensor x = Tensor::empty({n}, DataType::Float);
  float* p = x.dataAs<float>();
  p[0] = 16777216.0f;
  for (int64_t i = 1; i < n; ++i) p[i] = 1.0f;
  Fusion f;
  TensorView* tv = f.newTensor(DataType::Float, {n});
  f.addInput(tv);
  f.addOutput(ops::reduction(OpType::Sum, tv, {0}, false));
  ValueMap v;
  v.tensors[tv] = x;
  runOnCpu(f, Kind::Reduction, v);
  EXPECT_EQ(v.tensor(f.outputs()[0]).dataAs<float>()[0], 16777216.0f + static_cast<float>(n - 1));
}

TEST(CpuReduction, NanPropagatesThroughMax) {
  Tensor x = randomTensor({8, 100}, DataType::Float, 9);
  x.dataAs<float>()[3 * 100 + 57] = NAN;
  checkReduction(OpType::ReduceMax, DataType::Float, {8, 100}, {1}, false, x);
  checkReduction(OpType::ReduceMax, DataType::Float, {8, 100}, {0}, false, x);
}

TEST(CpuReduction, EmptyReducedAxis) {
  Tensor x = Tensor::empty({4, 0}, DataType::Float);
  checkReduction(OpType::Sum, DataType::Float, {4, 0}, {1}, false, x);   // zeros
  checkReduction(OpType::Mean, DataType::Float, {4, 0}, {1}, false, x);  // NaN
  Fusion f;
  TensorView* tv = f.newTensor(DataType::Float, {4, 0});
  f.addInput(tv);
  f.addOutput(ops::reduction(OpType::ReduceMax, tv, {1}, false));
  ValueMap v;
  v.tensors[tv] = x;
  EXPECT_THROW(runOnCpu(f, Kind::Reduction, v), std::invalid_argument);
}

}  // namespace
}  // namespace meshfuse
