// The CUDA kernel generators compile with NVRTC for sm_90 (the H200's architecture). This needs
// the CUDA toolkit only, no GPU, so it runs on every machine with a CUDA build.
#include <gtest/gtest.h>

#if MESHFUSE_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <set>
#include <vector>

#include "norm_fusions.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "runtime/attention_params.h"
#include "runtime/cuda/attention_rng.h"
#include "runtime/cuda/dropout_mask.h"
#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/normalization.h"
#include "runtime/cuda/pointwise_codegen.h"
#include "runtime/cuda/reduction.h"
#include "runtime/cuda/strided_copy.h"
#include "runtime/half.h"
#include "scoped_env.h"

namespace meshfuse {
namespace {

using cuda::PointwiseProgram;
using cuda::PointwiseVariant;
using Kind = PointwiseProgram::Operand::Kind;

const std::vector<DataType> kAllTypes = {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16,
                                         DataType::Int,   DataType::Int32,  DataType::Bool};
const std::vector<OpType> kUnary = {OpType::Neg,  OpType::Abs,    OpType::Exp,        OpType::Log,
                                    OpType::Sqrt, OpType::Relu,   OpType::Sigmoid,    OpType::Tanh,
                                    OpType::Gelu, OpType::Rsqrt,  OpType::Reciprocal, OpType::Erf,
                                    OpType::Silu, OpType::Square, OpType::LogicalNot};
const std::vector<OpType> kBinary = {OpType::Add, OpType::Sub, OpType::Mul, OpType::Div,        OpType::Max,
                                     OpType::Min, OpType::Pow, OpType::Lt,  OpType::Le,         OpType::Gt,
                                     OpType::Ge,  OpType::Eq,  OpType::Ne,  OpType::LogicalAnd, OpType::LogicalOr};

// The result type the IR gives `op` on tensors of `dtype` (ops::resultType on a throwaway fusion).
DataType irResultType(OpType op, DataType dtype, bool with_float_scalar = false) {
  Fusion f;
  std::vector<Val*> in{f.newTensor(dtype, {4})};
  if (isBinary(op)) in.push_back(with_float_scalar ? static_cast<Val*>(f.newScalar(DataType::Double, 2.5)) : in[0]);
  return ops::resultType(op, in, {});
}

PointwiseProgram::Operand input(int i, DataType d) { return {Kind::Input, i, 0, d}; }

// Every unary and binary op applied to one (two) inputs of `dtype`, plus ops with a runtime scalar
// and constants (a finite one and infinity), each result an output.
PointwiseProgram allOpsProgram(DataType dtype) {
  PointwiseProgram p;
  p.inputs = {dtype, dtype};
  p.num_scalars = 1;
  auto add = [&](OpType op, std::vector<PointwiseProgram::Operand> args, DataType out) {
    p.instrs.push_back({op, std::move(args), out});
    p.outputs.push_back(static_cast<int>(p.instrs.size()) - 1);
  };
  for (OpType op : kUnary) add(op, {input(0, dtype)}, irResultType(op, dtype));
  for (OpType op : kBinary) add(op, {input(0, dtype), input(1, dtype)}, irResultType(op, dtype));
  add(OpType::Mul, {input(0, dtype), {Kind::Scalar, 0, 0, DataType::Double}}, irResultType(OpType::Mul, dtype, true));
  add(OpType::Min, {input(1, dtype), {Kind::Constant, 0, 1.0 / 3.0, DataType::Double}},
      irResultType(OpType::Min, dtype, true));
  add(OpType::Max, {input(1, dtype), {Kind::Constant, 0, -INFINITY, DataType::Double}},
      irResultType(OpType::Max, dtype, true));
  // Comparisons against a number, where on a comparison, full.
  add(OpType::Lt, {input(0, dtype), {Kind::Constant, 0, 0.1, DataType::Double}}, DataType::Bool);
  const int cond = static_cast<int>(p.instrs.size()) - 1;
  add(OpType::Where, {{Kind::Temp, cond, 0, DataType::Bool}, input(0, dtype), input(1, dtype)}, dtype);
  add(OpType::Where, {{Kind::Temp, cond, 0, DataType::Bool}, input(0, dtype), {Kind::Scalar, 0, 0, DataType::Double}},
      dtype == DataType::Bool ? DataType::Bool : dtype);
  add(OpType::Full, {{Kind::Constant, 0, 0.1, DataType::Double}}, dtype);
  return p;
}

// uniform and normal of a floating dtype, seeded by a runtime scalar and a constant offset.
PointwiseProgram randomProgram(DataType dtype) {
  PointwiseProgram p;
  p.num_scalars = 1;
  const PointwiseProgram::Operand seed{Kind::Scalar, 0, 0, DataType::Int}, offset{Kind::Constant, 0, 7, DataType::Int};
  for (OpType op : {OpType::Uniform, OpType::Normal}) {
    p.instrs.push_back(
        {op,
         {{Kind::Constant, 0, -1, DataType::Double}, {Kind::Constant, 0, 2, DataType::Double}, seed, offset},
         dtype});
    p.outputs.push_back(static_cast<int>(p.instrs.size()) - 1);
  }
  return p;
}

std::string compile(const std::string& source) { return cuda::compileToCubin(source, "test_kernel", "sm_90"); }

class PointwiseCodegen : public ::testing::TestWithParam<DataType> {};

TEST_P(PointwiseCodegen, EveryOpCompilesInEveryVariant) {
  const PointwiseProgram prog = allOpsProgram(GetParam());
  PointwiseVariant vec;
  vec.contiguous = true;
  vec.vector_width = static_cast<int>(16 / dataTypeSize(GetParam()));
  PointwiseVariant flat;
  flat.contiguous = true;
  flat.vector_width = 1;
  PointwiseVariant strided32;
  strided32.contiguous = false;
  strided32.ndim = 3;
  strided32.index32 = true;
  PointwiseVariant strided64 = strided32;
  strided64.index32 = false;
  for (const PointwiseVariant& v : {vec, flat, strided32, strided64}) {
    const std::string src = cuda::generatePointwiseSource(prog, v, "k");
    SCOPED_TRACE(toString(GetParam()) + " variant " + v.key());
    std::string cubin;
    ASSERT_NO_THROW(cubin = compile(src)) << src;
    EXPECT_GT(cubin.size(), 1000u);
    // The vectorized variant reads and writes whole 16-byte (or narrower) packs.
    EXPECT_EQ(src.find("Pack<" + cuda::storageType(GetParam()) + ", " + std::to_string(v.vector_width) + ">") !=
                  std::string::npos,
              v.contiguous && v.vector_width > 1);
  }
}

TEST(PointwiseCodegenRandom, UniformAndNormalCompileInEveryVariant) {
  for (DataType dt : {DataType::Float, DataType::Double, DataType::Half, DataType::BFloat16}) {
    const PointwiseProgram prog = randomProgram(dt);
    EXPECT_EQ(prog.numRandom(), 2);
    std::vector<PointwiseVariant> variants;
    for (int width : {1, 2, 4, 8}) {
      PointwiseVariant vec;
      vec.vector_width = width;
      variants.push_back(vec);
    }
    for (bool index32 : {false, true}) {
      PointwiseVariant strided;
      strided.contiguous = false;
      strided.ndim = 2;
      strided.index32 = index32;
      variants.push_back(strided);
    }
    for (const PointwiseVariant& v : variants) {
      SCOPED_TRACE(toString(dt) + " " + v.key());
      const std::string src = cuda::generatePointwiseSource(prog, v, "rng");
      EXPECT_NE(src.find(dt == DataType::Double ? "philoxUniformD" : "philoxUniformF"), std::string::npos);
      EXPECT_NE(src.find("rand_base"), std::string::npos);
      EXPECT_EQ(src.find("rand_st") != std::string::npos, !v.contiguous);
      // A thread takes whole counters: at least 4 elements (runtime/philox.h: 4 a counter at most).
      const int unit = cuda::pointwiseElementsPerThread(prog, v);
      EXPECT_EQ(unit, v.contiguous ? std::max(4, v.vector_width) : 4);
      // Contiguous: the unit's counters drawn once each, before its elements (a Float uniform's
      // unit of 4 needs 1 counter; a Double normal's 4).
      if (v.contiguous) EXPECT_NE(src.find("philox4x32(static_cast<u64>(u) * "), std::string::npos);
      // The parameter block: 1 (no input) + 2 outputs + 1 scalar + n + 2 bases (+ strided arrays).
      EXPECT_EQ(cuda::pointwiseParamWords(prog, v), v.contiguous ? 7u : 7u + 2u * (1 + 1 + 2 + 2));
      EXPECT_NO_THROW(compile(src)) << src;
    }
  }
}

// A draw fused with a tensor input (a dropout mask applied): packs of the input around the unit's
// counters; and a random op whose seed is a tensor is refused (the draw happens outside the chain).
TEST(PointwiseCodegenRandom, DrawFusedWithATensorInputCompiles) {
  PointwiseProgram p;
  p.inputs = {DataType::Half};
  p.num_scalars = 1;
  const PointwiseProgram::Operand seed{Kind::Scalar, 0, 0, DataType::Int}, offset{Kind::Constant, 0, 3, DataType::Int};
  p.instrs.push_back(
      {OpType::Uniform,
       {{Kind::Constant, 0, 0, DataType::Double}, {Kind::Constant, 0, 1, DataType::Double}, seed, offset},
       DataType::Float});
  p.instrs.push_back(
      {OpType::Ge, {{Kind::Temp, 0, 0, DataType::Float}, {Kind::Constant, 0, 0.1, DataType::Double}}, DataType::Bool});
  p.instrs.push_back({OpType::Mul, {input(0, DataType::Half), {Kind::Temp, 1, 0, DataType::Bool}}, DataType::Half});
  p.outputs = {2};
  for (int width : {1, 8}) {
    PointwiseVariant v;
    v.vector_width = width;
    EXPECT_NO_THROW(compile(cuda::generatePointwiseSource(p, v, "masked"))) << width;
  }
  PointwiseVariant strided;
  strided.contiguous = false;
  strided.ndim = 3;
  EXPECT_NO_THROW(compile(cuda::generatePointwiseSource(p, strided, "masked")));
  p.instrs[0].args[2] = input(0, DataType::Half);
  EXPECT_THROW(cuda::generatePointwiseSource(p, strided, "bad"), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, PointwiseCodegen, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return toString(info.param); });

TEST(PointwiseCodegenCasts, EveryPairCompiles) {
  for (DataType from : kAllTypes) {
    PointwiseProgram p;
    p.inputs = {from};
    for (DataType to : kAllTypes) {
      p.instrs.push_back({OpType::Cast, {input(0, from)}, to});
      p.outputs.push_back(static_cast<int>(p.instrs.size()) - 1);
    }
    PointwiseVariant v;
    v.vector_width = 2;
    SCOPED_TRACE("cast from " + toString(from));
    EXPECT_NO_THROW(compile(cuda::generatePointwiseSource(p, v, "cast_kernel")));
  }
}

TEST(PointwiseCodegenChain, FusedChainKeepsIntermediatesInRegisters) {
  // gelu(x * w + b) -> half: one kernel, one store per element, the temps are locals.
  PointwiseProgram p;
  p.inputs = {DataType::Half, DataType::Half, DataType::Half};
  p.instrs.push_back({OpType::Mul, {input(0, DataType::Half), input(1, DataType::Half)}, DataType::Half});
  p.instrs.push_back({OpType::Add, {{Kind::Temp, 0, 0, DataType::Half}, input(2, DataType::Half)}, DataType::Half});
  p.instrs.push_back({OpType::Gelu, {{Kind::Temp, 1, 0, DataType::Half}}, DataType::Half});
  p.outputs = {2};
  PointwiseVariant v;
  v.vector_width = 8;
  const std::string src = cuda::generatePointwiseSource(p, v, "chain");
  EXPECT_NE(src.find("erff"), std::string::npos) << "gelu must use the exact erf form";
  EXPECT_EQ(src.find("p.out[1]"), std::string::npos) << "only the final value is stored";
  EXPECT_NO_THROW(compile(src));
}

TEST(PointwiseCodegenKeys, KeysSeparateStructureTypesAndVariants) {
  PointwiseProgram a = allOpsProgram(DataType::Float), b = allOpsProgram(DataType::Half);
  EXPECT_NE(a.key(), b.key());
  PointwiseProgram c = a;
  c.instrs[0].op = OpType::Abs;
  EXPECT_NE(a.key(), c.key());
  EXPECT_EQ(a.key(), allOpsProgram(DataType::Float).key());
  PointwiseVariant v1, v2;
  v2.vector_width = 4;
  EXPECT_NE(v1.key(), v2.key());
}

// The compiled-kernel cache is keyed by PointwiseProgram::key(): an operand's own dtype changes the
// code (a comparison of an Int tensor with a Double runtime scalar compares in double, with an Int
// one in integers), so two programs differing only there must not share a kernel: x = 2 < s = 2.5
// computed by the integer kernel truncates s and gives false.
TEST(PointwiseCodegenKeys, KeyNamesOperandDtypes) {
  auto compare = [](Kind kind, DataType operand) {
    PointwiseProgram p;
    p.inputs = {DataType::Int};
    p.num_scalars = kind == Kind::Scalar ? 1 : 0;
    p.instrs.push_back({OpType::Lt, {input(0, DataType::Int), {kind, 0, 2, operand}}, DataType::Bool});
    p.outputs = {0};
    return p;
  };
  for (Kind kind : {Kind::Scalar, Kind::Constant}) {
    const PointwiseProgram a = compare(kind, DataType::Int), b = compare(kind, DataType::Double);
    ASSERT_NE(cuda::generatePointwiseSource(a, {}, "k"), cuda::generatePointwiseSource(b, {}, "k"))
        << "the operand's dtype picks the comparison type";
    EXPECT_NE(a.key(), b.key());
  }
  // A Bool tensor against an Int scalar compares in Int, against a Bool one in Bool.
  PointwiseProgram c = compare(Kind::Scalar, DataType::Int), d = c;
  c.inputs[0] = d.inputs[0] = DataType::Bool;
  c.instrs[0].args[0].dtype = d.instrs[0].args[0].dtype = DataType::Bool;
  d.instrs[0].args[1].dtype = DataType::Bool;
  ASSERT_NE(cuda::generatePointwiseSource(c, {}, "k"), cuda::generatePointwiseSource(d, {}, "k"));
  EXPECT_NE(c.key(), d.key());
}

TEST(PointwiseCodegenErrors, MalformedProgramsAreRejected) {
  PointwiseProgram p;
  p.inputs = {DataType::Float};
  p.instrs.push_back({OpType::Add, {input(0, DataType::Float)}, DataType::Float});  // one operand for a binary op
  p.outputs = {0};
  EXPECT_THROW(cuda::generatePointwiseSource(p, {}, "k"), std::invalid_argument);
  PointwiseProgram q;
  q.inputs = {DataType::Float};
  q.instrs.push_back({OpType::Sum, {input(0, DataType::Float)}, DataType::Float});  // not pointwise
  q.outputs = {0};
  EXPECT_THROW(cuda::generatePointwiseSource(q, {}, "k"), std::invalid_argument);
  PointwiseProgram r;
  r.inputs = {DataType::Float};
  r.instrs.push_back({OpType::Neg, {{Kind::Temp, 0, 0, DataType::Float}}, DataType::Float});  // uses itself
  r.outputs = {0};
  EXPECT_THROW(cuda::generatePointwiseSource(r, {}, "k"), std::invalid_argument);
}

TEST(ReductionCodegen, EveryReductionCompilesInBothModes) {
  for (OpType op : {OpType::Sum, OpType::ReduceMax, OpType::Mean}) {
    for (DataType in : kAllTypes) {
      Fusion f;
      TensorView* x = f.newTensor(in, {4, 4});
      const DataType out = ops::resultType(op, {x}, {});
      for (bool row : {true, false}) {
        cuda::ReductionVariant v;
        v.row = row;
        v.kept_ndim = row ? 1 : 2;
        v.reduced_ndim = row ? 2 : 1;
        SCOPED_TRACE(toString(op) + " " + toString(in) + "->" + toString(out) + (row ? " row" : " column"));
        EXPECT_NO_THROW(compile(cuda::generateReductionSource(op, in, out, v, "reduce")));
      }
      if (!isFloatingPoint(in) || !isFloatingPoint(out)) continue;
      cuda::ColumnReductionVariant c;
      c.vec = static_cast<int>(16 / dataTypeSize(in));
      SCOPED_TRACE(toString(op) + " " + toString(in) + "->" + toString(out) + " vectorized column");
      EXPECT_NO_THROW(compile(cuda::generateColumnReductionSource(op, in, out, c, "reduce")));
    }
  }
}

// A normalization segment of `norm` on CPU tensors of its shapes (only shapes, strides and dtypes
// matter to the scheduler's choices); `transpose_x`: the first input arrives transposed in memory.
struct NormSegment {
  Fusion fusion;
  Segment seg;
  ShapeMap shapes;
  ValueMap values;
  std::vector<Tensor> outputs;
  using Define = std::function<std::vector<TensorView*>(Fusion&, const testing_norms::InputFn&)>;
  NormSegment(testing_norms::Norm norm, DataType dt, int64_t rows, int64_t row, bool transpose_x = false)
      : NormSegment(
            [&](Fusion& f, const testing_norms::InputFn& input) {
              return testing_norms::defineNorm(norm, f, dt, rows, row, input);
            },
            transpose_x) {}
  explicit NormSegment(const Define& define, bool transpose_x = false) {
    auto add_input = [&](DataType d, std::vector<int64_t> shape, double, double) {
      TensorView* tv = fusion.newTensor(d, shape);
      fusion.addInput(tv);
      Tensor t = Tensor::empty(shape, d);
      if (transpose_x && values.tensors.empty() && shape.size() == 2)
        t = Tensor::empty({shape[1], shape[0]}, d).permute({1, 0});
      values.tensors[tv] = t;
      seg.inputs.push_back(tv);
      return tv;
    };
    seg.kind = Segment::Kind::Normalization;
    seg.outputs = define(fusion, add_input);
    for (const auto& e : fusion.exprs()) seg.exprs.push_back(e.get());
    for (const auto& v : fusion.vals())
      if (v->isTensor()) shapes[v.get()] = static_cast<TensorView*>(v.get())->shape();
    for (TensorView* out : seg.outputs) outputs.push_back(Tensor::empty(shapes.at(out), out->dtype()));
  }
};

// A launch prepared for one run, kept without its tensors and bound to another run's (the CUDA
// executor's KeptPlans), is the launch prepared for that run: the same program, strides, shape and
// scalars, reading and writing the new tensors.
TEST(NormalizationCodegen, AKeptLaunchReboundIsTheLaunchPreparedForTheNewTensors) {
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    NormSegment first(norm, DataType::BFloat16, 48, 1024), second(norm, DataType::BFloat16, 48, 1024);
    // The second run's tensors, under the first segment's values (the same segment run again).
    ValueMap values;
    for (size_t i = 0; i < first.seg.inputs.size(); ++i)
      values.tensors[first.seg.inputs[i]] = second.values.tensor(second.seg.inputs[i]);
    auto kept = cuda::prepareNormalization(first.seg, first.shapes, first.values, first.outputs);
    auto fresh = cuda::prepareNormalization(first.seg, first.shapes, values, second.outputs);
    ASSERT_TRUE(kept.has_value() && fresh.has_value()) << testing_norms::toString(norm);
    for (Tensor& t : kept->loads) t = Tensor();
    for (Tensor& t : kept->stores) t = Tensor();
    cuda::rebindNormalization(*kept, values, second.outputs);
    EXPECT_EQ(kept->program.key(), fresh->program.key());
    EXPECT_EQ(kept->strides, fresh->strides);
    EXPECT_EQ(kept->scalars, fresh->scalars);
    EXPECT_EQ(kept->rows, fresh->rows);
    ASSERT_EQ(kept->loads.size(), fresh->loads.size());
    ASSERT_FALSE(kept->loads.empty());
    for (size_t i = 0; i < kept->loads.size(); ++i) EXPECT_EQ(kept->loads[i].data(), fresh->loads[i].data());
    ASSERT_EQ(kept->stores.size(), second.outputs.size());
    for (size_t i = 0; i < kept->stores.size(); ++i) EXPECT_EQ(kept->stores[i].data(), second.outputs[i].data());
    EXPECT_NE(kept->loads.front().data(), first.values.tensor(first.seg.inputs.front()).data());
  }
}

// The bf16 bias gradient (cast, sum over the rows, cast back): at the transformer's widest rows
// (3 and 4 x 12288 columns) the fused kernel cannot hold the row, so the scheduler refuses the
// segment (naming why) and the CUDA executor runs it as a pointwise kernel and the column
// reduction; at short rows it stays one persistent kernel.
TEST(NormalizationCodegen, BiasGradientVariantByRowLength) {
  for (const auto& [row_length, fused] :
       std::vector<std::pair<int64_t, bool>>{{300, true}, {36864, false}, {49152, false}}) {
    const int64_t row = row_length;  // clang before 16 (clang-tidy's parser) cannot capture a structured binding
    NormSegment ns([&](Fusion&, const testing_norms::InputFn& input) {
      TensorView* dy = input(DataType::BFloat16, {2048, row}, -1, 1);
      return std::vector<TensorView*>{
          ops::cast(ops::reduction(OpType::Sum, ops::cast(dy, DataType::Float), {0}, false), DataType::BFloat16)};
    });
    std::string why;
    auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs, &why);
    ASSERT_EQ(launch.has_value(), fused) << "row " << row << ": " << why;
    if (fused) {
      const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
      EXPECT_TRUE(v.items > 0 && !v.stream) << "row " << row << ": " << v.key();
    } else {
      EXPECT_NE(why.find("only outer reductions"), std::string::npos) << why;
    }
  }
}

// A row that one block holds (12288 bf16 columns, every norm) can also be split over a cluster of two
// blocks of half the threads, each holding the same share a thread: the variant runNormalization
// times against the unsplit one under MESHFUSE_NORM_AUTOTUNE=1; by default such rows stay whole
// (normalization.cpp).
TEST(NormalizationCodegen, RowsOneBlockHoldsCanSplitOverAClusterOfTwo) {
  for (testing_norms::Norm norm : testing_norms::kAllNorms) {
    NormSegment ns(norm, DataType::BFloat16, 2048, 12288);
    auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
    ASSERT_TRUE(launch.has_value()) << testing_norms::toString(norm);
    const cuda::NormalizationVariant one = cuda::chooseNormalizationVariant(*launch, true, 1);
    const cuda::NormalizationVariant two = cuda::chooseNormalizationVariant(*launch, true, 2);
    EXPECT_EQ(one.cluster, 1) << one.key();
    EXPECT_EQ(two.cluster, 2) << two.key();
    EXPECT_TRUE(one.items > 0 && !one.stream && two.items == one.items && !two.stream) << one.key() << " " << two.key();
    EXPECT_EQ(two.threads_x * 2, one.threads_x) << one.key() << " " << two.key();
    EXPECT_FALSE(cuda::splitsByDefault(one, two)) << "held rows stay whole unless timed";
    // Without clusters (before sm_90) there is no split.
    EXPECT_EQ(cuda::chooseNormalizationVariant(*launch, false, 2).cluster, 1);
  }
}

// The layer's residual LayerNorm backward streams its row inputs by default at 12288 columns;
// with a split of two a cluster of two blocks holds them instead, which runNormalization runs by
// default (splitsByDefault; MESHFUSE_NORM_AUTOTUNE=1 times the two), and the kernel compiles.
TEST(NormalizationCodegen, StreamedRowsCanSplitOverAClusterOfTwoThatHoldsThem) {
  NormSegment ns([](Fusion& f, const testing_norms::InputFn& input) {
    return testing_norms::defineResidualLayerNormBackward(f, DataType::BFloat16, 2048, 12288, input);
  });
  auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
  ASSERT_TRUE(launch.has_value());
  const cuda::NormalizationVariant one = cuda::chooseNormalizationVariant(*launch, true, 1);
  const cuda::NormalizationVariant two = cuda::chooseNormalizationVariant(*launch, true, 2);
  EXPECT_TRUE(one.cluster == 1 && one.items > 0 && one.stream) << one.key();
  EXPECT_TRUE(two.cluster == 2 && two.items > 0 && !two.stream) << two.key();
  EXPECT_TRUE(cuda::splitsByDefault(one, two));
  EXPECT_FALSE(cuda::splitsByDefault(one, one)) << "no cluster to split over";
  EXPECT_EQ(cuda::chooseNormalizationVariant(*launch, false, 2).key(), one.key()) << "no clusters before sm_90";
  ASSERT_NO_THROW(compile(cuda::generateNormalizationSource(launch->program, two, "k")));
}

TEST(NormalizationCodegen, EveryNormCompilesAtShortLongAndTooLongRows) {
  using testing_norms::Norm;
  for (Norm norm : testing_norms::kAllNorms) {
    for (DataType dt : {DataType::BFloat16, DataType::Float}) {
      for (int64_t row : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{262144}}) {
        SCOPED_TRACE(testing_norms::toString(norm) + " " + toString(dt) + " row " + std::to_string(row));
        NormSegment ns(norm, dt, 3, row);
        std::string why;
        auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs, &why);
        ASSERT_TRUE(launch.has_value()) << why;
        // Without clusters (LongRowsSplitOverAClusterCompile covers them).
        const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch, false);
        EXPECT_EQ(v.items == 0, row == 262144)
            << v.key() << ": only rows past the registers take the multi-pass variant";
        if (row == 4096) EXPECT_EQ(v.vec, dt == DataType::BFloat16 ? 8 : 4) << "16-byte accesses";
        if (row < 8) EXPECT_EQ(v.vec, 1);
        EXPECT_EQ(launch->program.hasEpilogue(), norm == Norm::LayerNormBackward);
        const std::string src = cuda::generateNormalizationSource(launch->program, v, "norm_kernel");
        ASSERT_NO_THROW(compile(src)) << src;
        if (launch->program.hasEpilogue())
          ASSERT_NO_THROW(compile(cuda::generateNormalizationEpilogueSource(launch->program, "epi")));
      }
    }
  }
}

TEST(NormalizationCodegen, DoubleHalfAndTransposedInputsCompile) {
  using testing_norms::Norm;
  for (Norm norm : {Norm::LayerNorm, Norm::LayerNormBackward}) {
    for (DataType dt : {DataType::Double, DataType::Half}) {
      for (bool transpose : {false, true}) {
        SCOPED_TRACE(testing_norms::toString(norm) + " " + toString(dt) + (transpose ? " transposed" : ""));
        NormSegment ns(norm, dt, 64, 1000, transpose);
        auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
        ASSERT_TRUE(launch.has_value());
        EXPECT_EQ(launch->program.compute, dt == DataType::Double ? DataType::Double : DataType::Float);
        EXPECT_EQ(launch->program.loads[0].contiguous_row, !transpose);
        const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
        const std::string src = cuda::generateNormalizationSource(launch->program, v, "norm_kernel");
        EXPECT_EQ(src.find("columnOffset(p, 0,") != std::string::npos, transpose) << "strided rows index per element";
        ASSERT_NO_THROW(compile(src)) << src;
      }
    }
  }
}

TEST(NormalizationCodegen, VariantFollowsShapeAndKeysSeparateThem) {
  using testing_norms::Norm;
  NormSegment wide(Norm::LayerNorm, DataType::BFloat16, 8, 12288), narrow(Norm::LayerNorm, DataType::BFloat16, 8, 64);
  auto a = cuda::prepareNormalization(wide.seg, wide.shapes, wide.values, wide.outputs);
  auto b = cuda::prepareNormalization(narrow.seg, narrow.shapes, narrow.values, narrow.outputs);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->program.key(), b->program.key()) << "the structure does not depend on sizes";
  const auto va = cuda::chooseNormalizationVariant(*a), vb = cuda::chooseNormalizationVariant(*b);
  EXPECT_NE(va.key(), vb.key());
  EXPECT_EQ(va.threads_y, 1);
  EXPECT_GE(va.threads_x * va.items * va.vec, 12288);
  EXPECT_GT(vb.threads_y, 1) << "short rows share a block";
  EXPECT_EQ(vb.threads_x * vb.threads_y % 32, 0);
}

TEST(NormalizationCodegen, EveryNormCompilesInDoubleAndHalf) {
  using testing_norms::Norm;
  for (Norm norm : testing_norms::kAllNorms) {
    for (DataType dt : {DataType::Double, DataType::Half}) {
      for (int64_t row : {int64_t{7}, int64_t{4096}}) {
        SCOPED_TRACE(testing_norms::toString(norm) + " " + toString(dt) + " row " + std::to_string(row));
        NormSegment ns(norm, dt, 5, row);
        auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
        ASSERT_TRUE(launch.has_value());
        const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
        const std::string src = cuda::generateNormalizationSource(launch->program, v, "norm_kernel");
        ASSERT_NO_THROW(compile(src)) << src;
        if (launch->program.hasEpilogue())
          ASSERT_NO_THROW(compile(cuda::generateNormalizationEpilogueSource(launch->program, "epi")));
      }
    }
  }
}

// Softmax divides by one value per row: a reciprocal per row and a multiply per element; its
// exp is exp2 of a pre-scaled argument in fp32 (the CUDA executor tests check the accuracy).
TEST(NormalizationCodegen, SoftmaxMultipliesByTheRowReciprocal) {
  NormSegment ns(testing_norms::Norm::Softmax, DataType::BFloat16, 16, 12288);
  auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
  ASSERT_TRUE(launch.has_value());
  const std::string src =
      cuda::generateNormalizationSource(launch->program, cuda::chooseNormalizationVariant(*launch), "k");
  EXPECT_NE(src.find("= a * inv"), std::string::npos) << src;
  EXPECT_EQ(src.find("a / b"), std::string::npos) << src;
  EXPECT_NE(src.find("exp2f("), std::string::npos) << src;
}

int occurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

// One barrier per block-wide reduction: LayerNorm's two levels (mean, variance) take two per row,
// RMSNorm's one level one (its buffer alternates between row groups).
TEST(NormalizationCodegen, OneBarrierPerBlockReduction) {
  using testing_norms::Norm;
  for (auto [norm, barriers] : {std::pair{Norm::LayerNorm, 2}, std::pair{Norm::RmsNorm, 1}}) {
    NormSegment ns(norm, DataType::BFloat16, 16, 12288);
    auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
    ASSERT_TRUE(launch.has_value());
    const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
    ASSERT_GT(v.threads_x, 32);
    const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
    EXPECT_EQ(occurrences(src, "__syncthreads()"), barriers) << testing_norms::toString(norm);
  }
}

// Persistent kernels prefetch the next row group's contiguous rows into L2, one hint per chunk of
// each register-held input (not the per-column weights, which stay in L1/L2 anyway).
TEST(NormalizationCodegen, PersistentKernelsPrefetchTheNextRowGroup) {
  using testing_norms::Norm;
  for (auto [norm, inputs] : {std::pair{Norm::LayerNorm, 1}, std::pair{Norm::LayerNormBackward, 2}}) {
    NormSegment ns(norm, DataType::BFloat16, 16, 12288);
    auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
    ASSERT_TRUE(launch.has_value());
    cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
    ASSERT_TRUE(v.prefetch && v.items > 0) << v.key();
    const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
    EXPECT_EQ(occurrences(src, "prefetch.global.L2"), inputs) << testing_norms::toString(norm);
    ASSERT_NO_THROW(compile(src)) << src;
    v.prefetch = false;
    EXPECT_EQ(cuda::generateNormalizationSource(launch->program, v, "k").find("prefetch"), std::string::npos);
  }
}

// Every tuning of the persistent variant compiles for every norm: expensive values recomputed, the
// optimization fence off and on, a minimum of blocks per multiprocessor. A row the chunks cover
// exactly has no bounds check; vector chunks check once per chunk, not per element.
TEST(NormalizationCodegen, EveryTuningCompiles) {
  using testing_norms::Norm;
  for (Norm norm : testing_norms::kAllNorms) {
    for (DataType dt : {DataType::BFloat16, DataType::Float}) {
      for (int64_t row : {int64_t{7}, int64_t{4000}, int64_t{12288}}) {
        SCOPED_TRACE(testing_norms::toString(norm) + " " + toString(dt) + " row " + std::to_string(row));
        NormSegment ns(norm, dt, 5, row);
        auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
        ASSERT_TRUE(launch.has_value());
        const cuda::NormalizationVariant base = cuda::chooseNormalizationVariant(*launch);
        ASSERT_GT(base.items, 0) << base.key();
        EXPECT_EQ(base.exact, base.cluster * base.threads_x * base.items * base.vec == row) << base.key();
        for (int tuning = 0; tuning < 3; ++tuning) {
          cuda::NormalizationVariant v = base;
          v.recompute = tuning == 0;
          v.fence = tuning != 1;
          v.min_blocks = tuning == 2 ? 2 : 0;
          const std::string src = cuda::generateNormalizationSource(launch->program, v, "norm_kernel");
          EXPECT_EQ(src.find("&& j0 < n;") == std::string::npos, v.exact) << v.key();
          EXPECT_EQ(src.find("const bool ok = row_ok && j < n;") == std::string::npos, v.vec > 1) << v.key();
          if (norm == Norm::Softmax && dt != DataType::Float && row == 12288)
            EXPECT_EQ(std::regex_search(src, std::regex(R"(T E[0-9]+\[EPT\])")), !v.recompute)
                << "exp is held in registers between passes unless recomputed";
          ASSERT_NO_THROW(compile(src)) << src;
        }
      }
    }
  }
}

// The cast back to bf16 at the end of a norm is one conversion at the store, not a round trip
// through bf16 and a second conversion; LayerNorm's second and third passes start behind the
// optimization fence (NormalizationVariant::fence) on its register-held input.
TEST(NormalizationCodegen, StoreConvertsOnceAndLaterPassesAreFenced) {
  NormSegment ns(testing_norms::Norm::LayerNorm, DataType::BFloat16, 16, 12288);
  auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
  ASSERT_TRUE(launch.has_value());
  const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
  ASSERT_TRUE(v.fence && v.exact) << v.key();
  const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
  EXPECT_TRUE(std::regex_search(src, std::regex(R"(\.v\[k\] = __float2bfloat16_rn\(e[0-9]+_exact\))"))) << src;
  EXPECT_EQ(occurrences(src, "asm volatile(\"\" : \"+f\"(X0[e]))"), 2) << src;
}

// Rows past one block's registers split over a cluster of blocks when clusters are allowed (one
// kernel holding the row in registers, its reductions through distributed shared memory); else
// the multi-pass variant takes them, as before.
TEST(NormalizationCodegen, LongRowsSplitOverAClusterCompile) {
  using testing_norms::Norm;
  for (Norm norm : testing_norms::kAllNorms) {
    for (DataType dt : {DataType::BFloat16, DataType::Float, DataType::Double}) {
      for (int64_t row : {int64_t{262144}, int64_t{100000}}) {
        SCOPED_TRACE(testing_norms::toString(norm) + " " + toString(dt) + " row " + std::to_string(row));
        NormSegment ns(norm, dt, 3, row);
        auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
        ASSERT_TRUE(launch.has_value());
        EXPECT_EQ(cuda::chooseNormalizationVariant(*launch, false).cluster, 1);
        const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch, true);
        // The backward's five arrays fit a cluster at 100000 columns only when streamed, and at 262144
        // not even then (two outer accumulators of 32 columns a thread at 1024 threads): multi-pass.
        if (norm == Norm::LayerNormBackward && dt != DataType::Double) {
          EXPECT_EQ(v.cluster > 1 && v.stream, row == 100000) << v.key();
          EXPECT_EQ(v.items == 0, row == 262144) << v.key();
        }
        if (norm != Norm::LayerNormBackward && dt != DataType::Double) {
          EXPECT_GT(v.cluster, 1) << v.key();
          EXPECT_GT(v.items, 0) << v.key();
          EXPECT_GE(int64_t{v.cluster} * v.threads_x * v.items * v.vec, row) << v.key();
          EXPECT_EQ(v.exact, int64_t{v.cluster} * v.threads_x * v.items * v.vec == row) << v.key();
        }
        const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
        EXPECT_EQ(src.find("barrier.cluster.arrive") != std::string::npos, v.cluster > 1) << v.key();
        EXPECT_EQ(src.find("mapa.shared::cluster") != std::string::npos, v.cluster > 1) << v.key();
        ASSERT_NO_THROW(compile(src)) << src;
      }
    }
  }
}

// The compiled-kernel cache is keyed by NormalizationVariant::key(): every field that changes the
// generated code must change the key. (The cluster size and the exact-cover flag once did not: a
// kernel compiled for an 8-block cluster ran under a 2-block launch and read shared memory of
// blocks outside its cluster, and an exact kernel, with no column checks, could run on a shorter row.)
TEST(NormalizationCodegen, VariantKeyNamesEverythingTheCodeDependsOn) {
  cuda::NormalizationVariant base;
  base.vec = 4;
  base.threads_x = 256;
  base.items = 2;
  std::vector<cuda::NormalizationVariant> changed(9, base);
  changed[0].vec = 8;
  changed[1].threads_x = 512;
  changed[2].threads_y = 2;
  changed[3].items = 3;
  changed[4].stream = true;
  changed[5].prefetch = true;
  changed[6].recompute = true;
  changed[7].exact = true;
  changed[8].cluster = 2;
  std::set<std::string> keys = {base.key()};
  for (const auto& v : changed) EXPECT_TRUE(keys.insert(v.key()).second) << v.key();
  cuda::NormalizationVariant fenced = base, bounded = base;
  fenced.fence = true;
  bounded.min_blocks = 2;
  EXPECT_NE(fenced.key(), base.key());
  EXPECT_NE(bounded.key(), base.key());
  // The same norm at a row its chunks cover and a slightly shorter one picks different kernels.
  using testing_norms::Norm;
  NormSegment covered(Norm::LayerNorm, DataType::BFloat16, 3, 4096),
      shorter(Norm::LayerNorm, DataType::BFloat16, 3, 4088);
  auto lc = cuda::prepareNormalization(covered.seg, covered.shapes, covered.values, covered.outputs);
  auto ls = cuda::prepareNormalization(shorter.seg, shorter.shapes, shorter.values, shorter.outputs);
  ASSERT_TRUE(lc.has_value() && ls.has_value());
  const auto vc = cuda::chooseNormalizationVariant(*lc, false), vs = cuda::chooseNormalizationVariant(*ls, false);
  EXPECT_NE(vc.exact, vs.exact) << vc.key() << " " << vs.key();
  EXPECT_NE(vc.key(), vs.key());
}

// A backward-like segment reading more inputs than registers hold (six rows plus two outer
// accumulators): the persistent variant streams the inputs rather than falling to multi-pass.
TEST(NormalizationCodegen, ManyInputsStreamInsteadOfMultiPass) {
  for (DataType dt : {DataType::BFloat16, DataType::Float, DataType::Double}) {
    for (int64_t row : {int64_t{7}, int64_t{4097}, int64_t{12288}}) {
      SCOPED_TRACE(toString(dt) + " row " + std::to_string(row));
      NormSegment ns([&](Fusion& f, const testing_norms::InputFn& input) {
        const std::vector<int64_t> full = {6, row};
        TensorView* s = nullptr;
        for (int i = 0; i < 6; ++i) {
          TensorView* x = ops::cast(input(dt, full, -1, 1), dt == DataType::Double ? dt : DataType::Float);
          s = s ? ops::binary(OpType::Add, s, x) : x;
        }
        TensorView* mean = ops::broadcastInDim(ops::reduction(OpType::Mean, s, {1}, false), full, {0});
        TensorView* y = ops::binary(OpType::Sub, s, mean);
        return std::vector<TensorView*>{ops::cast(y, dt), ops::reduction(OpType::Sum, s, {0}, false),
                                        ops::reduction(OpType::Sum, ops::binary(OpType::Mul, y, s), {0}, false)};
      });
      auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
      ASSERT_TRUE(launch.has_value());
      const cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
      if (row == 12288 && dt != DataType::Double) {  // doubles take twice the registers: multi-pass
        EXPECT_TRUE(v.stream) << v.key();
        EXPECT_GT(v.items, 0) << v.key();
      }
      const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
      ASSERT_NO_THROW(compile(src)) << src;
      ASSERT_NO_THROW(compile(cuda::generateNormalizationEpilogueSource(launch->program, "epi")));
    }
  }
}

// The streaming variant of every norm (forced) compiles, with and without vector accesses.
TEST(NormalizationCodegen, StreamingVariantOfEveryNormCompiles) {
  using testing_norms::Norm;
  for (Norm norm : testing_norms::kAllNorms) {
    for (int64_t row : {int64_t{7}, int64_t{4096}}) {
      SCOPED_TRACE(testing_norms::toString(norm) + " row " + std::to_string(row));
      NormSegment ns(norm, DataType::BFloat16, 5, row, /*transpose_x=*/row == 7);
      auto launch = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
      ASSERT_TRUE(launch.has_value());
      cuda::NormalizationVariant v = cuda::chooseNormalizationVariant(*launch);
      ASSERT_GT(v.items, 0);
      v.stream = true;
      const std::string src = cuda::generateNormalizationSource(launch->program, v, "k");
      EXPECT_EQ(src.find("T X0[EPT]"), std::string::npos) << "streamed inputs are not held";
      ASSERT_NO_THROW(compile(src)) << src;
    }
  }
}

// The executor prepares a segment on every execution; the memoized plan follows the shapes.
TEST(NormalizationCodegen, PreparedSegmentFollowsItsShapes) {
  NormSegment ns(testing_norms::Norm::RmsNorm, DataType::BFloat16, 8, 256);
  auto a = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
  auto b = cuda::prepareNormalization(ns.seg, ns.shapes, ns.values, ns.outputs);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->program.key(), b->program.key());
  EXPECT_EQ(a->rows, 8);
  // The same exprs at other local shapes (a smaller shard, say).
  ShapeMap shapes = ns.shapes;
  ValueMap values = ns.values;
  std::vector<Tensor> outputs;
  for (auto& [v, shape] : shapes)
    if (!shape.empty() && shape[0] == 8) shape[0] = 4;
  for (auto& [v, t] : values.tensors) t = Tensor::empty(shapes.at(v), t.dtype());
  for (TensorView* out : ns.seg.outputs) outputs.push_back(Tensor::empty(shapes.at(out), out->dtype()));
  auto c = cuda::prepareNormalization(ns.seg, shapes, values, outputs);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->rows, 4);
  EXPECT_EQ(c->program.key(), a->program.key());
  // Another structure keys differently.
  NormSegment other(testing_norms::Norm::LayerNorm, DataType::BFloat16, 8, 256);
  auto d = cuda::prepareNormalization(other.seg, other.shapes, other.values, other.outputs);
  ASSERT_TRUE(d.has_value());
  EXPECT_NE(d->program.key(), a->program.key());
}

// MESHFUSE_DUMP_KERNELS=<dir>: each compilation leaves its source and its cubin there.
TEST(NvrtcDump, SourceAndCubinAreWritten) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "meshfuse_dump_test";
  std::filesystem::remove_all(dir);
  ::setenv("MESHFUSE_DUMP_KERNELS", dir.c_str(), 1);
  const std::string source = "extern \"C\" __global__ void dumped(float* x) { x[threadIdx.x] *= 2.0f; }\n";
  const std::string cubin = cuda::compileToCubin(source, "dumped", "sm_90");
  ::unsetenv("MESHFUSE_DUMP_KERNELS");
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 2u);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files[0].extension(), ".cu");
  EXPECT_EQ(files[1].extension(), ".cubin");
  EXPECT_NE(files[0].filename().string().find("-dumped"), std::string::npos) << files[0];
  std::ifstream cu(files[0]), bin(files[1], std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(cu), {}), source);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(bin), {}), cubin);
  std::filesystem::remove_all(dir);
}

TEST(NvrtcErrors, CompileErrorsCarryTheLog) {
  try {
    compile("extern \"C\" __global__ void broken() { undefined_thing(); }");
    FAIL() << "expected a compile error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("undefined_thing"), std::string::npos) << e.what();
  }
}

// The attention dropout mask's kernel (runtime/cuda/dropout_mask.cpp) is built around the pointwise
// generator's Philox source: it must compile with it.
TEST(DropoutMaskCodegen, CompilesForSm90) {
  const std::string cubin = cuda::compileToCubin(cuda::dropoutMaskSource(), "dropout_mask", "sm_90");
  EXPECT_FALSE(cubin.empty());
}

// An exact mask (MESHFUSE_ATTENTION_MASK=exact) holds the keep scale 1 / (1 - p): in the io dtype
// where that dtype holds it exactly, else in fp32 (so CUDA scales by the very float the CPU kernel
// does). A narrow one is in the io dtype whatever p is; narrow is the default.
TEST(DropoutMaskCodegen, MaskDtypeFollowsTheWidth) {
  using cuda::MaskWidth;
  EXPECT_EQ(cuda::dropoutMaskDataType(0.2, DataType::BFloat16, MaskWidth::Exact), DataType::BFloat16);  // 1.25
  EXPECT_EQ(cuda::dropoutMaskDataType(0.5, DataType::BFloat16, MaskWidth::Exact), DataType::BFloat16);  // 2
  EXPECT_EQ(cuda::dropoutMaskDataType(0.75, DataType::Half, MaskWidth::Exact), DataType::Half);         // 4
  EXPECT_EQ(cuda::dropoutMaskDataType(0.1, DataType::BFloat16, MaskWidth::Exact), DataType::Float);     // 1.111...
  EXPECT_EQ(cuda::dropoutMaskDataType(0.1, DataType::Half, MaskWidth::Exact), DataType::Float);
  EXPECT_EQ(cuda::dropoutMaskDataType(0.25, DataType::BFloat16, MaskWidth::Exact), DataType::Float);  // 1.333...
  EXPECT_EQ(cuda::dropoutMaskDataType(0.1, DataType::BFloat16, MaskWidth::Narrow), DataType::BFloat16);
  EXPECT_EQ(cuda::dropoutMaskDataType(0.1, DataType::BFloat16),
            cuda::dropoutMaskDataType(0.1, DataType::BFloat16, cuda::maskWidthFromEnvironment()));
  const char* env = std::getenv("MESHFUSE_ATTENTION_MASK");
  if (env == nullptr) EXPECT_EQ(cuda::maskWidthFromEnvironment(), MaskWidth::Narrow);
}

// `call` throws a UserError whose message holds every phrase of `phrases` (`what`: the input, for the
// failure message if it is accepted).
void expectUserErrorSaying(const std::function<void()>& call, const std::vector<std::string>& phrases,
                           const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << " was accepted";
  } catch (const UserError& e) {
    for (const std::string& phrase : phrases)
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

// MESHFUSE_ATTENTION_RNG: cuDNN's in-kernel generator by default (unset or empty), meshfuse's Philox
// mask when asked for, and any other value an error naming both.
TEST(AttentionRng, TheEnvironmentPicksWhoDrawsTheMask) {
  using cuda::AttentionRng;
  {
    const testing::ScopedEnv rng("MESHFUSE_ATTENTION_RNG", "");
    EXPECT_EQ(cuda::attentionRngFromEnvironment(), AttentionRng::Cudnn);
  }
  for (const auto& [value, expected] : std::vector<std::pair<std::string, AttentionRng>>{
           {"meshfuse", AttentionRng::Meshfuse}, {"cudnn", AttentionRng::Cudnn}}) {
    const testing::ScopedEnv rng("MESHFUSE_ATTENTION_RNG", value);
    EXPECT_EQ(cuda::attentionRngFromEnvironment(), expected) << value;
  }
  const testing::ScopedEnv rng("MESHFUSE_ATTENTION_RNG", "curand");
  expectUserErrorSaying([] { cuda::attentionRngFromEnvironment(); }, {"meshfuse", "cudnn"},
                        "MESHFUSE_ATTENTION_RNG=curand");
}

// cuDNN's generator draws by local position, so each shard of the heads (or of the batch) is given a
// seed of its own: the whole tensor and the first shard keep the op's seed, every other shard's key is
// its first global (batch, head) index and its seed a mix that differs between shards and seeds.
TEST(AttentionRng, EveryShardButTheFirstGetsASeedOfItsOwn) {
  AttentionParams whole;
  whole.batch = 2;
  whole.heads = whole.global_heads = 8;
  EXPECT_EQ(cuda::cudnnShardKey(whole), 0u);
  std::set<uint64_t> seeds;
  for (int64_t batch_offset : {0, 1})
    for (int64_t head_offset : {0, 4}) {
      AttentionParams shard = whole;
      shard.batch = 1;
      shard.heads = 4;
      shard.batch_offset = batch_offset;
      shard.head_offset = head_offset;
      shard.sharded = true;
      const uint64_t key = cuda::cudnnShardKey(shard);
      EXPECT_EQ(key, static_cast<uint64_t>(batch_offset * 8 + head_offset));
      seeds.insert(cuda::mixShardSeed(1234, key));
      EXPECT_NE(cuda::mixShardSeed(1234, key), cuda::mixShardSeed(1235, key)) << key;
    }
  EXPECT_EQ(seeds.size(), 4u);
  EXPECT_EQ(seeds.count(1234), 1u);  // the first shard's
  EXPECT_EQ(cuda::mixShardSeed(1234, 0), 1234u);
}

// The kernel that writes the philox words (the forward's outputs, a shard's words) compiles (it runs
// in test_cuda_dropout_mask.cpp).
TEST(AttentionRng, PhiloxWordsKernelCompiles) {
  EXPECT_FALSE(cuda::compileToCubin(cuda::philoxWordsSource(), "philox_words", "sm_90").empty());
}

// What the shard key above reads: an attention call is sharded when its global block holds more
// batch entries or heads than the call does; a block that is the whole tensor, or none, is not.
TEST(AttentionRng, ShardedIsReadFromTheGlobalBlock) {
  Fusion f;
  TensorView* q = f.newTensor(DataType::BFloat16, {2, 8, 16, 64});
  const ops::SdpaFwdResult r = ops::sdpfaFwd(q, q, q, nullptr, nullptr, nullptr);
  const Expr& e = *r.out->definition();
  const auto scalar = [](const Val* v) { return static_cast<const Scalar*>(v)->value().value_or(0.0); };
  const std::vector<int64_t> local{2, 4, 16, 64};
  GlobalBlock heads{{2, 8, 16, 64}, {0, 4, 0, 0}}, whole{{2, 4, 16, 64}, {0, 0, 0, 0}};
  EXPECT_TRUE(attentionParams(e, local, local, local, scalar, &heads).sharded);
  EXPECT_FALSE(attentionParams(e, local, local, local, scalar, &whole).sharded);
  EXPECT_FALSE(attentionParams(e, local, local, local, scalar, nullptr).sharded);
}

// The one-byte mask was withdrawn (cuDNN's backward applies it as all dropped: dropout_mask.h); a user
// who still sets it gets an error that says so, not wrong gradients.
TEST(DropoutMaskCodegen, TheWithdrawnByteWidthIsAClearError) {
  const testing::ScopedEnv width("MESHFUSE_ATTENTION_MASK", "byte");
  expectUserErrorSaying([] { cuda::maskWidthFromEnvironment(); }, {"withdrawn"}, "MESHFUSE_ATTENTION_MASK=byte");
  const testing::ScopedEnv other("MESHFUSE_ATTENTION_MASK", "wide");
  EXPECT_THROW(cuda::maskWidthFromEnvironment(), UserError);
  const testing::ScopedEnv exact("MESHFUSE_ATTENTION_MASK", "exact");
  EXPECT_EQ(cuda::maskWidthFromEnvironment(), cuda::MaskWidth::Exact);
}

// The backward's mask order: query-major unless MESHFUSE_ATTENTION_BACKWARD_MASK says key_major; a
// misspelt value is a clear error naming both.
TEST(DropoutMaskCodegen, BackwardMaskOrderFollowsTheEnvironment) {
  {
    const testing::ScopedEnv unset("MESHFUSE_ATTENTION_BACKWARD_MASK", "");  // empty: as if unset
    EXPECT_EQ(cuda::backwardMaskOrderFromEnvironment(), cuda::MaskOrder::QueryMajor);
  }
  const testing::ScopedEnv key("MESHFUSE_ATTENTION_BACKWARD_MASK", "key_major");
  EXPECT_EQ(cuda::backwardMaskOrderFromEnvironment(), cuda::MaskOrder::KeyMajor);
  const testing::ScopedEnv bad("MESHFUSE_ATTENTION_BACKWARD_MASK", "transposed");
  expectUserErrorSaying([] { cuda::backwardMaskOrderFromEnvironment(); }, {"key_major", "query_major"},
                        "MESHFUSE_ATTENTION_BACKWARD_MASK=transposed");
}

// The mask's value times cuDNN's dropout scale is the keep scale to float rounding: a narrow mask's
// rounded scale is corrected, an exact mask's not at all.
TEST(DropoutMaskCodegen, DropoutScaleCarriesWhatTheMaskDoesNot) {
  for (DataType io : {DataType::BFloat16, DataType::Half}) {
    for (double p : {0.1, 0.2, 0.25, 0.5}) {
      const DataType dtype = cuda::dropoutMaskDataType(p, io, cuda::MaskWidth::Narrow);
      EXPECT_EQ(dtype, io);
      const float correction = cuda::dropoutScaleCorrection(p, dtype);
      const float rounded = dtype == DataType::BFloat16 ? bf16ToFloat(floatToBf16(static_cast<float>(1 / (1 - p))))
                                                        : halfToFloat(floatToHalf(static_cast<float>(1 / (1 - p))));
      EXPECT_NEAR(rounded * correction, 1 / (1 - p), 1e-6) << toString(io) << " p " << p;
      EXPECT_LT(std::abs(correction - 1), io == DataType::BFloat16 ? 4e-3 : 5e-4) << toString(io) << " p " << p;
    }
    EXPECT_EQ(cuda::dropoutMaskDataType(0.1, io, cuda::MaskWidth::Exact), DataType::Float);
    EXPECT_EQ(cuda::dropoutScaleCorrection(0.1, DataType::Float), 1.0F);
    EXPECT_EQ(cuda::dropoutScaleCorrection(0.5, io), 1.0F);
  }
}

TEST(VectorizedCopyCodegen, CompilesForSm90) {
  EXPECT_FALSE(cuda::compileToCubin(cuda::vectorizedCopySource(), "vector_copy", "sm_90").empty());
}

}  // namespace
}  // namespace meshfuse
#endif  // MESHFUSE_HAVE_CUDA
