// The two stream-parallel fusions of the overlap tests (CPU and CUDA), sharded over the world:
// sequence-parallel x [rows, k] allgathered into a column-parallel linear whose rows are split
// into s stream chunks, and a row-parallel linear whose partial sums are reduce-scattered onto
// row shards, the local rows split into s stream chunks.
#pragma once
#include <memory>

#include "ir/ir.h"
#include "mp_test_utils.h"
#include "ops/ops.h"

namespace meshfuse::testing {

// Shards logical `axis` (a whole loop axis at loop position `loop_axis`) over the world.
inline void shardOverWorld(TensorView* tv, int64_t loop_axis) {
  tv->setDeviceMesh(worldMesh());
  tv->outerSplit(loop_axis, worldMesh().size());
  tv->parallelize(loop_axis, ParallelType::MeshX);
}

// y = linear(x, w [, b]): x [rows, k] and w [cols, k] (and b [cols]) sharded on axis 0, y on its
// columns; loop [stream:i0o{s}, i0i, mesh_x:i1o, i1i].
inline std::shared_ptr<Fusion> allgatherLinearFusion(int64_t rows, int64_t k, int64_t cols, int64_t s, bool bias) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {rows, k});
  TensorView* w = f->newTensor(DataType::Float, {cols, k});
  TensorView* b = bias ? f->newTensor(DataType::Float, {cols}) : nullptr;
  f->addInput(x);
  f->addInput(w);
  if (b) f->addInput(b);
  TensorView* y = b ? ops::linear(x, w, b) : ops::linear(x, w);
  f->addOutput(y);
  for (TensorView* tv : {x, w, b})
    if (tv) shardOverWorld(tv, 0);
  shardOverWorld(y, 1);
  y->outerSplit(0, s);
  y->parallelize(0, ParallelType::Stream);
  return f;
}

// y = linear(h, w): h [rows, k] and w [cols, k] sharded on k, y on its rows; loop
// [mesh_x:i0o, stream:i0io{s}, i0ii, i1].
inline std::shared_ptr<Fusion> linearReduceScatterFusion(int64_t rows, int64_t k, int64_t cols, int64_t s) {
  auto f = std::make_shared<Fusion>();
  TensorView* h = f->newTensor(DataType::Float, {rows, k});
  TensorView* w = f->newTensor(DataType::Float, {cols, k});
  f->addInput(h);
  f->addInput(w);
  TensorView* y = ops::linear(h, w);
  f->addOutput(y);
  shardOverWorld(h, 1);
  shardOverWorld(w, 1);
  shardOverWorld(y, 0);
  y->outerSplit(1, s);
  y->parallelize(1, ParallelType::Stream);
  return f;
}

}  // namespace meshfuse::testing
