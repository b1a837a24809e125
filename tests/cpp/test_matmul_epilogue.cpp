// Matmul epilogues (host_ir/matmul_epilogue.h): which pointwise chains after a matmul are taken for
// the tanh GELU or its backward, and which are not (another function, an intermediate read
// elsewhere, a product read elsewhere); the probe evaluator they rest on; and the CPU executor's
// run of a folded segment against the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "gelu_fusions.h"
#include "host_ir/matmul_epilogue.h"
#include "ir/pointwise_probe.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using namespace testing_gelu;

auto everywhere = [](const Expr*) { return true; };

TEST(PointwiseProbe, EvaluatesTheChainAndRefusesWhatIsNotAnalytic) {
  Fusion f;
  TensorView* u = f.newTensor(DataType::Float, {4});
  f.addInput(u);
  TensorView* g0 = geluTanh(u, 0);
  TensorView* g1 = geluTanh(u, 1);
  for (double x : {-3.0, -0.4, 0.0, 0.7, 2.5}) {
    EXPECT_NEAR(*probePointwise(g0, {{u, x}}), geluTanh(x), 1e-12) << x;
    EXPECT_NEAR(*probePointwise(g1, {{u, x}}), geluTanh(x), 1e-12) << x;
  }
  // The derivative is the derivative (central difference of the function).
  TensorView* d = testing_gelu::geluTanhGrad(u);
  for (double x : {-2.0, 0.3, 1.7})
    EXPECT_NEAR(*probePointwise(d, {{u, x}}), (geluTanh(x + 1e-6) - geluTanh(x - 1e-6)) / 2e-6, 1e-8) << x;
  EXPECT_FALSE(probePointwise(g0, {}).has_value()) << "an unbound leaf";
  EXPECT_FALSE(probePointwise(ops::binary(OpType::Lt, u, f.newScalar(DataType::Double, 0.0)), {{u, 1.0}}))
      << "a comparison";
  EXPECT_FALSE(probePointwise(add(u, f.newScalar(DataType::Double, std::nullopt)), {{u, 1.0}}))
      << "a scalar bound only at execution";
}

TEST(MatmulEpilogue, TheForwardGeluIsFoldedInEverySpelling) {
  for (DataType dt : {DataType::Float, DataType::BFloat16}) {
    for (int spelling : {0, 1}) {
      Fusion f;
      GeluForward g = geluForward(f, dt, 8, 16, 24, spelling);
      f.addOutput(g.product);  // the backward reads the pre-activation: stored by the epilogue too
      f.addOutput(g.result);
      auto folds = findMatmulEpilogues(f, everywhere);
      ASSERT_EQ(folds.size(), 1u) << toString(dt) << " spelling " << spelling;
      const EpilogueFold& fold = folds.begin()->second;
      EXPECT_EQ(folds.begin()->first, g.product->definition());
      EXPECT_EQ(fold.epilogue.kind, MatmulEpilogue::Kind::GeluTanh);
      EXPECT_EQ(fold.epilogue.result, g.result);
      EXPECT_EQ(fold.exprs.back(), g.result->definition());
    }
  }
}

TEST(MatmulEpilogue, OtherFunctionsAndSharedIntermediatesAreNotFolded) {
  {  // a wrong constant: not the GELU, though every op is the same
    Fusion f;
    GeluForward g = geluForward(f, DataType::Float, 8, 16, 24, 0, 0.0447);
    f.addOutput(g.result);
    EXPECT_TRUE(findMatmulEpilogues(f, everywhere).empty());
  }
  {  // the erf GELU (an op of its own, not an epilogue cuBLASLt has)
    Fusion f;
    GeluForward g = geluForward(f, DataType::Float, 8, 16, 24);
    f.addOutput(ops::unary(OpType::Gelu, g.product));
    f.addOutput(g.result);
    auto folds = findMatmulEpilogues(f, everywhere);
    ASSERT_EQ(folds.size(), 1u) << "the tanh chain still folds; the erf GELU stays outside";
    for (const Expr* e : folds.begin()->second.exprs) EXPECT_NE(e->op(), OpType::Gelu);
  }
  {  // an intermediate of the chain is a fusion output
    Fusion f;
    GeluForward g = geluForward(f, DataType::Float, 8, 16, 24);
    f.addOutput(g.result);
    const Expr* tanh = nullptr;
    for (const auto& e : f.exprs())
      if (e->op() == OpType::Tanh) tanh = e.get();
    f.addOutput(tanh->out());
    EXPECT_TRUE(findMatmulEpilogues(f, everywhere).empty());
  }
  {  // an expr the lowering keeps elsewhere (a communication, another rank's)
    Fusion f;
    GeluForward g = geluForward(f, DataType::Float, 8, 16, 24);
    f.addOutput(g.result);
    EXPECT_TRUE(findMatmulEpilogues(f, [](const Expr* e) { return e->op() != OpType::Tanh; }).empty());
  }
}

TEST(MatmulEpilogue, TheBackwardGeluGradientIsFoldedWithItsSavedInput) {
  for (DataType dt : {DataType::Float, DataType::BFloat16}) {
    Fusion f;
    GeluBackward g = geluBackward(f, dt, 2, 4, 24, 16);
    f.addOutput(g.result);
    auto folds = findMatmulEpilogues(f, everywhere);
    ASSERT_EQ(folds.size(), 1u) << toString(dt);
    const EpilogueFold& fold = folds.begin()->second;
    EXPECT_EQ(fold.epilogue.kind, MatmulEpilogue::Kind::GeluTanhGrad);
    EXPECT_EQ(fold.epilogue.result, g.result);
    EXPECT_EQ(fold.epilogue.aux, g.aux);
    EXPECT_EQ(fold.exprs.front()->op(), OpType::Reshape) << "the reshape first, then the pointwise chain";
    // The cast of aux, defined before the matmul, moves with the chain (nothing else reads it).
    if (dt != DataType::Float) {
      const Expr* aux_cast = g.aux->uses().front();
      EXPECT_NE(std::find(fold.exprs.begin(), fold.exprs.end(), aux_cast), fold.exprs.end());
    }
  }
  for (DataType dt : {DataType::Float, DataType::BFloat16}) {  // with the linear's bias gradient
    Fusion f;
    GeluBackward g = geluBackward(f, dt, 2, 4, 24, 16, /*bias_grad=*/true);
    f.addOutput(g.result);
    f.addOutput(g.bias_grad);
    auto folds = findMatmulEpilogues(f, everywhere);
    ASSERT_EQ(folds.size(), 1u) << toString(dt);
    EXPECT_EQ(folds.begin()->second.epilogue.bias_grad, g.bias_grad) << toString(dt);
    EXPECT_EQ(folds.begin()->second.exprs.back(), g.bias_grad->definition());
  }
  {  // a sum over the last axis is not a bias gradient
    Fusion f;
    GeluBackward g = geluBackward(f, DataType::Float, 2, 4, 24, 16);
    f.addOutput(g.result);
    f.addOutput(ops::reduction(OpType::Sum, g.result, {2}, false));
    auto folds = findMatmulEpilogues(f, everywhere);
    ASSERT_EQ(folds.size(), 1u);
    EXPECT_EQ(folds.begin()->second.epilogue.bias_grad, nullptr);
  }
  {  // the product is read elsewhere too: the epilogue would not store it
    Fusion f;
    GeluBackward g = geluBackward(f, DataType::Float, 2, 4, 24, 16);
    f.addOutput(g.result);
    f.addOutput(g.product);
    EXPECT_TRUE(findMatmulEpilogues(f, everywhere).empty());
  }
}

// The CPU executor runs a folded segment as its parts: the same numbers as the float64 reference.
TEST(MatmulEpilogue, CpuRunOfAFoldedSegmentMatchesTheReference) {
  std::mt19937 rng(5);
  {
    Fusion f;
    GeluForward g = geluForward(f, DataType::Float, 12, 32, 40);
    f.addOutput(g.product);
    f.addOutput(g.result);
    ValueMap v;
    for (TensorView* tv : {g.x, g.w, g.b}) v.tensors[tv] = testing::randomTensor(tv->shape(), DataType::Float, rng());
    testing::checkAgainstReference(f, Segment::Kind::Matmul, v, "linear + gelu", 20.0);
  }
  {
    Fusion f;
    GeluBackward g = geluBackward(f, DataType::Float, 3, 4, 40, 32, /*bias_grad=*/true);
    f.addOutput(g.result);
    f.addOutput(g.bias_grad);
    ValueMap v;
    for (TensorView* tv : {g.dy, g.w, g.aux})
      v.tensors[tv] = testing::randomTensor(tv->shape(), DataType::Float, rng());
    testing::checkAgainstReference(f, Segment::Kind::Matmul, v, "matmul * gelu' and its column sums", 20.0);
  }
}

}  // namespace
}  // namespace meshfuse
