// CPU executor, pointwise segments: every op and dtype, broadcasting, scalars, casts, strided
// inputs and fused multi-output chains, each against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ops/ops.h"
#include "runtime/element.h"
#include "runtime/half.h"
#include "test_cpu_reference.h"

namespace meshfuse {
namespace {

using testing::checkAgainstReference;
using testing::randomTensor;
using testing::runOnCpu;
using Kind = Segment::Kind;

const DataType kFloatTypes[] = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16};
const DataType kNumericTypes[] = {DataType::Float,    DataType::Double, DataType::Half,
                                  DataType::BFloat16, DataType::Int,    DataType::Int32};

TensorView* input(Fusion& f, DataType dtype, std::vector<int64_t> shape) {
  TensorView* tv = f.newTensor(dtype, std::move(shape));
  f.addInput(tv);
  return tv;
}

TEST(CpuPointwise, UnaryOpsOnFloatTypes) {
  const OpType ops[] = {OpType::Neg,  OpType::Abs,     OpType::Exp,  OpType::Log, OpType::Sqrt,
                        OpType::Relu, OpType::Sigmoid, OpType::Tanh, OpType::Gelu};
  uint64_t seed = 1;
  for (OpType op : ops)
    for (DataType dt : kFloatTypes) {
      Fusion f;
      TensorView* x = input(f, dt, {37, 53});
      f.addOutput(ops::unary(op, x));
      const bool positive = op == OpType::Log || op == OpType::Sqrt;
      ValueMap v;
      v.tensors[x] = randomTensor(x->shape(), dt, seed++, positive ? 0.05 : -4.0, 4.0);
      checkAgainstReference(f, Kind::Pointwise, v, toString(op) + " " + toString(dt));
    }
}

TEST(CpuPointwise, UnaryOpsOnIntegers) {
  uint64_t seed = 100;
  for (OpType op : {OpType::Neg, OpType::Abs, OpType::Relu, OpType::Exp, OpType::Sqrt})
    for (DataType dt : {DataType::Int, DataType::Int32}) {
      Fusion f;
      TensorView* x = input(f, dt, {129});
      TensorView* y = ops::unary(op, x);
      f.addOutput(y);
      ValueMap v;
      v.tensors[x] = randomTensor(x->shape(), dt, seed++, op == OpType::Sqrt ? 0 : -50, 50);
      checkAgainstReference(f, Kind::Pointwise, v, toString(op) + " " + toString(dt));
    }
}

TEST(CpuPointwise, BinaryOpsWithBroadcasting) {
  const OpType ops[] = {OpType::Add, OpType::Sub, OpType::Mul, OpType::Div, OpType::Max, OpType::Min, OpType::Pow};
  uint64_t seed = 200;
  for (OpType op : ops)
    for (DataType dt : kNumericTypes) {
      Fusion f;
      TensorView* a = input(f, dt, {5, 1, 7});
      TensorView* b = input(f, dt, {4, 7});
      f.addOutput(ops::binary(op, a, b));
      ValueMap v;
      const bool integral = isIntegral(dt);
      if (op == OpType::Pow) {
        v.tensors[a] = randomTensor(a->shape(), dt, seed++, integral ? -4 : 0.25, 4);
        v.tensors[b] = randomTensor(b->shape(), dt, seed++, integral ? 0 : -2, 3);
      } else {
        v.tensors[a] = randomTensor(a->shape(), dt, seed++, -20, 20);
        // Divisors away from zero.
        v.tensors[b] = randomTensor(b->shape(), dt, seed++, op == OpType::Div ? 1 : -20, 20);
      }
      checkAgainstReference(f, Kind::Pointwise, v, toString(op) + " " + toString(dt));
    }
}

TEST(CpuPointwise, MixedDtypesPromote) {
  const std::pair<DataType, DataType> pairs[] = {
      {DataType::Half, DataType::Float}, {DataType::Int32, DataType::Float},   {DataType::Int, DataType::Double},
      {DataType::Bool, DataType::Float}, {DataType::BFloat16, DataType::Half}, {DataType::Int32, DataType::Int}};
  uint64_t seed = 300;
  for (auto [da, db] : pairs) {
    Fusion f;
    TensorView* a = input(f, da, {3, 64});
    TensorView* b = input(f, db, {64});
    TensorView* c = ops::binary(OpType::Mul, a, b);
    f.addOutput(ops::binary(OpType::Add, c, a));
    ValueMap v;
    v.tensors[a] = randomTensor(a->shape(), da, seed++, -9, 9);
    v.tensors[b] = randomTensor(b->shape(), db, seed++, -9, 9);
    checkAgainstReference(f, Kind::Pointwise, v, toString(da) + "*" + toString(db));
  }
}

TEST(CpuPointwise, BoolOperands) {
  Fusion f;
  TensorView* a = input(f, DataType::Bool, {100});
  TensorView* b = input(f, DataType::Bool, {100});
  f.addOutput(ops::binary(OpType::Max, a, b));  // logical or, stays Bool
  f.addOutput(ops::binary(OpType::Min, a, b));  // logical and
  f.addOutput(ops::binary(OpType::Add, a, b));  // Int, 0..2
  ValueMap v;
  v.tensors[a] = randomTensor(a->shape(), DataType::Bool, 400);
  v.tensors[b] = randomTensor(b->shape(), DataType::Bool, 401);
  checkAgainstReference(f, Kind::Pointwise, v, "bool ops");
  EXPECT_EQ(v.tensor(f.outputs()[2]).dtype(), DataType::Int);
}

TEST(CpuPointwise, ScalarOperandsConstantAndBound) {
  for (DataType dt : {DataType::Float, DataType::Half, DataType::Int}) {
    Fusion f;
    TensorView* x = input(f, dt, {33, 17});
    Scalar* s = f.newScalar(DataType::Double, std::nullopt);
    f.addInput(s);
    Scalar* k = f.newScalar(isIntegral(dt) ? DataType::Int : DataType::Double, 3.0);
    TensorView* a = ops::binary(OpType::Mul, x, k);                              // tensor op constant
    TensorView* b = ops::binary(OpType::Sub, k, a);                              // constant op tensor
    TensorView* c = ops::binary(OpType::Pow, b, f.newScalar(DataType::Int, 2));  // pow by a scalar
    f.addOutput(c);
    f.addOutput(ops::binary(OpType::Add, x, s));  // a scalar bound at run time
    ValueMap v;
    v.tensors[x] = randomTensor(x->shape(), dt, 500, -5, 5);
    v.scalars[s] = -1.25;
    checkAgainstReference(f, Kind::Pointwise, v, "scalars " + toString(dt));
  }
}

Tensor fromValues(const std::vector<double>& values, DataType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, dtype);
  for (size_t i = 0; i < values.size(); ++i)
    storeFromDouble(static_cast<char*>(t.data()) + i * t.itemsize(), dtype, values[i]);
  return t;
}

Tensor castOnCpu(const Tensor& x, DataType to) {
  Fusion f;
  TensorView* in = input(f, x.dtype(), x.shape());
  f.addOutput(ops::cast(in, to));
  ValueMap v;
  v.tensors[in] = x;
  runOnCpu(f, Kind::Pointwise, v);
  return v.tensor(f.outputs()[0]);
}

TEST(CpuPointwise, CastRoundsLikeTheTarget) {
  Tensor x = fromValues({-2.7, -0.5, 0.5, 2.7, 3.0, -0.0, 1e-30, 65519.0, 1.0009765625, 100000.0}, DataType::Float);
  Tensor to_int = castOnCpu(x, DataType::Int);
  const int64_t expected_int[] = {-2, 0, 0, 2, 3, 0, 0, 65519, 1, 100000};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(to_int.dataAs<int64_t>()[i], expected_int[i]) << "float->int at " << i;
  Tensor to_i32 = castOnCpu(x, DataType::Int32);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(to_i32.dataAs<int32_t>()[i], expected_int[i]) << "float->int32 at " << i;
  Tensor to_bool = castOnCpu(x, DataType::Bool);
  const uint8_t expected_bool[] = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(to_bool.dataAs<uint8_t>()[i], expected_bool[i]) << "float->bool at " << i;
  Tensor to_half = castOnCpu(x, DataType::Half);
  Tensor to_bf16 = castOnCpu(x, DataType::BFloat16);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(to_half.dataAs<uint16_t>()[i], floatToHalf(x.dataAs<float>()[i])) << "float->half at " << i;
    EXPECT_EQ(to_bf16.dataAs<uint16_t>()[i], floatToBf16(x.dataAs<float>()[i])) << "float->bf16 at " << i;
  }
  Tensor d = fromValues({0.1, 1.0 / 3.0, 1e40, -7.25}, DataType::Double);
  Tensor to_float = castOnCpu(d, DataType::Float);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(to_float.dataAs<float>()[i], static_cast<float>(d.dataAs<double>()[i]));
}

TEST(CpuPointwise, CastInsideAFusionRoundsThere) {
  // float -> half -> float inside one fused loop must still lose the half's precision.
  Fusion f;
  TensorView* x = input(f, DataType::Float, {4096});
  TensorView* h = ops::cast(x, DataType::Half);
  TensorView* back = ops::cast(h, DataType::Float);
  f.addOutput(ops::binary(OpType::Sub, x, back));  // the rounding error
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Float, 600, -100, 100);
  checkAgainstReference(f, Kind::Pointwise, v, "half round trip");
  const Tensor& err = v.tensor(f.outputs()[0]);
  const float* xs = v.tensor(x).dataAs<float>();
  for (int64_t i = 0; i < err.numel(); ++i)
    ASSERT_EQ(err.dataAs<float>()[i], xs[i] - halfToFloat(floatToHalf(xs[i]))) << "at " << i;
}

TEST(CpuPointwise, StridedPermutedAndBroadcastInputs) {
  for (DataType dt : {DataType::Float, DataType::Half, DataType::Double, DataType::Int32}) {
    Fusion f;
    TensorView* x = input(f, dt, {40, 24});
    TensorView* y = input(f, dt, {40, 24});
    TensorView* z = input(f, dt, {40, 24});
    TensorView* s = input(f, dt, {});
    f.addOutput(ops::binary(OpType::Add, ops::binary(OpType::Mul, x, y), ops::binary(OpType::Sub, z, s)));
    ValueMap v;
    v.tensors[x] = randomTensor({24, 40}, dt, 700, -3, 3).permute({1, 0});   // transposed
    v.tensors[y] = randomTensor({40, 50}, dt, 701, -3, 3).slice(1, 13, 24);  // row stride 50
    v.tensors[z] = randomTensor({1, 24}, dt, 702, -3, 3).expand({40, 24});   // stride 0 rows
    v.tensors[s] = randomTensor({}, dt, 703, -3, 3);                         // rank 0
    ASSERT_FALSE(v.tensors[x].isContiguous());
    ASSERT_FALSE(v.tensors[y].isContiguous());
    checkAgainstReference(f, Kind::Pointwise, v, "strided " + toString(dt));
  }
}

TEST(CpuPointwise, FusedChainWithSharedIntermediate) {
  for (DataType dt : kFloatTypes) {
    Fusion f;
    TensorView* x = input(f, dt, {300, 1031});  // many tiles, odd tail, several threads
    TensorView* y = input(f, dt, {1031});
    TensorView* t = ops::binary(OpType::Mul, x, y);  // used three times below
    TensorView* u = ops::unary(OpType::Tanh, t);
    TensorView* w = ops::binary(OpType::Add, t, u);
    TensorView* r = ops::binary(OpType::Sub, ops::unary(OpType::Relu, w), t);
    f.addOutput(ops::binary(OpType::Mul, r, f.newScalar(DataType::Double, 0.5)));
    ValueMap v;
    v.tensors[x] = randomTensor(x->shape(), dt, 800, -2, 2);
    v.tensors[y] = randomTensor(y->shape(), dt, 801, -2, 2);
    checkAgainstReference(f, Kind::Pointwise, v, "chain " + toString(dt));
  }
}

TEST(CpuPointwise, TwoOutputsOneUsedByTheOther) {
  Fusion f;
  TensorView* x = input(f, DataType::Float, {300, 70});
  TensorView* y = input(f, DataType::Float, {300, 70});
  TensorView* a = ops::binary(OpType::Add, x, y);
  TensorView* b = ops::binary(OpType::Mul, a, a);
  TensorView* h = ops::cast(ops::unary(OpType::Exp, b), DataType::Half);
  f.addOutput(a);
  f.addOutput(h);
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Float, 900, -1, 1);
  v.tensors[y] = randomTensor(y->shape(), DataType::Float, 901, -1, 1);
  checkAgainstReference(f, Kind::Pointwise, v, "two outputs");
}

TEST(CpuPointwise, OutputsOfBroadcastRelatedShapes) {
  Fusion f;
  TensorView* x = input(f, DataType::Float, {64, 1});
  TensorView* y = input(f, DataType::Float, {64, 96});
  TensorView* a = ops::unary(OpType::Exp, x);      // [64, 1], also an output
  TensorView* b = ops::binary(OpType::Add, a, y);  // [64, 96]
  f.addOutput(a);
  f.addOutput(b);
  ValueMap v;
  v.tensors[x] = randomTensor(x->shape(), DataType::Float, 1000);
  v.tensors[y] = randomTensor(y->shape(), DataType::Float, 1001);
  checkAgainstReference(f, Kind::Pointwise, v, "broadcast outputs");
}

TEST(CpuPointwise, IntegersStayExactBeyondDoublePrecision) {
  Fusion f;
  TensorView* x = input(f, DataType::Int, {3000});
  TensorView* y = input(f, DataType::Int, {3000});
  f.addOutput(ops::binary(OpType::Sub, ops::binary(OpType::Add, x, y), f.newScalar(DataType::Int, 1)));
  ValueMap v;
  Tensor tx = Tensor::empty({3000}, DataType::Int), ty = Tensor::empty({3000}, DataType::Int);
  for (int64_t i = 0; i < 3000; ++i) {
    tx.dataAs<int64_t>()[i] = (int64_t{1} << 60) + 3 * i + 1;  // not representable in a double
    ty.dataAs<int64_t>()[i] = -i * 7;
  }
  v.tensors[x] = tx;
  v.tensors[y] = ty;
  runOnCpu(f, Kind::Pointwise, v);
  const int64_t* out = v.tensor(f.outputs()[0]).dataAs<int64_t>();
  for (int64_t i = 0; i < 3000; ++i) ASSERT_EQ(out[i], (int64_t{1} << 60) + 3 * i + 1 - i * 7 - 1) << "at " << i;
}

TEST(CpuPointwise, EmptyTensorGivesEmptyOutput) {
  Fusion f;
  TensorView* x = input(f, DataType::Float, {0, 5});
  f.addOutput(ops::unary(OpType::Exp, x));
  ValueMap v;
  v.tensors[x] = Tensor::empty({0, 5}, DataType::Float);
  runOnCpu(f, Kind::Pointwise, v);
  EXPECT_EQ(v.tensor(f.outputs()[0]).shape(), (std::vector<int64_t>{0, 5}));
}

TEST(CpuPointwise, BadInputsRaiseClearErrors) {
  Fusion f;
  TensorView* x = input(f, DataType::Float, {4, 5});
  f.addOutput(ops::unary(OpType::Neg, x));
  ValueMap v;
  v.tensors[x] = Tensor::zeros({4, 6}, DataType::Float);
  try {
    runOnCpu(f, Kind::Pointwise, v);
    FAIL() << "a wrong shape was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(x->name()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  v.tensors[x] = Tensor::zeros({4, 5}, DataType::Double);
  EXPECT_THROW(runOnCpu(f, Kind::Pointwise, v), std::invalid_argument);
}

}  // namespace
}  // namespace meshfuse
