// Max and min as numpy's maximum / torch's max have them: NaN wins from either side, and for integers
// (x != x is false) a plain max / min. One definition for the CPU kernels (pointwise maximum/minimum,
// the max reduction) and the CPU backends' cross-rank reductions (MPI's user ops, Gloo's combines),
// whose comparisons had kept or dropped a NaN by the rank that held it. Written as one select of a
// bitwise or (no short-circuit, whose branch kept a reduction's lanes scalar) so that the kernels'
// loops vectorize.
#pragma once

namespace meshfuse {

template <typename T>
constexpr T nanPropagatingMax(T a, T b) {
  // cppcheck-suppress duplicateExpression ; a != a is the NaN test (true only for NaN)
  return ((a != a) | (a > b)) ? a : b;  // NOLINT(misc-redundant-expression)
}

template <typename T>
constexpr T nanPropagatingMin(T a, T b) {
  // cppcheck-suppress duplicateExpression ; a != a is the NaN test (true only for NaN)
  return ((a != a) | (a < b)) ? a : b;  // NOLINT(misc-redundant-expression)
}

}  // namespace meshfuse
