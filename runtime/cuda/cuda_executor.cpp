// makeCudaExecutor(): runs a Segment on one GPU. A normalization segment is one persistent kernel
// (runtime/cuda/normalization.h) where that scheduler takes it. Otherwise the segment's exprs are taken in order: each
// maximal run of pointwise exprs becomes ONE generated kernel per output shape (the whole chain
// fused, intermediates in registers), reductions a generated reduction kernel, matmul/linear
// cuBLASLt, views a restride. Everything is enqueued on the device's current stream.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ops/attention.h"
#include "ops/shape_inference.h"
#include "runtime/cuda/attention.h"
#include "runtime/cuda/matmul.h"
#include "runtime/cuda/normalization.h"
#include "runtime/cuda/pointwise_kernel.h"
#include "runtime/cuda/reduction.h"
#include "runtime/cuda/streams.h"
#include "runtime/cuda/views.h"
#include "runtime/host_span.h"
#include "runtime/segment.h"
#include "runtime/view_ops.h"

namespace meshfuse {

namespace {

using Operand = cuda::PointwiseProgram::Operand;

// One generated kernel of a run of pointwise exprs: its program (and the program's kernel-cache key),
// the values it reads in the program's order, the exprs whose results it writes, its random ops.
struct PointwiseKernelPlan {
  cuda::PointwiseProgram program;
  std::string key;
  std::vector<const Val*> inputs;      // tensors, one per program input
  std::vector<const Val*> scalars;     // the non-constant scalars, one per program scalar
  std::vector<const Expr*> producers;  // one per program output
  std::vector<const Expr*> random;     // the random exprs, in program order
};

// The kernels of one run of pointwise exprs.
struct PointwiseGroupPlan {
  std::vector<PointwiseKernelPlan> kernels;
};

// The plans are kept (KeptPlans) unless MESHFUSE_CUDA_PLAN_CACHE=0, read at each run: a test can turn
// them off for a scope, and a user can rule them out when chasing a wrong result.
bool planCacheEnabled() {
  const char* e = std::getenv("MESHFUSE_CUDA_PLAN_CACHE");
  return e == nullptr || std::string(e) != "0";
}

// What an executor keeps of its segments' runs: a pointwise group's kernel plans (which exprs are
// needed later, the slices, the programs and their keys), a normalization segment's prepared launch.
// Making them cost 10-60 us of host time a segment on the H100's host, most of a small kernel's
// launch (BENCHMARKS.md, session 25). Kept by (segment, ...) key, as long as the executor (one per
// cached host program, whose segments live as long), and used while the run's signature (shapes,
// strides) is the one a plan was made for: a segment also runs at other shapes (a stream loop's
// chunks), and a mismatch plans again.
template <typename Key, typename Signature, typename Plan>
class KeptPlans {
 public:
  std::shared_ptr<const Plan> find(const Key& key, const Signature& signature) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.signature != signature) return nullptr;
    return it->second.plan;
  }
  void store(const Key& key, Signature signature, std::shared_ptr<const Plan> plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_[key] = Entry{std::move(signature), std::move(plan)};
  }

 private:
  struct Entry {
    Signature signature;
    std::shared_ptr<const Plan> plan;
  };
  mutable std::mutex mutex_;
  std::map<Key, Entry> entries_;
};

// By (segment, first expr of the group), for the exprs' shapes.
using PointwisePlans =
    KeptPlans<std::pair<const Segment*, size_t>, std::vector<std::vector<int64_t>>, PointwiseGroupPlan>;
// By segment, for its input tensors' shapes, strides and alignments and its outputs' shapes; nullopt
// where the normalization scheduler refused the segment.
using NormalizationPlans = KeptPlans<const Segment*, std::vector<int64_t>, std::optional<cuda::NormalizationLaunch>>;

// Everything an executor keeps of its segments' runs.
struct Kept {
  PointwisePlans pointwise;
  NormalizationPlans normalization;
};

// The tensors of one segment run: the segment's inputs (from the ValueMap) and what it computes.
class SegmentRun {
 public:
  SegmentRun(int device, const Segment& seg, ValueMap& values, const ShapeMap& shapes, Kept& kept)
      : device_(device), seg_(seg), values_(values), shapes_(shapes), kept_(kept) {
    host_span::Scope span("segment: setup");
    outputs_.insert(seg.outputs.begin(), seg.outputs.end());
    findReadThroughCasts();
  }

  void execute() {
    if (seg_.kind == Segment::Kind::Normalization && runFusedNormalization()) return;
    if (seg_.kind == Segment::Kind::Matmul && seg_.epilogue.kind != MatmulEpilogue::Kind::None && runEpilogue()) return;
    runExprs(0, seg_.exprs.size());
    checkOutputsComputed();
  }

 private:
  // Exprs [begin, end) in order: each maximal run of pointwise exprs one generated kernel (per
  // output shape), every other expr alone.
  void runExprs(size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      if (isPointwise(seg_.exprs[i]->op())) {
        size_t j = i;
        while (j < end && isPointwise(seg_.exprs[j]->op())) ++j;
        runPointwiseGroup(i, j);
        i = j;
      } else {
        runSingle(*seg_.exprs[i]);
        ++i;
      }
    }
  }

  void checkOutputsComputed() const {
    for (TensorView* out : seg_.outputs)
      if (!values_.tensors.count(out))
        throw std::logic_error("CUDA executor: " + out->name() + " is not computed by " + seg_.toString());
  }

  const Tensor& tensor(const Val* v) {
    auto it = local_.find(v);
    if (it != local_.end()) return it->second;
    const Tensor& t = values_.tensor(v);
    if (t.device() != Device::cuda(device_))
      throw std::invalid_argument("CUDA executor: input " + v->name() + " is " + t.toString() +
                                  ", expected cuda:" + std::to_string(device_));
    if (t.dtype() != v->dtype())
      throw std::invalid_argument("CUDA executor: input " + v->name() + " has dtype " + toString(t.dtype()) +
                                  ", expected " + toString(v->dtype()));
    auto s = shapes_.find(v);
    if (s != shapes_.end() && s->second != t.shape())
      throw std::invalid_argument("CUDA executor: input " + v->name() + " has shape " + shapeToString(t.shape()) +
                                  ", expected " + shapeToString(s->second));
    return t;
  }

  // The local shape of a value the segment computes: the ShapeMap's, else inferred from operands.
  std::vector<int64_t> shapeOf(const Expr& e) {
    auto it = shapes_.find(e.out());
    if (it != shapes_.end()) return it->second;
    std::vector<std::vector<int64_t>> in_shapes;
    for (const Val* v : e.inputs()) in_shapes.push_back(v->isTensor() ? tensorShape(v) : std::vector<int64_t>{});
    return inferShape(e.op(), e.attrs(), e.inputs(), in_shapes);
  }
  std::vector<int64_t> tensorShape(const Val* v) {
    auto it = shapes_.find(v);
    if (it != shapes_.end()) return it->second;
    auto def = computed_shapes_.find(v);
    if (def != computed_shapes_.end()) return def->second;
    return tensor(v).shape();
  }

  // Widening casts read only by reductions in this segment (a bf16 linear's bias gradient: cast,
  // sum over the rows): the reductions read the narrow operand and accumulate in the cast's type,
  // the same sums, where a pointwise kernel would write the wide copy and the reduction read it
  // back (0.37 ms of the GPT-3 layer's backward on the H100 for the qkv and fc1 bias gradients).
  void findReadThroughCasts() {
    if (seg_.kind == Segment::Kind::Attention) return;
    for (const Expr* e : seg_.exprs) {
      if (e->op() != OpType::Cast || outputs_.count(e->out()) || !e->input(0)->isTensor()) continue;
      const DataType from = e->input(0)->dtype(), to = e->out()->dtype();
      if (!isFloatingPoint(from) || !isFloatingPoint(to) || dataTypeSize(to) <= dataTypeSize(from)) continue;
      bool only_reductions = true, read = false;
      for (const Expr* user : seg_.exprs)
        for (const Val* in : user->inputs())
          if (in == e->out()) {
            read = true;
            only_reductions = only_reductions && isReduction(user->op()) && user->input(0) == e->out();
          }
      if (read && only_reductions) read_through_[e->out()] = e->input(0);
    }
  }

  bool neededLater(const Val* v, size_t after) const {
    if (read_through_.count(v)) return false;  // its reductions read the operand instead
    if (outputs_.count(static_cast<const TensorView*>(v))) return true;
    for (size_t k = after; k < seg_.exprs.size(); ++k)
      for (const Val* in : seg_.exprs[k]->inputs()) {
        if (in == v) return true;
        // A reduction of a read-through cast reads the cast's operand, computed here or not at all.
        const auto through = read_through_.find(in);
        if (through != read_through_.end() && through->second == v) return true;
      }
    return false;
  }

  void bind(const TensorView* tv, Tensor t) {
    if (outputs_.count(tv)) values_.tensors[tv] = t;
    local_[tv] = std::move(t);
  }

  Tensor allocate(const TensorView* tv, const std::vector<int64_t>& shape) {
    return Tensor::empty(shape, tv->dtype(), Device::cuda(device_));
  }

  // Exprs [begin, end) are pointwise; the values used after them are computed by one kernel per
  // distinct output shape, each from the backward slice of the chain it needs. The kernels' programs
  // depend on the segment and the exprs' shapes only: built on the group's first run and kept by the
  // executor (KeptPlans) for as long as the shapes are those it was built for.
  void runPointwiseGroup(size_t begin, size_t end) {
    host_span::Scope span("pointwise: program from the exprs");
    std::vector<std::vector<int64_t>> shapes;
    shapes.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      const Expr* e = seg_.exprs[i];
      shapes.push_back(shapeOf(*e));
      computed_shapes_[e->out()] = shapes.back();
    }
    const bool keep = planCacheEnabled();
    std::shared_ptr<const PointwiseGroupPlan> plan = keep ? kept_.pointwise.find({&seg_, begin}, shapes) : nullptr;
    if (!plan) {
      auto built = std::make_shared<PointwiseGroupPlan>();
      std::map<std::vector<int64_t>, std::vector<const Expr*>> by_shape;
      for (size_t i = begin; i < end; ++i)
        if (neededLater(seg_.exprs[i]->out(), end)) by_shape[shapes[i - begin]].push_back(seg_.exprs[i]);
      for (const auto& [shape, producers] : by_shape) built->kernels.push_back(planKernel(begin, end, producers));
      plan = built;
      if (keep) kept_.pointwise.store({&seg_, begin}, std::move(shapes), plan);
    }
    for (const PointwiseKernelPlan& kernel : plan->kernels) runPointwiseKernel(kernel);
  }

  // The program of the kernel that computes `producers` from the exprs [begin, end): the backward
  // slice of the chain they need, its tensor inputs, its scalars and its random ops, in order.
  PointwiseKernelPlan planKernel(size_t begin, size_t end, const std::vector<const Expr*>& producers) {
    PointwiseKernelPlan plan;
    plan.producers = producers;
    std::unordered_set<const Val*> needed;
    for (const Expr* e : producers) needed.insert(e->out());
    std::vector<const Expr*> slice;
    for (size_t i = end; i-- > begin;) {
      const Expr* e = seg_.exprs[i];
      if (!needed.count(e->out())) continue;
      slice.push_back(e);
      needed.insert(e->inputs().begin(), e->inputs().end());
    }
    std::reverse(slice.begin(), slice.end());

    cuda::PointwiseProgram& prog = plan.program;
    std::unordered_map<const Val*, Operand> operand_of;
    auto operand = [&](const Val* v) -> Operand {
      auto it = operand_of.find(v);
      if (it != operand_of.end()) return it->second;
      Operand o;
      o.dtype = v->dtype();
      if (v->isTensor()) {
        o.kind = Operand::Kind::Input;
        o.index = static_cast<int>(plan.inputs.size());
        plan.inputs.push_back(v);
        prog.inputs.push_back(v->dtype());
      } else if (static_cast<const Scalar*>(v)->isConstant()) {
        o.kind = Operand::Kind::Constant;
        o.value = *static_cast<const Scalar*>(v)->value();
      } else {
        o.kind = Operand::Kind::Scalar;
        o.index = prog.num_scalars++;
        plan.scalars.push_back(v);
      }
      return operand_of[v] = o;
    };
    for (const Expr* e : slice) {
      cuda::PointwiseProgram::Instr ins{e->op(), {}, e->op() == OpType::Cast ? e->attrs().cast_to : e->out()->dtype()};
      for (const Val* v : e->inputs()) ins.args.push_back(operand(v));
      Operand t;
      t.kind = Operand::Kind::Temp;
      t.index = static_cast<int>(prog.instrs.size());
      t.dtype = ins.dtype;
      prog.instrs.push_back(std::move(ins));
      operand_of[e->out()] = t;
      if (isRandom(e->op())) plan.random.push_back(e);
    }
    for (const Expr* e : producers) prog.outputs.push_back(operand_of.at(e->out()).index);
    plan.key = prog.key();
    return plan;
  }

  // One kernel of a pointwise group on this run's tensors and scalars.
  void runPointwiseKernel(const PointwiseKernelPlan& plan) {
    std::vector<Tensor> inputs, outputs;
    std::vector<double> scalars;
    inputs.reserve(plan.inputs.size());
    for (const Val* v : plan.inputs) inputs.push_back(tensor(v));
    scalars.reserve(plan.scalars.size());
    for (const Val* v : plan.scalars) scalars.push_back(values_.scalar(v));
    outputs.reserve(plan.producers.size());
    for (const Expr* e : plan.producers) outputs.push_back(allocate(e->out(), computed_shapes_.at(e->out())));
    std::vector<cuda::RandomIndex> random;
    for (const Expr* e : plan.random)
      random.push_back(randomIndex(*e, computed_shapes_.at(plan.producers.front()->out())));
    cuda::runPointwise(device_, plan.program, inputs, scalars, outputs, random, plan.key);
    for (size_t i = 0; i < plan.producers.size(); ++i) bind(plan.producers[i]->out(), outputs[i]);
  }

  // The whole segment as one normalization kernel (runtime/cuda/normalization.h); false (nothing
  // run) when the scheduler does not take it, and the exprs then run one by one.
  bool runFusedNormalization() {
    host_span::Scope span("normalization segment");
    std::vector<Tensor> outputs;
    for (TensorView* out : seg_.outputs) {
      auto it = shapes_.find(out);
      if (it == shapes_.end()) return false;
      outputs.push_back(allocate(out, it->second));
    }
    // What prepareNormalization reads of the run, besides the values it binds (KeptPlans).
    std::vector<int64_t> signature;
    for (const Val* v : seg_.inputs) {
      if (!v->isTensor()) continue;
      const Tensor& t = tensor(v);  // device, dtype and shape checks
      signature.push_back(t.dim());
      signature.insert(signature.end(), t.shape().begin(), t.shape().end());
      signature.insert(signature.end(), t.strides().begin(), t.strides().end());
      signature.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data()) % 16));
    }
    for (const Tensor& out : outputs) signature.insert(signature.end(), out.shape().begin(), out.shape().end());
    const bool keep = planCacheEnabled();
    std::optional<cuda::NormalizationLaunch> launch;
    if (auto kept = keep ? kept_.normalization.find(&seg_, signature) : nullptr) {
      if (!*kept) return false;
      launch = **kept;
      cuda::rebindNormalization(*launch, values_, outputs);
    } else {
      launch = cuda::prepareNormalization(seg_, shapes_, values_, outputs);
      if (keep) {
        // Kept without this run's tensors, which it would otherwise hold for the executor's life.
        auto unbound = std::make_shared<std::optional<cuda::NormalizationLaunch>>(launch);
        if (*unbound) {
          for (Tensor& t : (*unbound)->loads) t = Tensor();
          for (Tensor& t : (*unbound)->stores) t = Tensor();
        }
        kept_.normalization.store(&seg_, std::move(signature), std::move(unbound));
      }
      if (!launch) return false;
    }
    cuda::runNormalization(device_, *launch);
    for (size_t i = 0; i < outputs.size(); ++i) values_.tensors[seg_.outputs[i]] = outputs[i];
    return true;
  }

  // Where a random op's elements sit in its global tensor, over the iteration shape `iter` of the
  // kernel that computes it (its own shape, or a larger one it is broadcast into).
  cuda::RandomIndex randomIndex(const Expr& e, const std::vector<int64_t>& iter) {
    for (size_t k = 2; k < 4; ++k) {  // rng_seed, rng_offset: what the Philox counter and key take
      const double x = values_.scalar(e.input(k));
      if (!(x >= 0) || x != std::floor(x) || x > 0x1p63)
        throw std::invalid_argument(toString(e.op()) + ": " + (k == 2 ? "rng_seed" : "rng_offset") +
                                    " must be a non-negative integer, got " + std::to_string(x));
    }
    const std::vector<int64_t> local = tensorShape(e.out());
    std::vector<int64_t> global = local, offsets(local.size(), 0);
    if (auto it = seg_.global_blocks.find(e.out()); it != seg_.global_blocks.end()) {
      global = it->second.global_shape;
      offsets = it->second.offsets;
    }
    cuda::RandomIndex r;
    r.identity = local == iter && global == local;
    if (r.identity) return r;
    if (local.size() > iter.size() || global.size() != local.size() || offsets.size() != local.size())
      throw std::logic_error("CUDA executor: the block of " + e.out()->name() + " does not match its shape");
    const std::vector<int64_t> gstrides = contiguousStrides(global);
    const size_t lead = iter.size() - local.size();
    r.strides.assign(iter.size(), 0);
    for (size_t j = 0; j < local.size(); ++j) {
      r.base += offsets[j] * gstrides[j];
      if (!(local[j] == 1 && iter[lead + j] != 1)) r.strides[lead + j] = gstrides[j];
    }
    return r;
  }

  void runSingle(const Expr& e) {
    if (isAttention(e.op())) return runAttention(e);
    const std::vector<int64_t> out_shape = shapeOf(e);
    computed_shapes_[e.out()] = out_shape;
    if (isReduction(e.op())) {
      host_span::Scope span("reduction");
      Tensor out = allocate(e.out(), out_shape);
      const auto through = read_through_.find(e.input(0));
      const Val* operand = through == read_through_.end() ? e.input(0) : through->second;
      cuda::runReduction(device_, e.op(), tensor(operand), e.attrs().axes, out);
      bind(e.out(), out);
      return;
    }
    switch (e.op()) {
      case OpType::Matmul:
      case OpType::Linear: return runProduct(e, out_shape);
      case OpType::Permute:
      case OpType::BroadcastInDim:
      case OpType::Slice:
      case OpType::StrideOrder:
      case OpType::Reshape: {
        host_span::Scope span("view");
        bind(e.out(), cuda::applyView(e, tensor(e.input(0)), out_shape));
        return;
      }
      case OpType::Cat: {
        std::vector<Tensor> parts;
        for (const Val* v : e.inputs()) parts.push_back(tensor(v));
        bind(e.out(), concatenate(parts, e.attrs().axes.at(0), out_shape));
        return;
      }
      default: break;
    }
    throw std::logic_error("CUDA executor: cannot run " + toString(e.op()) + " in " + seg_.toString());
  }

  // The segment's matmul with its epilogue as one cuBLASLt call (runtime/segment.h); false when
  // cuBLASLt cannot, and the exprs run one by one instead (same values up to rounding: the
  // epilogue applies the activation to the fp32 accumulator, the exprs to the stored product).
  bool runEpilogue() {
    host_span::Scope span("matmul with epilogue");
    const Expr& product_expr = *seg_.exprs.front();
    const TensorView* product = product_expr.out();
    const MatmulEpilogue& epi = seg_.epilogue;
    const DataType dt = product->dtype();
    if (dt != DataType::BFloat16 && dt != DataType::Half && dt != DataType::Float) return false;
    const bool gradient = epi.kind == MatmulEpilogue::Kind::GeluTanhGrad;
    if (gradient && cuda::geluGradEpilogue() == cuda::GeluGradEpilogue::Off) return false;
    cuda::ProductOperands ops;
    ops.linear = product_expr.op() == OpType::Linear;
    for (size_t i = 0; i < product_expr.inputs().size(); ++i) {
      const Val* v = product_expr.input(i);
      if (v->dtype() != dt) return false;
      (i == 0 ? ops.a : i == 1 ? ops.b : ops.bias) = tensor(v);
    }
    const std::vector<int64_t> result_shape = tensorShape(epi.result);
    Tensor result = allocate(epi.result, result_shape);
    Tensor aux, bias_grad;
    cuda::GemmEpilogue::Activation activation = cuda::GemmEpilogue::Activation::Gelu;
    if (!gradient) {
      if (outputs_.count(product)) aux = allocate(product, tensorShape(product));
    } else {
      activation = cuda::GemmEpilogue::Activation::GeluGrad;
      aux = tensor(epi.aux);
      if (aux.shape() != result_shape) return false;  // a broadcast aux: the exprs handle it
      if (epi.bias_grad && cuda::geluGradEpilogue() == cuda::GeluGradEpilogue::DgeluBgrad)
        bias_grad = allocate(epi.bias_grad, tensorShape(epi.bias_grad));
    }
    if (!cuda::runProductWithActivation(device_, ops, activation, aux, result, bias_grad)) return false;
    bind(epi.result, result);
    if (bias_grad.defined()) bind(epi.bias_grad, bias_grad);
    if (!gradient && aux.defined()) bind(product, aux);
    if (epi.bias_grad && !bias_grad.defined()) {
      // The bias gradient's exprs (a sum of the result, with its casts) follow the result's in the
      // segment; the sum reads the result itself through its widening cast (findReadThroughCasts).
      const auto root = std::find(seg_.exprs.begin(), seg_.exprs.end(), epi.result->definition());
      runExprs(static_cast<size_t>(root - seg_.exprs.begin()) + 1, seg_.exprs.size());
    }
    checkOutputsComputed();
    return true;
  }

  // Fused attention through cuDNN (runtime/cuda/attention.cpp); all of its results at once.
  void runAttention(const Expr& e) {
    host_span::Scope span("attention");
    std::vector<Tensor> operands;
    for (const Val* v : e.inputs()) operands.push_back(v->isTensor() ? tensor(v) : Tensor());
    const size_t qi = e.op() == OpType::SdpaFwd ? size_t{ops::sdpa::kQ} : size_t{ops::sdpa::kBwdQ};
    auto block = seg_.global_blocks.find(e.out());
    AttentionParams p = attentionParams(
        e, operands[qi].shape(), operands[qi + 1].shape(), operands[qi + 2].shape(),
        [&](const Val* s) { return values_.scalar(s); }, block == seg_.global_blocks.end() ? nullptr : &block->second);
    std::vector<Tensor> results = cuda::runAttention(device_, e, p, operands);
    for (size_t i = 0; i < results.size(); ++i) {
      auto* tv = static_cast<const TensorView*>(e.outputs()[i]);
      computed_shapes_[tv] = results[i].shape();
      bind(tv, results[i]);
    }
  }

  // Operands of another dtype are converted to the result's; integer products run in fp64
  // (exact below 2^53) and are converted back.
  void runProduct(const Expr& e, const std::vector<int64_t>& out_shape) {
    host_span::Scope span("matmul");
    const DataType out_t = e.out()->dtype();
    const bool integral = !isFloatingPoint(out_t);
    const DataType work_t = integral ? DataType::Double : out_t;
    std::vector<Tensor> ops;
    for (const Val* v : e.inputs()) ops.push_back(tensor(v).to(work_t));
    Tensor out = Tensor::empty(out_shape, work_t, Device::cuda(device_));
    if (e.op() == OpType::Matmul)
      cuda::runMatmul(device_, ops[0], ops[1], out);
    else
      cuda::runLinear(device_, ops[0], ops[1], ops.size() > 2 ? ops[2] : Tensor(), out);
    bind(e.out(), integral ? out.to(out_t) : out);
  }

  int device_;
  const Segment& seg_;
  ValueMap& values_;
  const ShapeMap& shapes_;
  Kept& kept_;
  std::unordered_set<const TensorView*> outputs_;
  std::unordered_map<const Val*, Tensor> local_;
  std::unordered_map<const Val*, std::vector<int64_t>> computed_shapes_;
  std::unordered_map<const Val*, const Val*> read_through_;  // a cast's result -> its operand
};

class CudaExecutor final : public SegmentExecutor {
 public:
  explicit CudaExecutor(int device) : device_(device) {}
  void run(const Segment& seg, ValueMap& values, const ShapeMap& shapes) override {
    cuda::DeviceGuard guard(device_);
    SegmentRun(device_, seg, values, shapes, kept_).execute();
  }
  Device device() const override { return Device::cuda(device_); }
  void synchronize() override { cuda::synchronizeStream(device_, cuda::currentStream(device_)); }

 private:
  int device_;
  Kept kept_;
};

}  // namespace

std::unique_ptr<SegmentExecutor> makeCudaExecutor(int device_index) {
  std::string why;
  int count = cuda::deviceCount(&why);
  if (device_index < 0 || device_index >= count)
    throw std::invalid_argument("makeCudaExecutor: cuda:" + std::to_string(device_index) + " does not exist (" +
                                std::to_string(count) + " CUDA devices" + (why.empty() ? "" : ": " + why) + ")");
  return std::make_unique<CudaExecutor>(device_index);
}

}  // namespace meshfuse
