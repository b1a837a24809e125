// CPU executor, view segments: permute and broadcast_in_dim alias their input (no copy); reshape
// aliases a contiguous input and copies a strided one. Values are checked against the reference,
// and a view's result feeds a pointwise segment.
#include <gtest/gtest.h>

#include "ops/ops.h"
#include "runtime/view_ops.h"
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

// cat of parts that already lie end to end in one storage (the heads-interleaved q, k, v gradients
// CUDA attention writes into one buffer) is a view of it; parts out of order, with a gap, or from two
// storages are copied. Either way the values are the parts'.
TEST(CpuView, CatOfPartsLyingEndToEndIsAView) {
  const Tensor whole = randomTensor({2, 3, 4, 12}, DataType::Float, 6);  // [b, s, h, 3 dh]
  const auto part = [&](const Tensor& from, int64_t i) { return from.slice(3, 4 * i, 4); };
  const auto expectParts = [](const Tensor& cat, const std::vector<Tensor>& parts, const std::string& what) {
    int64_t at = 0;
    for (const Tensor& p : parts) {
      const Tensor got = cat.slice(3, at, p.size(3)).contiguous(), want = p.contiguous();
      EXPECT_EQ(std::vector<float>(got.dataAs<float>(), got.dataAs<float>() + got.numel()),
                std::vector<float>(want.dataAs<float>(), want.dataAs<float>() + want.numel()))
          << what;
      at += p.size(3);
    }
  };
  const std::vector<int64_t> shape{2, 3, 4, 12};
  const std::vector<Tensor> in_order{part(whole, 0), part(whole, 1), part(whole, 2)};
  const Tensor view = concatenate(in_order, 3, shape);
  EXPECT_EQ(view.storage(), whole.storage());
  EXPECT_EQ(view.data(), whole.data());
  expectParts(view, in_order, "cat in order");
  const std::vector<int64_t> two_shape{2, 3, 4, 8};
  const Tensor tail_view = concatenate({part(whole, 1), part(whole, 2)}, 3, two_shape);  // from mid-row
  EXPECT_EQ(tail_view.storage(), whole.storage());
  expectParts(tail_view, {part(whole, 1), part(whole, 2)}, "cat of the last two");
  const Tensor other = randomTensor({2, 3, 4, 12}, DataType::Float, 7);
  const std::vector<std::pair<std::string, std::vector<Tensor> > > copied = {
      {"out of order", {part(whole, 1), part(whole, 0), part(whole, 2)}},
      {"with a gap", {part(whole, 0), part(whole, 2), part(whole, 2)}},
      {"two storages", {part(whole, 0), part(other, 1), part(whole, 2)}}};
  for (const auto& [what, parts] : copied) {
    const Tensor cat = concatenate(parts, 3, shape);
    EXPECT_NE(cat.storage(), whole.storage()) << what;
    EXPECT_TRUE(cat.isContiguous()) << what;
    expectParts(cat, parts, what);
  }
}

TEST(CpuExecutor, ReportsCpuDevice) { EXPECT_EQ(makeCpuExecutor()->device(), Device::cpu()); }

}  // namespace
}  // namespace meshfuse
