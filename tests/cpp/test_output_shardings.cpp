// FusionExecutorCache::lastOutputShardings: after an execution, a Fusion of definition-less copies of
// the outputs, each with the mesh and loop domain sharding propagation gave it and the extents the
// inputs bound (one process, a mesh of one device; tests/python/mp/test_output_shardings.py runs the
// sharded cases across ranks).
#include <gtest/gtest.h>

#include "host_ir/fusion_executor.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

TEST(OutputShardings, CopyPropagatedMeshLoopAndBoundExtents) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {-1, 6});  // symbolic rows
  f->addInput(x);
  x->setDeviceMesh(DeviceMesh(std::vector<int64_t>{0}));
  x->outerSplit(1, 1);
  x->parallelize(1, ParallelType::MeshX);
  TensorView* y = ops::unary(OpType::Relu, x);
  TensorView* s = ops::reduction(OpType::Sum, y, {0}, false);
  f->addOutput(y);
  f->addOutput(s);
  FusionExecutorCache fec(f);
  EXPECT_EQ(fec.lastOutputShardings(), nullptr) << "nothing lowered yet";

  Tensor xt = Tensor::empty({5, 6}, DataType::Float);
  for (int64_t i = 0; i < xt.numel(); ++i) xt.dataAs<float>()[i] = static_cast<float>(i % 7) - 3.0f;
  auto outs = fec.execute({xt});
  ASSERT_EQ(outs.size(), 2u);
  std::shared_ptr<Fusion> placed = fec.lastOutputShardings();
  ASSERT_NE(placed, nullptr);
  ASSERT_EQ(placed->outputs().size(), 2u);
  const auto* ys = static_cast<const TensorView*>(placed->outputs()[0]);
  const auto* ss = static_cast<const TensorView*>(placed->outputs()[1]);
  EXPECT_EQ(ys->shape(), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(ss->shape(), (std::vector<int64_t>{6}));
  ASSERT_TRUE(ys->hasDeviceMesh());
  EXPECT_EQ(*ys->deviceMesh(), DeviceMesh(std::vector<int64_t>{0}));
  EXPECT_EQ(ys->shardedAxis(ParallelType::MeshX), 1) << ys->loopToString();
  EXPECT_EQ(ss->shardedAxis(ParallelType::MeshX), 0) << "the column sums keep the column sharding";
  EXPECT_EQ(ys->definition(), nullptr);
  EXPECT_TRUE(placed->inputs().empty());

  // The next execution's extents replace the last one's.
  Tensor two = Tensor::empty({2, 6}, DataType::Float);
  for (int64_t i = 0; i < two.numel(); ++i) two.dataAs<float>()[i] = 1.0f;
  fec.execute({two});
  EXPECT_EQ(static_cast<const TensorView*>(fec.lastOutputShardings()->outputs()[0])->shape(),
            (std::vector<int64_t>{2, 6}));
}

}  // namespace
}  // namespace meshfuse
