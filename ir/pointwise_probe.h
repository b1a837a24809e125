// Evaluates a chain of pointwise exprs at chosen values, in double, to tell what function it
// computes. The IR has no op for the tanh GELU or its derivative: users spell them with mul, add
// and tanh in many equivalent ways (u*u*u or u*(u*u), 0.5*u*(1+t) or (0.5*u)*(1+t)), which a
// structural match would have to enumerate. Evaluating the chain at a few dozen points and
// comparing with the known function accepts every spelling; only analytic ops are evaluated (no
// comparisons, where, random or integer ops), so agreement at the probes fixes the function.
#pragma once
#include <optional>
#include <unordered_map>

#include "ir/ir.h"

namespace meshfuse {

// The value of `v` with the vals in `leaves` bound (constants come from the IR). nullopt when the
// computation reaches a val that is neither bound nor a constant, or an op outside the analytic
// set: neg, square, exp, tanh, sqrt, rsqrt, reciprocal, add, sub, mul, div, pow, set, and casts
// between floating types (evaluated without rounding: the chain's function, not its precision).
std::optional<double> probePointwise(const Val* v, const std::unordered_map<const Val*, double>& leaves);

// The tanh approximation of GELU and its derivative, in double (the functions probes compare with).
double geluTanh(double u);
double geluTanhGrad(double u);

}  // namespace meshfuse
