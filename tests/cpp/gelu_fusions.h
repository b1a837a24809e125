// The tanh GELU and its derivative spelled with pointwise ops, as users write them (the GPT-3
// layer of meshfuse.models, and a second spelling with another association and u^3 as pow), for
// the tests of the matmul epilogues (host_ir/matmul_epilogue.h) on the CPU and on CUDA.
#pragma once
#include "ops/ops.h"

namespace meshfuse::testing_gelu {

constexpr double kC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kA = 0.044715;

inline Val* constant(TensorView* like, double v) { return like->fusion()->newScalar(DataType::Double, v); }
inline TensorView* mul(Val* a, Val* b) { return ops::binary(OpType::Mul, a, b); }
inline TensorView* add(Val* a, Val* b) { return ops::binary(OpType::Add, a, b); }
inline TensorView* sub(Val* a, Val* b) { return ops::binary(OpType::Sub, a, b); }

// 0.5 u (1 + tanh(c (u + a u^3))); spelling 0 is meshfuse.models', 1 regroups it and takes u^3 as
// pow(u, 3); `cubic` replaces a (a wrong constant must not be taken for the GELU).
inline TensorView* geluTanh(TensorView* u, int spelling = 0, double cubic = kA) {
  auto k = [&](double v) { return constant(u, v); };
  if (spelling == 0) {
    TensorView* inner = mul(k(kC), add(u, mul(k(cubic), mul(mul(u, u), u))));
    return mul(mul(k(0.5), u), add(k(1.0), ops::unary(OpType::Tanh, inner)));
  }
  TensorView* cube = ops::binary(OpType::Pow, u, k(3.0));
  TensorView* inner = add(mul(u, k(kC)), mul(cube, k(kC * cubic)));
  return mul(k(0.5), mul(u, add(ops::unary(OpType::Tanh, inner), k(1.0))));
}

// d gelu_tanh(u) / du, as meshfuse.models writes it.
inline TensorView* geluTanhGrad(TensorView* u) {
  auto k = [&](double v) { return constant(u, v); };
  TensorView* u2 = mul(u, u);
  TensorView* t = ops::unary(OpType::Tanh, mul(k(kC), add(u, mul(k(kA), mul(u2, u)))));
  TensorView* dinner = mul(k(kC), add(k(1.0), mul(k(3 * kA), u2)));
  return add(mul(k(0.5), add(k(1.0), t)), mul(mul(mul(k(0.5), u), sub(k(1.0), mul(t, t))), dinner));
}

// The forward's MLP-up: gelu(linear(x, w, b)) computed in fp32 from a `dt` product, stored in `dt`.
struct GeluForward {
  TensorView *x, *w, *b, *product, *result;
};
inline GeluForward geluForward(Fusion& f, DataType dt, int64_t rows, int64_t k, int64_t n, int spelling = 0,
                               double cubic = kA) {
  GeluForward g{};
  g.x = f.newTensor(dt, {rows, k});
  g.w = f.newTensor(dt, {n, k});
  g.b = f.newTensor(dt, {n});
  for (TensorView* tv : {g.x, g.w, g.b}) f.addInput(tv);
  g.product = ops::linear(g.x, g.w, g.b);
  TensorView* u = dt == DataType::Float ? g.product : ops::cast(g.product, DataType::Float);
  TensorView* y = geluTanh(u, spelling, cubic);
  g.result = dt == DataType::Float ? y : ops::cast(y, dt);
  return g;
}

// The backward's: d(pre-activation) = (dy @ w) reshaped, times gelu'(aux), in fp32, stored in `dt`;
// the cast of aux comes before the matmul, as in meshfuse.models. With `bias_grad`, also the
// linear's bias gradient: the fp32 sum of the result over batch and rows, stored in `dt`.
struct GeluBackward {
  TensorView *dy, *w, *aux, *product, *result, *bias_grad;
};
inline GeluBackward geluBackward(Fusion& f, DataType dt, int64_t batch, int64_t rows, int64_t k, int64_t n,
                                 bool bias_grad = false) {
  GeluBackward g{};
  g.dy = f.newTensor(dt, {batch * rows, n});
  g.w = f.newTensor(dt, {n, k});
  g.aux = f.newTensor(dt, {batch, rows, k});
  for (TensorView* tv : {g.dy, g.w, g.aux}) f.addInput(tv);
  TensorView* aux32 = dt == DataType::Float ? g.aux : ops::cast(g.aux, DataType::Float);
  g.product = ops::matmul(g.dy, g.w);
  TensorView* dgelu = ops::reshape(g.product, {batch, rows, k});
  TensorView* d32 = dt == DataType::Float ? dgelu : ops::cast(dgelu, DataType::Float);
  TensorView* d = mul(d32, geluTanhGrad(aux32));
  g.result = dt == DataType::Float ? d : ops::cast(d, dt);
  g.bias_grad = nullptr;
  if (bias_grad) {
    TensorView* sum = ops::reduction(
        OpType::Sum, dt == DataType::Float ? g.result : ops::cast(g.result, DataType::Float), {0, 1}, false);
    g.bias_grad = dt == DataType::Float ? sum : ops::cast(sum, dt);
  }
  return g;
}

}  // namespace meshfuse::testing_gelu
