// A Segment is a group of exprs that one segment executor runs as a unit: a fused pointwise chain,
// a reduction, a matmul/linear, or a view (permute, broadcast_in_dim, reshape). Executors read the
// segment's inputs from a ValueMap and write its outputs into it, at the local shapes of ShapeMap.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "runtime/tensor.h"

namespace meshfuse {

// This rank's block of a sharded tensor: its global shape and where the local block starts.
struct GlobalBlock {
  std::vector<int64_t> global_shape, offsets;
};

struct Segment {
  // Normalization: reductions over the same axes with the pointwise ops that feed them and those
  // that broadcast their results back (LayerNorm, softmax and their backward), run as one kernel.
  // Attention: one sdpfa_fwd or sdpfa_bwd expr (flash-style CPU kernel, cuDNN on CUDA).
  enum class Kind : uint8_t { Pointwise, Reduction, Normalization, Matmul, View, Attention };
  Kind kind = Kind::Pointwise;
  std::vector<const Expr*> exprs;    // in topological order
  std::vector<Val*> inputs;          // tensors and scalars produced outside the segment
  std::vector<TensorView*> outputs;  // values used outside the segment (or fusion outputs)
  // Random ops whose output is sharded: the block of the global tensor this rank generates.
  std::unordered_map<const Val*, GlobalBlock> global_blocks;
  std::string toString() const;
};
std::string toString(Segment::Kind kind);

struct ValueMap {
  std::unordered_map<const Val*, Tensor> tensors;
  std::unordered_map<const Val*, double> scalars;
  const Tensor& tensor(const Val* v) const;
  double scalar(const Val* v) const;  // constants come from the Scalar itself
};

// Every TensorView's shape on this rank (local shard extents), bound at execution.
using ShapeMap = std::unordered_map<const Val*, std::vector<int64_t>>;

class SegmentExecutor {
 public:
  virtual ~SegmentExecutor() = default;
  // Computes every output of `seg` (allocating it on the executor's device) from its inputs.
  virtual void run(const Segment& seg, ValueMap& values, const ShapeMap& shapes) = 0;
  virtual Device device() const = 0;
  // Waits until the work run() queued has finished (a traced execution times segments with it:
  // CUDA launches return before their kernels end). CPU segments finish inside run().
  virtual void synchronize() {}
};

// Loops (fused, OpenMP over tiles) and OpenBLAS; 16-bit floats are computed in float32.
std::unique_ptr<SegmentExecutor> makeCpuExecutor();
// NVRTC-fused pointwise kernels, reductions and cuBLASLt; nullptr in a build without CUDA.
std::unique_ptr<SegmentExecutor> makeCudaExecutor(int device_index) __attribute__((weak));

}  // namespace meshfuse
