// CPU executor, view segments: permute and broadcast_in_dim alias their input (no copy); reshape
// aliases a contiguous input and copies a strided one. Values are checked against the reference,
// and a view's result feeds a pointwise segment.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using testing::checkAgainstReference;
using testing::randomTensor;
using testing::runOnCpu;
using Kind = Segment::Kind;

TEST(CpuView, PermuteIsAView) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {3, 4, 5});
  f.addInput(x);
  TensorView* y = ops::permute(x, {2, 0, 1});
  f.addOutput(y);
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Float, 1);
  checkAgainstReference(f, Kind::View, v, "permute");
  EXPECT_EQ(v.tensor(y).storage(), v.tensor(x).storage());
  EXPECT_EQ(v.tensor(y).strides(), (std::vector<int64_t>{1, 20, 5}));
}

TEST(CpuView, BroadcastInDimUsesStrideZero) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Half, {4, 1});
  f.addInput(x);
  TensorView* y = ops::broadcastInDim(x, {2, 4, 6}, {1, 2});
  f.addOutput(y);
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Half, 2);
  checkAgainstReference(f, Kind::View, v, "broadcast_in_dim");
  const Tensor& out = v.tensor(y);
  EXPECT_EQ(out.storage(), v.tensor(x).storage());
  EXPECT_EQ(out.strides()[0], 0);
  EXPECT_EQ(out.strides()[2], 0);
}

TEST(CpuView, ReshapeViewsContiguousAndCopiesStrided) {
  for (bool strided : {false, true}) {
    Fusion f;
    TensorView* x = f.newTensor(DataType::Int32, {6, 4});
    f.addInput(x);
    TensorView* y = ops::reshape(x, {2, -1, 3});
    f.addOutput(y);
    ValueMap v;
    v.tensors[x] = strided ? randomTensor({4, 6}, DataType::Int32, 3, -50, 50).permute({1, 0})
                           : randomTensor({6, 4}, DataType::Int32, 3, -50, 50);
    checkAgainstReference(f, Kind::View, v, strided ? "reshape strided" : "reshape");
    EXPECT_EQ(v.tensor(y).shape(), (std::vector<int64_t>{2, 4, 3}));
    EXPECT_EQ(v.tensor(y).storage() == v.tensor(x).storage(), !strided);
  }
}

TEST(CpuView, ViewsFeedAPointwiseSegment) {
  // bias [8] broadcast to [5, 8] by a view segment, then added to a transposed x by a pointwise one.
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {8, 5});
  TensorView* bias = f.newTensor(DataType::Float, {8});
  f.addInput(x);
  f.addInput(bias);
  TensorView* xt = ops::permute(x, {1, 0});
  TensorView* b2 = ops::broadcastInDim(bias, {5, 8}, {1});
  TensorView* y = ops::binary(OpType::Add, xt, b2);
  f.addOutput(y);
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Float, 4);
  v.tensors[bias] = randomTensor(bias->shape(), DataType::Float, 5);
  auto ref = testing::referenceEvaluate(f, v);
  ShapeMap shapes = testing::definedShapes(f);
  auto exec = makeCpuExecutor();
  const auto exprs = f.liveExprs();
  for (const Expr* e : exprs) {
    Segment seg;
    seg.kind = isPointwise(e->op()) ? Kind::Pointwise : Kind::View;
    seg.exprs = {e};
    for (Val* in : e->inputs()) seg.inputs.push_back(in);
    seg.outputs = {e->out()};
    exec->run(seg, v, shapes);
  }
  testing::expectMatches(v.tensor(y), ref.at(y), "views then add");
}

TEST(CpuExecutor, ReportsCpuDevice) { EXPECT_EQ(makeCpuExecutor()->device(), Device::cpu()); }

}  // namespace
}  // namespace meshfuse
