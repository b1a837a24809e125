// The CPU segment executor's kernels, one per Segment::Kind (each in its own file), and the
// argument checks they share. Internal to runtime/cpu/.
#pragma once
#include "runtime/segment.h"

namespace meshfuse::cpu {

void runPointwise(const Segment& seg, ValueMap& values, const ShapeMap& shapes);
void runReduction(const Segment& seg, ValueMap& values, const ShapeMap& shapes);
void runNormalization(const Segment& seg, ValueMap& values, const ShapeMap& shapes);
// How many stages of a normalization's elementwise steps (one per inner reduction, and the last)
// have been compiled into one loop each, and how many were left interpreted although
// MESHFUSE_CPU_CODEGEN asked for a compile (an op without generated form, a failed compile), since
// the process started: the tests' evidence of which path ran.
struct NormalizationCodegenCounts {
  int64_t compiled = 0, interpreted = 0;
};
NormalizationCodegenCounts normalizationCodegenCounts();
void runMatmul(const Segment& seg, ValueMap& values, const ShapeMap& shapes);
void runView(const Segment& seg, ValueMap& values, const ShapeMap& shapes);
// Drops the values `seg`'s exprs computed that are not its outputs (passed between its parts only).
void dropInternalValues(const Segment& seg, ValueMap& values);
void runAttention(const Segment& seg, ValueMap& values, const ShapeMap& shapes);

// The bound tensor of `v`, checked to be on the CPU and (when ShapeMap knows `v`) of its shape.
const Tensor& inputTensor(const ValueMap& values, const ShapeMap& shapes, const Val* v);
// The shape ShapeMap gives `tv` (std::logic_error naming it when missing).
const std::vector<int64_t>& shapeOf(const ShapeMap& shapes, const TensorView* tv);
// A fresh contiguous CPU tensor for `tv` at its ShapeMap shape, stored into `values`.
Tensor& allocateOutput(ValueMap& values, const ShapeMap& shapes, const TensorView* tv);
// The single expr of a one-expr segment (reduction, matmul, view), checked.
const Expr& soleExpr(const Segment& seg);

}  // namespace meshfuse::cpu
