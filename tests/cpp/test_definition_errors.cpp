// Mistakes a C++ user can make that the Python front end catches before C++ sees them: each must be a
// UserError with a message naming the value, never a crash, an internal error or a silently rounded
// result (found by exploring the installed C++ API as a new user, session 32).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "host_ir/fusion_executor.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

// `body` throws a UserError whose message contains `needle`.
template <typename Body>
void expectUserError(Body body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "no UserError; expected one containing '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DefinitionErrors, ANullFusionIsAUserError) {  // it was dereferenced
  expectUserError([] { FusionExecutorCache cache(nullptr); }, "expected a Fusion, got null");
}

TEST(DefinitionErrors, AnEmptyOrMalformedMeshIsAUserError) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Float, {4});
  // A default-constructed mesh crashed execute (maxDevice of no devices).
  expectUserError([&] { x->setDeviceMesh(DeviceMesh()); }, "no devices");
  EXPECT_FALSE(x->hasDeviceMesh());
  // The mesh's own checks were std::invalid_argument, which `catch (const UserError&)` missed.
  expectUserError([] { DeviceMesh({0, 0}); }, "appears twice");
  expectUserError([] { DeviceMesh({-1}); }, "negative device id");
  expectUserError([] { DeviceMesh({0, 1, 2}, {2, 2}); }, "does not hold 3 devices");
  expectUserError([] { DeviceMesh(std::vector<int64_t>{}); }, "no devices");
}

// An Int scalar input got 2.7 as 2 and 1e300 or NaN as INT64_MIN (an undefined conversion).
TEST(DefinitionErrors, AnIntScalarInputMustBeAWholeNumberWithin2To53) {
  auto f = std::make_shared<Fusion>();
  TensorView* x = f->newTensor(DataType::Int, {4});
  Scalar* s = f->newScalar(DataType::Int, std::nullopt);
  f->addInput(x);
  f->addInput(s);
  f->addOutput(ops::binary(OpType::Add, x, s));
  FusionExecutorCache fec(f);
  const Tensor zeros = Tensor::zeros({4}, DataType::Int);
  for (double bad : {2.7, -0.5, 1e300, std::nan(""), std::numeric_limits<double>::infinity()})
    expectUserError([&] { fec.execute({zeros, bad}); }, "input 1 (" + s->name() + ") is an Int scalar");
  expectUserError([&] { fec.execute({zeros, 9007199254740994.0}); }, "beyond 2**53");
  const auto out = fec.execute({zeros, -3.0});  // a whole number runs
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(out[0].item(i), -3.0);
}

TEST(DefinitionErrors, AnIntConstantMustBeAWholeNumber) {
  Fusion f;
  expectUserError([&] { f.newScalar(DataType::Int, 0.5); }, "whole number");
  expectUserError([&] { f.newScalar(DataType::Int32, std::nan("")); }, "whole number");
  expectUserError([&] { f.newScalar(DataType::Int, 1e17); }, "within 2**53");
  EXPECT_EQ(f.newScalar(DataType::Int, -7.0)->value(), -7.0);
  EXPECT_EQ(f.newScalar(DataType::Double, 0.5)->value(), 0.5);
}

// A value used but never added as an input failed deep in the executor with std::logic_error
// ("no value bound for S1", "bindShapes: T1 has no shape").
TEST(DefinitionErrors, AValueThatIsNotAnInputIsNamed) {
  {
    auto f = std::make_shared<Fusion>();
    TensorView* x = f->newTensor(DataType::Float, {4});
    Scalar* s = f->newScalar(DataType::Float, std::nullopt);  // never add_input'ed
    f->addInput(x);
    f->addOutput(ops::binary(OpType::Mul, x, s));
    expectUserError([&] { FusionExecutorCache(f).execute({Tensor::zeros({4}, DataType::Float)}); },
                    s->name() + " is an operand of mul but is neither a fusion input");
  }
  {
    auto f = std::make_shared<Fusion>();
    TensorView* x = f->newTensor(DataType::Float, {4});
    TensorView* y = f->newTensor(DataType::Float, {4});  // never add_input'ed
    f->addInput(x);
    f->addOutput(ops::binary(OpType::Add, x, y));
    expectUserError([&] { FusionExecutorCache(f).execute({Tensor::zeros({4}, DataType::Float)}); },
                    y->name() + " is an operand of add");
  }
  {
    auto f = std::make_shared<Fusion>();
    TensorView* y = f->newTensor(DataType::Float, {4});
    f->addOutput(y);
    expectUserError([&] { FusionExecutorCache(f).execute({}); }, y->name() + " is a fusion output");
  }
}

// Tensor::item (the element reader of tests and debugging) read past the end without a word.
TEST(DefinitionErrors, TensorItemIsBoundsChecked) {
  const Tensor t = Tensor::zeros({2, 2}, DataType::Float);
  EXPECT_EQ(t.item(3), 0.0);
  EXPECT_THROW(static_cast<void>(t.item(4)), std::out_of_range);
  EXPECT_THROW(static_cast<void>(t.item(-1)), std::out_of_range);
}

}  // namespace
}  // namespace meshfuse
