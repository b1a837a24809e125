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

// What a Matmul segment's GEMM applies to its product as it stores it, in place of the pointwise
// exprs that follow the matmul expr in the segment (host_ir/matmul_epilogue.h finds them; an
// executor without the epilogue runs those exprs instead, with the same result up to rounding).
struct MatmulEpilogue {
  enum class Kind : uint8_t {
    None,
    GeluTanh,      // result = gelu_tanh(product [+ bias]); the product is stored too where it is read
    GeluTanhGrad,  // result = product * gelu_tanh'(aux): the backward of a GELU whose input was aux
  };
  Kind kind = Kind::None;
  const TensorView* result = nullptr;  // the last pointwise value the epilogue stands for
  const TensorView* aux = nullptr;     // GeluTanhGrad: the GELU's input (a segment input)
  // GeluTanhGrad, optionally: the sum of the result over every axis but the last (a linear's bias
  // gradient), in the result's dtype.
  const TensorView* bias_grad = nullptr;
};
std::string toString(MatmulEpilogue::Kind kind);

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
  // Matmul segments only: exprs[0] is the matmul/linear, the rest its epilogue's pointwise exprs
  // (and a reshape of the product between them).
  MatmulEpilogue epilogue;
  std::string toString() const;
};
std::string toString(Segment::Kind kind);
// The kind of segment an expr forms on its own.
Segment::Kind segmentKindOf(OpType op);

// What `exprs` read that they do not compute (tensors and scalars), each once, in first-read order:
// a segment's inputs.
std::vector<Val*> inputsOf(const std::vector<const Expr*>& exprs);

// `seg` as the segments its exprs would form without fusion: each maximal run of pointwise exprs
// one Pointwise segment, every other expr a segment of its own kind; inputs and outputs set (an
// output is a value read by a later part or an output of `seg`). Executors run a Matmul segment
// with an epilogue they cannot apply this way.
std::vector<Segment> splitIntoParts(const Segment& seg);

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
