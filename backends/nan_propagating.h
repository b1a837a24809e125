// Max and min as numpy's maximum / torch's max have them: NaN wins. std::max and a `>` comparison
// return whichever operand comes first when one is NaN, so a reduction across ranks kept or lost a NaN
// depending on which rank held it (found: a max over a sharded axis on MPI, Gloo and UCC). The CPU
// backends' own reduction functions use these.
#pragma once
#include <cmath>
#include <type_traits>

namespace meshfuse {

template <typename T>
bool isNan(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(v);
  else
    return false;
}

template <typename T>
T nanPropagatingMax(T a, T b) {
  if (isNan(a)) return a;
  if (isNan(b)) return b;
  return a < b ? b : a;
}

template <typename T>
T nanPropagatingMin(T a, T b) {
  if (isNan(a)) return a;
  if (isNan(b)) return b;
  return b < a ? b : a;
}

}  // namespace meshfuse
