// Normalization programs written from primitive ops as a user would (fp32 compute: cast in,
// compute, cast back), shared by the CUDA codegen tests (compiled here) and the CUDA executor tests
// (run on a GPU against the CPU executor).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace meshfuse::testing_norms {

// Adds an input of (dtype, shape) whose random values lie in [lo, hi].
using InputFn = std::function<TensorView*(DataType, std::vector<int64_t>, double lo, double hi)>;

enum class Norm { LayerNorm, RmsNorm, Softmax, LogSoftmax, LayerNormBackward };
inline const std::vector<Norm> kAllNorms = {Norm::LayerNorm, Norm::RmsNorm, Norm::Softmax, Norm::LogSoftmax,
                                            Norm::LayerNormBackward};

inline std::string toString(Norm n) {
  switch (n) {
    case Norm::LayerNorm: return "layer_norm";
    case Norm::RmsNorm: return "rms_norm";
    case Norm::Softmax: return "softmax";
    case Norm::LogSoftmax: return "log_softmax";
    case Norm::LayerNormBackward: return "layer_norm_backward";
  }
  return "?";
}

// LayerNorm's input gradient and normalized input over [rows, row] (all fp32): {dx, xhat} for the
// output gradient dy, the input x, its per-row mean and rstd ([rows]) and the weight w ([row]).
inline std::vector<TensorView*> layerNormInputGradient(TensorView* dy, TensorView* x, TensorView* mean,
                                                       TensorView* rstd, TensorView* w) {
  using ops::binary;
  const std::vector<int64_t> full = x->shape();
  auto perRow = [&](TensorView* v) { return ops::broadcastInDim(v, full, {0}); };
  TensorView* xhat = binary(OpType::Mul, binary(OpType::Sub, x, perRow(mean)), perRow(rstd));
  TensorView* g = binary(OpType::Mul, dy, w);
  TensorView* c1 = perRow(ops::reduction(OpType::Mean, binary(OpType::Mul, g, xhat), {1}, false));
  TensorView* c2 = perRow(ops::reduction(OpType::Mean, g, {1}, false));
  TensorView* dx =
      binary(OpType::Mul, binary(OpType::Sub, binary(OpType::Sub, g, c2), binary(OpType::Mul, xhat, c1)), perRow(rstd));
  return {dx, xhat};
}

// The outputs of `norm` over rows of `row` elements ([rows, row] inputs, weights of [row]).
inline std::vector<TensorView*> defineNorm(Norm norm, Fusion& f, DataType dt, int64_t rows, int64_t row,
                                           const InputFn& input) {
  using ops::binary;
  using ops::broadcastInDim;
  using ops::cast;
  using ops::reduction;
  using ops::unary;
  const std::vector<int64_t> full = {rows, row};
  auto perRow = [&](TensorView* v) { return broadcastInDim(v, full, {0}); };
  auto num = [&](double v) { return f.newScalar(DataType::Double, v); };
  auto toFloat = [&](TensorView* v) { return cast(v, DataType::Float); };
  if (norm == Norm::LayerNormBackward) {
    TensorView* dy = toFloat(input(dt, full, -1, 1));
    TensorView* x = toFloat(input(dt, full, -2, 2));
    TensorView* mean = input(DataType::Float, {rows}, -0.1, 0.1);
    TensorView* rstd = input(DataType::Float, {rows}, 0.5, 1.5);
    TensorView* w = toFloat(input(dt, {row}, 0.5, 1.5));
    const std::vector<TensorView*> dx_xhat = layerNormInputGradient(dy, x, mean, rstd, w);
    TensorView *dx = dx_xhat[0], *xhat = dx_xhat[1];
    TensorView* dgamma = reduction(OpType::Sum, binary(OpType::Mul, dy, xhat), {0}, false);
    TensorView* dbeta = reduction(OpType::Sum, dy, {0}, false);
    return {cast(dx, dt), cast(dgamma, dt), cast(dbeta, dt)};
  }
  TensorView* x = toFloat(input(dt, full, -3, 3));
  switch (norm) {
    case Norm::LayerNorm: {
      TensorView* w = toFloat(input(dt, {row}, 0.5, 1.5));
      TensorView* b = toFloat(input(dt, {row}, -1, 1));
      TensorView* mean = reduction(OpType::Mean, x, {1}, false);
      TensorView* xc = binary(OpType::Sub, x, perRow(mean));
      TensorView* var = reduction(OpType::Mean, unary(OpType::Square, xc), {1}, false);
      TensorView* rstd = unary(OpType::Rsqrt, binary(OpType::Add, var, num(1e-5)));
      TensorView* y = binary(OpType::Add, binary(OpType::Mul, binary(OpType::Mul, xc, perRow(rstd)), w), b);
      return {cast(y, dt), mean, rstd};
    }
    case Norm::RmsNorm: {
      TensorView* w = toFloat(input(dt, {row}, 0.5, 1.5));
      TensorView* ms = reduction(OpType::Mean, unary(OpType::Square, x), {1}, false);
      TensorView* rstd = unary(OpType::Rsqrt, binary(OpType::Add, ms, num(1e-6)));
      return {cast(binary(OpType::Mul, binary(OpType::Mul, x, perRow(rstd)), w), dt)};
    }
    case Norm::Softmax:
    case Norm::LogSoftmax: {
      TensorView* m = perRow(reduction(OpType::ReduceMax, x, {1}, false));
      TensorView* shifted = binary(OpType::Sub, x, m);
      TensorView* e = unary(OpType::Exp, shifted);
      TensorView* s = perRow(reduction(OpType::Sum, e, {1}, false));
      TensorView* y =
          norm == Norm::Softmax ? binary(OpType::Div, e, s) : binary(OpType::Sub, shifted, unary(OpType::Log, s));
      return {cast(y, dt)};
    }
    default: break;
  }
  return {};
}

// The GPT-3 layer's second LayerNorm backward as its bf16 backward lowers it (python/meshfuse/models/
// transformer.py): the LayerNorm gradient of the fp32 residual stream x, plus the output gradient
// `dres` passed around the block, and that sum again through the attention's dropout mask. Four row
// inputs besides two column sums: one block cannot hold them all at 12288 columns, so by default the
// kernel streams the inputs.
inline std::vector<TensorView*> defineResidualLayerNormBackward(Fusion& f, DataType dt, int64_t rows, int64_t row,
                                                                const InputFn& input) {
  using ops::binary;
  using ops::cast;
  const std::vector<int64_t> full = {rows, row};
  auto toFloat = [&](TensorView* v) { return cast(v, DataType::Float); };
  TensorView* dy = toFloat(input(dt, full, -1, 1));
  TensorView* x = input(DataType::Float, full, -2, 2);
  TensorView* dres = toFloat(input(dt, full, -1, 1));
  TensorView* keep = toFloat(input(DataType::Bool, full, 0, 1));
  TensorView* mean = input(DataType::Float, {rows}, -0.1, 0.1);
  TensorView* rstd = input(DataType::Float, {rows}, 0.5, 1.5);
  TensorView* w = toFloat(input(dt, {row}, 0.5, 1.5));
  const std::vector<TensorView*> dx_xhat = layerNormInputGradient(dy, x, mean, rstd, w);
  TensorView *dx = dx_xhat[0], *xhat = dx_xhat[1];
  TensorView* dh = binary(OpType::Add, dres, dx);
  TensorView* dropped = binary(OpType::Mul, binary(OpType::Mul, dh, keep), f.newScalar(DataType::Double, 1 / 0.9));
  return {dh, cast(dropped, dt), ops::reduction(OpType::Sum, binary(OpType::Mul, dy, xhat), {0}, false),
          ops::reduction(OpType::Sum, dy, {0}, false)};
}

}  // namespace meshfuse::testing_norms
