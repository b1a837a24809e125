// Test support for the CPU executor suites: a float64 reference evaluator of a Fusion written
// with plain index loops (independent of the executor's tiling, strides and BLAS), random
// tensors, a whole-fusion "segmenter" and a tolerance-by-dtype comparison.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "runtime/segment.h"
#include "runtime/tensor.h"

namespace meshfuse::testing {

// A dense row-major float64 array.
struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> data;
};

RefTensor toRef(const Tensor& t);

// Every TensorView's value, computed in float64 from the bound inputs. Intermediates are not
// rounded to their dtype (as the fused executor does), except by casts; integral pow truncates.
std::unordered_map<const Val*, RefTensor> referenceEvaluate(const Fusion& fusion, const ValueMap& inputs);

// Uniform in [lo, hi) (integers: rounded; Bool: a fair coin), rounded to dtype, contiguous.
Tensor randomTensor(const std::vector<int64_t>& shape, DataType dtype, uint64_t seed, double lo = -2.0,
                    double hi = 2.0);

// One segment of the given kind holding every live expr of the fusion, its inputs and outputs.
Segment wholeFusionSegment(const Fusion& fusion, Segment::Kind kind);
// Every TensorView at its (concrete) defined shape.
ShapeMap definedShapes(const Fusion& fusion);
// Runs the whole fusion as one segment on the CPU executor; outputs land in `values`.
void runOnCpu(const Fusion& fusion, Segment::Kind kind, ValueMap& values);

// Relative and absolute tolerance for results of `dtype` (0 for integers and bools).
double toleranceFor(DataType dtype);
// Adds a GoogleTest failure (with the first mismatches) unless every element of `actual` is within
// tolerance(dtype) * scale of `expected`: |a - e| <= tol * (1 + |e|). NaN matches NaN.
void expectMatches(const Tensor& actual, const RefTensor& expected, const std::string& what, double scale = 1.0);

// Runs the fusion on the CPU executor and checks every output against the reference.
void checkAgainstReference(const Fusion& fusion, Segment::Kind kind, ValueMap& values, const std::string& what,
                           double scale = 1.0);

}  // namespace meshfuse::testing
