// The IR: a Fusion owns Vals (TensorViews and Scalars) and the Exprs between them. Shapes are
// global (logical); an extent of -1 is symbolic and bound when the fusion executes. A TensorView
// also carries its multi-device annotations: a DeviceMesh and a loop domain whose axes can be split
// and parallelized over mesh dimensions or streams.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/user_error.h"
#include "multidevice/device_mesh.h"
#include "runtime/dtype.h"

namespace meshfuse {

class Fusion;
class Expr;

class Val {
 public:
  enum class Kind : uint8_t { Tensor, Scalar };
  Val(Fusion* fusion, int id, Kind kind, DataType dtype) : fusion_(fusion), id_(id), kind_(kind), dtype_(dtype) {}
  virtual ~Val() = default;
  Fusion* fusion() const { return fusion_; }
  int id() const { return id_; }
  Kind kind() const { return kind_; }
  bool isTensor() const { return kind_ == Kind::Tensor; }
  DataType dtype() const { return dtype_; }
  Expr* definition() const { return definition_; }
  const std::vector<Expr*>& uses() const { return uses_; }
  virtual std::string name() const = 0;

 private:
  friend class Fusion;
  Fusion* fusion_;
  int id_;
  Kind kind_;
  DataType dtype_;
  Expr* definition_ = nullptr;
  std::vector<Expr*> uses_;
};

// A scalar: a constant when `value` is set, else an input of the fusion bound at execution.
// Scalars (constants and scalar inputs) are doubles: integers hold exactly up to 2**53.
constexpr double kExactIntegerLimit = 9007199254740992.0;
// Whether `value` is a whole number a double holds exactly: what an Int or Int32 scalar may be.
bool isExactInteger(double value);
bool fitsInt32(double value);         // within [-2**31, 2**31) (false for NaN)
std::string exactText(double value);  // to the last bit (%.17g): 2 as "2", 0.1 as "0.10000000000000001"

class Scalar : public Val {
 public:
  Scalar(Fusion* f, int id, DataType dtype, std::optional<double> value)
      : Val(f, id, Kind::Scalar, dtype), value_(value) {}
  const std::optional<double>& value() const { return value_; }
  bool isConstant() const { return value_.has_value(); }
  std::string name() const override;

 private:
  std::optional<double> value_;
};

// One axis of a TensorView's loop domain. A logical axis is whole, or split into an outer and an
// inner part: outer_split(a, n) makes the outer part n long, split(a, n) makes the inner part n long.
struct LoopAxis {
  enum class Part : uint8_t { Whole, Outer, Inner };
  int logical = 0;  // the logical axis it comes from
  Part part = Part::Whole;
  int64_t factor = 0;        // the split's given extent (0 when whole)
  bool outer_split = false;  // whether `factor` is the outer part's extent
  ParallelType parallel = ParallelType::Serial;
  // 1 for the parts of a split of an inner part (e.g. a stream split of a device-local extent).
  int level = 0;
  int64_t parent_factor = 0;
  bool parent_outer_split = false;
};

class TensorView : public Val {
 public:
  TensorView(Fusion* f, int id, DataType dtype, std::vector<int64_t> shape, std::vector<bool> contiguity);
  std::string name() const override;

  const std::vector<int64_t>& shape() const { return shape_; }  // global, -1 = symbolic
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  const std::vector<bool>& contiguity() const { return contiguity_; }
  bool isContiguous() const;

  // Multi-device annotations (nvFuser's names).
  void setDeviceMesh(const DeviceMesh& mesh) {
    // A default-constructed mesh holds no device (Python's DeviceMesh([]) is refused the same way).
    if (mesh.empty()) throw UserError(name() + ": set_device_mesh got a DeviceMesh with no devices");
    mesh_ = mesh;
    scheduleChanged();
  }
  const std::optional<DeviceMesh>& deviceMesh() const { return mesh_; }
  bool hasDeviceMesh() const { return mesh_.has_value(); }
  const std::vector<LoopAxis>& loop() const { return loop_; }
  void split(int64_t loop_axis, int64_t factor, bool inner_split = true);
  void outerSplit(int64_t loop_axis, int64_t parts) { split(loop_axis, parts, /*inner_split=*/false); }
  void parallelize(int64_t loop_axis, ParallelType p);
  void setLoop(std::vector<LoopAxis> loop) {
    loop_ = std::move(loop);
    scheduleChanged();
  }
  // The logical axis sharded over p's mesh dimension, or -1.
  int shardedAxis(ParallelType p) const;
  // The number of chunks the logical axis is split into along p (the mesh size or stream count).
  int64_t partsAlong(ParallelType p, int64_t logical_extent) const;
  // The logical axis parallelized on streams, or -1; with its chunk count.
  int streamAxis() const;
  int64_t streamChunks(int64_t logical_extent) const;
  bool isSharded() const;
  std::string loopToString() const;
  // For errors about loop axes on a reduction's result: that its loop domain has no reduced axes,
  // unlike nvFuser's (empty for other tensors).
  std::string loopDomainHint() const;
  // A Partial tensor along a mesh dimension holds, on each device of that dimension, a summand
  // (or max/min operand) of the value: set by resharding insertion, never by users.
  void setPartial(ParallelType p, bool partial) {
    partial_[meshAxisIndex(p)] = partial;
    scheduleChanged();
  }
  bool isPartial(ParallelType p) const { return partial_[meshAxisIndex(p)]; }
  bool isPartial() const { return partial_[0] || partial_[1] || partial_[2]; }

 private:
  void scheduleChanged();  // advances the fusion's version (Fusion::version says why)
  std::vector<int64_t> shape_;
  std::vector<bool> contiguity_;
  std::optional<DeviceMesh> mesh_;
  std::vector<LoopAxis> loop_;
  bool partial_[3] = {false, false, false};
};

enum class OpType : uint8_t {
  // unary
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Relu,
  Sigmoid,
  Tanh,
  Gelu,
  Rsqrt,
  Reciprocal,
  Erf,
  Silu,
  Square,
  LogicalNot,  // Bool result
  // binary
  Add,
  Sub,
  Mul,
  Div,
  Max,
  Min,
  Pow,
  Lt,  // comparisons: Bool result
  Le,
  Gt,
  Ge,
  Eq,
  Ne,
  LogicalAnd,  // Bool result
  LogicalOr,
  // ternary
  Where,  // where(cond, a, b)
  // others
  Cast,
  Set,
  Full,     // full(shape, fill_value, dtype): inputs {fill_value}
  Uniform,  // uniform(minval, maxval, shape, dtype, seed, offset): inputs {minval, maxval, seed, offset}
  Normal,   // normal(mean, std, shape, dtype, seed, offset): inputs {mean, std, seed, offset}
  Sum,
  ReduceMax,
  Mean,
  BroadcastInDim,
  Reshape,
  Permute,
  Slice,        // attrs: axes = starts, shape = ends, strides = steps
  Cat,          // attrs: axes = {dim}
  StrideOrder,  // a copy laid out in memory by attrs.axes (nvFuser's stride_order)
  // Fused attention (nvFuser's sdpfa_fwd/sdpfa_bwd), exprs of several outputs; operand order in ops/attention.h.
  SdpaFwd,
  SdpaBwd,
  Matmul,
  Linear,
};
std::string toString(OpType op);
bool isUnary(OpType op);
bool isBinary(OpType op);
bool isTernary(OpType op);
bool isComparison(OpType op);  // lt, le, gt, ge, eq, ne
bool isLogical(OpType op);     // logical_and, logical_or, logical_not
// Ops whose result on integers is an integer computed exactly in int64 (add, mul, max, where,
// comparisons, ...; not div, pow or the transcendental ones).
bool isExactOnIntegers(OpType op);
// Full, Uniform, Normal: an output computed from scalars alone (no tensor operand).
bool isCreation(OpType op);
bool isRandom(OpType op);     // Uniform, Normal
bool isPointwise(OpType op);  // unary, binary, ternary, cast, set, creation
bool isReduction(OpType op);  // sum, max, mean
bool isAttention(OpType op);  // sdpfa_fwd, sdpfa_bwd

// Operands, results and the attributes an op needs; `axes` holds reduction axes, the permutation,
// broadcast_in_dim's kept dims or reshape's new shape.
struct ExprAttributes {
  std::vector<int64_t> axes;
  std::vector<int64_t> shape;    // broadcast_in_dim's output shape, reshape's target
  std::vector<int64_t> strides;  // slice's steps
  bool keepdim = false;
  DataType cast_to = DataType::Float;  // cast's target; full/uniform/normal's dtype
  // uniform/normal without an rng_seed: the executor draws a fresh (seed, offset) per execution.
  bool fresh_rng = false;
};

class Expr {
 public:
  Expr(int id, OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, ExprAttributes attrs)
      : id_(id), op_(op), inputs_(std::move(inputs)), outputs_(std::move(outputs)), attrs_(std::move(attrs)) {}
  int id() const { return id_; }
  OpType op() const { return op_; }
  const std::vector<Val*>& inputs() const { return inputs_; }
  const std::vector<Val*>& outputs() const { return outputs_; }
  Val* input(size_t i) const { return inputs_.at(i); }
  TensorView* out() const;              // the single TensorView result
  TensorView* inputTv(size_t i) const;  // nullptr when input i is a scalar
  const ExprAttributes& attrs() const { return attrs_; }
  std::string toString() const;

 private:
  int id_;
  OpType op_;
  std::vector<Val*> inputs_;
  std::vector<Val*> outputs_;
  ExprAttributes attrs_;
};

class Fusion {
 public:
  Fusion() = default;
  Fusion(const Fusion&) = delete;
  Fusion& operator=(const Fusion&) = delete;

  TensorView* newTensor(DataType dtype, std::vector<int64_t> shape, std::vector<bool> contiguity = {});
  Scalar* newScalar(DataType dtype, std::optional<double> value);
  Expr* newExpr(OpType op, std::vector<Val*> inputs, std::vector<Val*> outputs, ExprAttributes attrs = {});

  void addInput(Val* v);
  void addOutput(Val* v);
  const std::vector<Val*>& inputs() const { return inputs_; }
  const std::vector<Val*>& outputs() const { return outputs_; }
  bool isInput(const Val* v) const;
  bool isOutput(const Val* v) const;
  bool owns(const Val* v) const { return v != nullptr && v->fusion() == this; }

  // Expressions in definition order (a topological order: an expr only uses earlier values).
  const std::vector<std::unique_ptr<Expr>>& exprs() const { return exprs_; }
  const std::vector<std::unique_ptr<Val>>& vals() const { return vals_; }
  // Exprs that contribute to an output, in topological order.
  std::vector<Expr*> liveExprs() const;
  std::string toString() const;

  // A deep copy; `map` (if given) receives old val id -> new Val*.
  std::unique_ptr<Fusion> clone(std::vector<Val*>* map = nullptr) const;

  // Advances at every change of the definition (exprs, inputs, outputs) and of a tensor's schedule
  // (mesh, loop domain, partial flags). FusionExecutorCache keys its lowered programs by it: the
  // lowering reads all of these, and a TensorView's schedule can still change after an execute.
  uint64_t version() const { return version_; }

 private:
  friend class TensorView;
  uint64_t version_ = 0;
  std::vector<std::unique_ptr<Val>> vals_;
  std::vector<std::unique_ptr<Expr>> exprs_;
  std::vector<Val*> inputs_;
  std::vector<Val*> outputs_;
};

}  // namespace meshfuse
