// sdpfa_fwd / sdpfa_bwd on CUDA: cuDNN's fused flash attention built through the cuDNN frontend's
// graph API. One graph (with its execution plan) is built per (device, direction, dtype, shapes,
// causal, scale, dropout mask dtype) and cached; its workspace comes from meshfuse's caching allocator
// and it runs on the device's current stream (the segment's). Dropout is drawn in-kernel by cuDNN
// from the op's seed and offset (attention_rng.h: a mask the CPU cannot draw); or, with
// MESHFUSE_ATTENTION_RNG=meshfuse, the graph takes meshfuse's Philox mask as an input
// (dropout_mask.h), so that CPU and CUDA drop the same elements, at about 3x the backward's time.
#include "runtime/cuda/attention.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "ops/attention.h"

#if MESHFUSE_HAVE_CUDNN
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "runtime/attention_layout.h"
#include "runtime/cuda/attention_plans.h"
#include "runtime/cuda/attention_rng.h"
#include "runtime/cuda/dropout_mask.h"
#include "runtime/cuda/streams.h"
#include "runtime/host_span.h"
#endif

namespace meshfuse::cuda {

namespace {

// Checks that no cuDNN is needed to make: dtype and head dims cuDNN's fused kernels take.
void checkSupported(const Expr& e, const AttentionParams& p, DataType dtype) {
  const std::string op = toString(e.op());
  if (dtype != DataType::Half && dtype != DataType::BFloat16)
    throw UserError(op + " on CUDA (cuDNN fused attention) takes Half or BFloat16 tensors, got " + toString(dtype) +
                    ": cast q, k, v (fd.ops.cast) or run on CPU tensors");
  for (int64_t d : {p.head_dim, p.head_dim_v})
    if (d % 8 != 0 || d > 128 || d <= 0)
      throw UserError(op + " on CUDA (cuDNN fused attention): head dim " + std::to_string(d) +
                      " is not supported; supported head dims are multiples of 8 up to 128 (other head dims run on "
                      "CPU tensors)");
}

}  // namespace

#if !MESHFUSE_HAVE_CUDNN

bool haveCudnnAttention() { return false; }

// By value as declared: the cuDNN build's definition fills in the Philox seed and offset.
// cppcheck-suppress passedByValue
std::vector<Tensor> runAttention(int device, const Expr& e, AttentionParams p, const std::vector<Tensor>& tensors) {
  throw UserError(toString(e.op()) +
                  " on CUDA tensors needs cuDNN, and this build of meshfuse has none: rebuild with cuDNN 9 "
                  "(cudnn.h and libcudnn from the CUDA toolkit or CUDNN_ROOT) and the cuDNN frontend headers "
                  "(pip install nvidia-cudnn-frontend), or run attention on CPU tensors");
}

#else

bool haveCudnnAttention() { return true; }

namespace {

namespace fe = cudnn_frontend;
using TensorAttr = std::shared_ptr<fe::graph::Tensor_attributes>;

// One cuDNN handle per device, bound to the stream of each call.
cudnnHandle_t handleFor(int device) {
  static std::mutex mu;
  static std::unordered_map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error("cuDNN attention: cudnnCreate failed on cuda:" + std::to_string(device) +
                             " (cuDNN library version " + std::to_string(cudnnGetVersion()) + ")");
  return handles[device] = h;
}

// How a graph lays out what it writes and the mask it reads, beyond the inputs' strides.
struct Layout {
  // The forward's o is written heads-inner ([b, s, h, d] in memory, a permuted [b, h, s, d] view):
  // the layout its consumer, the merge of the heads before the out-projection, reads as a plain
  // reshape, where a [b, h, s, d] result cost a copy (0.06 ms of the GPT-3 layer's forward on the
  // H100, and again in the backward, which merges the saved o for the weight gradient).
  bool o_heads_inner = false;
  // The backward's dropout mask is read key-major (dropout_mask.h's MaskOrder says why).
  bool mask_key_major = false;
  // The backward writes dq, dk, dv with q's, k's and v's strides into one buffer laid out as theirs
  // (gradientsLikeInputs): when q, k, v are views of one fused projection, the cat that joins their
  // gradients is then a view (view_ops.h), not three copies (0.17 ms of the GPT-3 layer's backward
  // on the H100).
  bool grads_like_inputs = false;
  auto tie() const { return std::make_tuple(o_heads_inner, mask_key_major, grads_like_inputs); }
  bool operator==(const Layout& o) const { return tie() == o.tie(); }
};

// A built graph and the tensors its variant pack names.
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  std::map<std::string, TensorAttr> tensors;
  int64_t workspace = 0;
  bool strided_inputs = false;  // false: q, k, v (o, dO) are bound as dense copies
  Layout layout;
  bool tune = false;   // every plan built, the fastest chosen on the first call (attention_plans.h)
  AttentionPlan plan;  // the chosen plan; index -1: the heuristics'
};

// The strides of q, k, v (forward; also o and dO backward) as the call holds them, by name.
using InputStrides = std::map<std::string, std::vector<int64_t> >;

// The last double: the dropout probability of a graph that draws its own mask (cuDNN's generator
// takes it at build time), else 0; the last bool: every plan built for tuning.
using Key = std::tuple<int, bool, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, double, int,
                       InputStrides, double, std::tuple<bool, bool, bool>, bool>;

std::vector<int64_t> rowMajor(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

TensorAttr tensor(Built& b, const std::string& name, const std::vector<int64_t>& dims, fe::DataType_t dtype,
                  const InputStrides* strides = nullptr) {
  auto given = strides ? strides->find(name) : InputStrides::const_iterator();
  const std::vector<int64_t> st = strides && given != strides->end() ? given->second : rowMajor(dims);
  auto t =
      b.graph->tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(dims).set_stride(st).set_data_type(dtype));
  b.tensors[name] = t;
  return t;
}

TensorAttr byValue(Built& b, const std::string& name) {
  auto t = b.graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_dim({1, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_is_pass_by_value(true)
                               .set_data_type(fe::DataType_t::FLOAT));
  b.tensors[name] = t;
  return t;
}

// cuDNN's in-kernel dropout's seed or offset: one int64 word in device memory.
TensorAttr deviceWord(Built& b, const std::string& name) {
  auto t = b.graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_dim({1, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_data_type(fe::DataType_t::INT64));
  b.tensors[name] = t;
  return t;
}

// The strides of a [b, h, s, d] tensor held as [b, s, h, d].
std::vector<int64_t> headsInner(const std::vector<int64_t>& dims) {
  return {dims[1] * dims[2] * dims[3], dims[3], dims[1] * dims[3], 1};
}

void output(Built& b, const std::string& name, const TensorAttr& t, const std::vector<int64_t>& dims,
            fe::DataType_t dtype, const std::vector<int64_t>& strides = {}) {
  t->set_output(true)
      .set_name(name)
      .set_dim(dims)
      .set_stride(strides.empty() ? rowMajor(dims) : strides)
      .set_data_type(dtype);
  b.tensors[name] = t;
}

fe::DataType_t ioType(DataType dtype) {
  return dtype == DataType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// `mask_dtype`: what the dropout mask holds (dropoutMaskDataType), when dropout is on and meshfuse
// draws it; `cudnn_rng`: cuDNN draws it instead, from the "seed" and "offset" words.
std::shared_ptr<Built> build(cudnnHandle_t handle, bool forward, const AttentionParams& p, DataType dtype,
                             const InputStrides* strides, DataType mask_dtype, bool cudnn_rng, const Layout& layout,
                             bool tune) {
  auto b = std::make_shared<Built>();
  b->tune = tune;
  b->strided_inputs = strides != nullptr;
  b->layout.o_heads_inner = forward && layout.o_heads_inner;
  b->layout.mask_key_major = !forward && layout.mask_key_major;
  b->layout.grads_like_inputs = !forward && strides != nullptr && layout.grads_like_inputs;
  b->graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = ioType(dtype);
  const fe::DataType_t mask = mask_dtype == DataType::Float ? fe::DataType_t::FLOAT : io;
  b->graph->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::vector<int64_t> qd{p.batch, p.heads, p.seq_q, p.head_dim}, kd{p.batch, p.heads, p.seq_kv, p.head_dim},
      vd{p.batch, p.heads, p.seq_kv, p.head_dim_v}, od{p.batch, p.heads, p.seq_q, p.head_dim_v},
      sd{p.batch, p.heads, p.seq_q, 1}, md{p.batch, p.heads, p.seq_q, p.seq_kv};
  auto q = tensor(*b, "q", qd, io, strides), k = tensor(*b, "k", kd, io, strides), v = tensor(*b, "v", vd, io, strides);
  const bool dropout = p.dropout_p > 0;
  if (forward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("sdpfa_fwd")
                     .set_generate_stats(true)
                     .set_causal_mask(p.causal)
                     .set_attn_scale(static_cast<float>(p.scale));
    if (dropout && cudnn_rng)
      attrs.set_dropout(static_cast<float>(p.dropout_p), deviceWord(*b, "seed"), deviceWord(*b, "offset"));
    else if (dropout)
      attrs.set_dropout(tensor(*b, "mask", md, mask), byValue(*b, "dropout_scale"));
    auto [o, stats] = b->graph->sdpa(q, k, v, attrs);
    output(*b, "o", o, od, io, b->layout.o_heads_inner ? headsInner(od) : std::vector<int64_t>{});
    output(*b, "stats", stats, sd, fe::DataType_t::FLOAT);
  } else {
    auto o = tensor(*b, "o", od, io, strides), dO = tensor(*b, "dO", od, io, strides);
    auto stats = tensor(*b, "stats", sd, fe::DataType_t::FLOAT);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpfa_bwd")
                     .set_causal_mask(p.causal)
                     .set_attn_scale(static_cast<float>(p.scale));
    if (dropout && cudnn_rng)
      attrs.set_dropout(static_cast<float>(p.dropout_p), deviceWord(*b, "seed"), deviceWord(*b, "offset"));
    else if (dropout) {
      const InputStrides mask_strides{{"mask", {p.heads * p.seq_kv * p.seq_q, p.seq_kv * p.seq_q, 1, p.seq_q}}};
      attrs.set_dropout(tensor(*b, "mask", md, mask, b->layout.mask_key_major ? &mask_strides : nullptr),
                        byValue(*b, "dropout_scale"), byValue(*b, "dropout_scale_inv"));
    }
    auto [dq, dk, dv] = b->graph->sdpa_backward(q, k, v, o, dO, stats, attrs);
    const auto like = [&](const char* input) {
      return b->layout.grads_like_inputs ? strides->at(input) : std::vector<int64_t>{};
    };
    output(*b, "dq", dq, qd, io, like("q"));
    output(*b, "dk", dk, kd, io, like("k"));
    output(*b, "dv", dv, vd, io, like("v"));
  }
  checkCudnn(b->graph->validate(), "validate");
  checkCudnn(b->graph->build_operation_graph(handle), "build_operation_graph");
  createAttentionPlans(*b->graph, handle, tune);
  checkCudnn(b->graph->get_workspace_size(b->workspace), "get_workspace_size");
  return b;
}

// What the graph's dropout input is: 0 none, -1 cuDNN's own generator, else 1 + the mask's dtype.
int maskKey(const AttentionParams& p, DataType mask_dtype, bool cudnn_rng) {
  if (p.dropout_p <= 0) return 0;
  return cudnn_rng ? -1 : 1 + static_cast<int>(mask_dtype);
}

// The graph for these parameters and input strides. cuDNN reads strided q, k, v (o, dO) in place,
// as the transformer's q/k/v views of the fused qkv projection arrive; when it refuses a layout,
// the graph is built for dense inputs instead (and the call binds dense copies). `mask_dtype` is
// dropoutMaskDataType's answer, read once per call.
std::shared_ptr<Built> cachedGraph(int device, bool forward, const AttentionParams& p, DataType dtype,
                                   DataType mask_dtype, const InputStrides& strides, bool cudnn_rng,
                                   const Layout& wanted) {
  const bool tune = attentionAutotuneEnabled();
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<Built> > cache;
  const Key key{device,
                forward,
                static_cast<int>(dtype),
                p.batch,
                p.heads,
                p.seq_q,
                p.seq_kv,
                p.head_dim,
                p.head_dim_v,
                p.causal,
                p.scale,
                maskKey(p, mask_dtype, cudnn_rng),
                strides,
                cudnn_rng ? p.dropout_p : 0.0,
                wanted.tie(),
                tune};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // The layouts to try, most preferred first: strided inputs read in place, then dense copies;
  // the wanted output and mask layouts, then each given up (gradients like the inputs first, then
  // the key-major mask, then o heads-inner). The last is not caught (cuDNN's error reaches the user).
  std::vector<std::pair<const InputStrides*, Layout> > layouts;
  for (const InputStrides* in : {strides.empty() ? nullptr : &strides, static_cast<const InputStrides*>(nullptr)})
    for (bool o_inner : {wanted.o_heads_inner, false})
      for (bool key_major : {wanted.mask_key_major, false})
        for (bool grads : {wanted.grads_like_inputs && in != nullptr, false}) {
          const std::pair<const InputStrides*, Layout> layout{in, Layout{o_inner, key_major, grads}};
          if (std::find(layouts.begin(), layouts.end(), layout) == layouts.end()) layouts.push_back(layout);
        }
  std::shared_ptr<Built> built;
  for (size_t i = 0; i < layouts.size() && !built; ++i) {
    try {
      built =
          build(handleFor(device), forward, p, dtype, layouts[i].first, mask_dtype, cudnn_rng, layouts[i].second, tune);
    } catch (const std::runtime_error&) {
      if (i + 1 == layouts.size()) throw;
    }
  }
  cache.emplace(key, built);
  return built;
}

// The strides of `t` when cuDNN can read it in place (4-D, last axis contiguous, the other strides
// and the address 16-byte multiples); empty when it must be made dense.
std::vector<int64_t> inPlaceStrides(const Tensor& t) {
  if (t.dim() != 4 || t.isContiguous()) return {};
  const int64_t per16 = 16 / static_cast<int64_t>(dataTypeSize(t.dtype()));
  const std::vector<int64_t>& st = t.strides();
  if (st[3] != 1 && t.size(3) != 1) return {};
  for (int d = 0; d < 3; ++d)
    if (st[d] < 0 || (t.size(d) != 1 && st[d] % per16 != 0)) return {};
  if (reinterpret_cast<uintptr_t>(t.data()) % 16 != 0) return {};
  std::vector<int64_t> out = st;
  out[3] = 1;
  for (int d = 0; d < 3; ++d)  // an axis of extent 1 gets a canonical stride (it is never stepped)
    if (t.size(d) == 1) out[d] = 0;
  return out;
}

// The gradients' buffer (attention_layout.h) when cuDNN reads q, k, v in place and can write its
// outputs at their places (16-byte aligned).
std::optional<GradientBuffer> gradientsLikeInputs(const Tensor& q, const Tensor& k, const Tensor& v,
                                                  const std::set<std::string>& in_place) {
  for (const char* name : {"q", "k", "v"})
    if (in_place.count(name) == 0) return std::nullopt;
  for (const Tensor* t : {&k, &v})
    if ((t->byteOffset() - q.byteOffset()) % 16 != 0) return std::nullopt;
  return gradientBufferLike(q, k, v);
}

// The graph's name in the tuning log: direction, shape, dtype, causal, dropout.
std::string describe(const Expr& e, const AttentionParams& p, DataType dtype, bool cudnn_rng) {
  return toString(e.op()) + " [" + std::to_string(p.batch) + ", " + std::to_string(p.heads) + ", " +
         std::to_string(p.seq_q) + "x" + std::to_string(p.seq_kv) + ", " + std::to_string(p.head_dim) + "] " +
         toString(dtype) + (p.causal ? " causal" : "") +
         (p.dropout_p > 0 ? (cudnn_rng ? " dropout (cuDNN's)" : " dropout (meshfuse's mask)") : "");
}

int64_t readScalar(const Tensor& t) { return t.to(Device::cpu()).contiguous().dataAs<int64_t>()[0]; }

}  // namespace

std::vector<Tensor> runAttention(int device, const Expr& e, AttentionParams p, const std::vector<Tensor>& tensors) {
  using namespace ops::sdpa;
  const bool forward = e.op() == OpType::SdpaFwd;
  const DataType dtype = tensors[forward ? size_t{kQ} : size_t{kBwdQ}].dtype();
  checkSupported(e, p, dtype);
  // The backward needs the forward's Philox seed and offset only to rebuild the dropout mask. Host
  // tensors are read here; device ones (the forward's outputs) are read by the mask kernel itself,
  // because copying them to the host would wait for every kernel queued before this one.
  const void* seed_at = nullptr;
  const void* offset_at = nullptr;
  if (!forward && p.dropout_p > 0) {
    const Tensor& seed = tensors[kBwdSeed];
    const Tensor& offset = tensors[kBwdOffset];
    if (seed.device() == Device::cuda(device) && offset.device() == Device::cuda(device) &&
        seed.dtype() == DataType::Int && offset.dtype() == DataType::Int) {
      seed_at = seed.data();
      offset_at = offset.data();
    } else {
      p.seed = static_cast<uint64_t>(readScalar(seed));
      p.offset = static_cast<uint64_t>(readScalar(offset));
    }
  }
  DeviceGuard guard(device);
  const Device dev = Device::cuda(device);
  // The inputs cuDNN may read in place, by graph name.
  const std::vector<std::pair<const char*, size_t> > strided_inputs =
      forward ? std::vector<std::pair<const char*, size_t> >{{"q", kQ}, {"k", kK}, {"v", kV}}
              : std::vector<std::pair<const char*, size_t> >{
                    {"dO", kBwdGradOut}, {"q", kBwdQ}, {"k", kBwdK}, {"v", kBwdV}, {"o", kBwdOut}};
  const bool dropout = p.dropout_p > 0;
  // Who draws the mask (MESHFUSE_ATTENTION_RNG) and, when meshfuse does, what it holds
  // (MESHFUSE_ATTENTION_MASK): read once for the graph and the mask kernel.
  const bool cudnn_rng = dropout && attentionRngFromEnvironment() == AttentionRng::Cudnn;
  const bool explicit_mask = dropout && !cudnn_rng;
  const DataType mask_dtype = explicit_mask ? dropoutMaskDataType(p.dropout_p, dtype) : DataType::Float;
  Layout wanted;
  wanted.o_heads_inner = forward;
  wanted.mask_key_major = explicit_mask && !forward && backwardMaskOrderFromEnvironment() == MaskOrder::KeyMajor;
  InputStrides strides;
  std::set<std::string> in_place;  // the inputs whose own layout the strided graph describes
  for (const auto& [name, index] : strided_inputs) {
    std::vector<int64_t> st = inPlaceStrides(tensors[index]);
    if (!st.empty()) in_place.insert(name);
    strides[name] = st.empty() ? rowMajor(tensors[index].shape()) : st;
  }
  if (in_place.empty()) strides.clear();  // every input dense: the plain graph
  const std::optional<GradientBuffer> grads_buffer =
      forward ? std::nullopt : gradientsLikeInputs(tensors[kBwdQ], tensors[kBwdK], tensors[kBwdV], in_place);
  wanted.grads_like_inputs = grads_buffer.has_value();
  std::optional<host_span::Scope> lookup_span(std::in_place, "cuDNN: graph lookup");
  auto built = cachedGraph(device, forward, p, dtype, mask_dtype, strides, cudnn_rng, wanted);
  cudnnHandle_t handle = handleFor(device);
  lookup_span.reset();
  {
    host_span::Scope span("cudnnSetStream");
    if (cudnnSetStream(handle, currentStream(device)) != CUDNN_STATUS_SUCCESS)
      throw std::runtime_error("cuDNN attention: cudnnSetStream failed");
  }
  std::unordered_map<TensorAttr, void*> pack;
  std::vector<Tensor> keep;  // what is bound (inputs or their dense copies), alive until the call is queued
  auto bind = [&](const std::string& name, const Tensor& t) {
    Tensor bound = built->strided_inputs && in_place.count(name) > 0 ? t : t.contiguous();
    // cuDNN's kernels need 16-byte aligned addresses; a contiguous view that starts mid-vector (a
    // slice at an odd offset) is bound as an aligned copy. (Strided inputs were checked above.)
    if (reinterpret_cast<uintptr_t>(bound.data()) % 16 != 0) bound = bound.clone();
    keep.push_back(bound);
    pack[built->tensors.at(name)] = keep.back().data();
  };
  // The mask carries the keep scale (dropout_mask.h says why), so both scales cuDNN takes are 1, or
  // the correction of a narrow mask's rounded scale (measured and tested on the H200 in session 10).
  float dropout_scale = explicit_mask ? dropoutScaleCorrection(p.dropout_p, mask_dtype) : 1.0F;
  float dropout_scale_inv = 1.0F / dropout_scale;
  if (explicit_mask) {
    // Bound as drawn: a key-major mask is a permuted view the graph's mask strides describe.
    keep.push_back(dropoutMask(device, p, mask_dtype, seed_at, offset_at,
                               built->layout.mask_key_major ? MaskOrder::KeyMajor : MaskOrder::QueryMajor));
    pack[built->tensors.at("mask")] = keep.back().data();
    pack[built->tensors.at("dropout_scale")] = &dropout_scale;
    if (!forward) pack[built->tensors.at("dropout_scale_inv")] = &dropout_scale_inv;
  }
  // The forward's philox_seed and philox_offset outputs, written ahead of cuDNN's kernels (which
  // read them when they draw the mask).
  std::pair<Tensor, Tensor> philox;
  if (forward) philox = devicePhiloxScalars(device, static_cast<int64_t>(p.seed), static_cast<int64_t>(p.offset));
  if (cudnn_rng) {
    // The words cuDNN's generator reads: the forward's outputs, or the backward's inputs when they
    // are 16-byte aligned device words; a shard of the heads or the batch (and a misaligned or host
    // input) gets words of its own from one one-thread kernel, its seed mixed with the shard's key.
    const uint64_t key = cudnnShardKey(p);
    const auto aligned = [](const void* at) { return at != nullptr && reinterpret_cast<uintptr_t>(at) % 16 == 0; };
    std::pair<Tensor, Tensor> words;
    if (forward && key == 0)
      words = philox;
    else if (!forward && key == 0 && aligned(seed_at) && aligned(offset_at))
      words = {tensors[kBwdSeed], tensors[kBwdOffset]};
    else
      words = cudnnPhiloxWords(device, seed_at, offset_at, p.seed, p.offset, key);
    keep.push_back(words.first);
    keep.push_back(words.second);
    pack[built->tensors.at("seed")] = words.first.data();
    pack[built->tensors.at("offset")] = words.second.data();
  }
  std::vector<Tensor> outputs;
  if (forward) {
    bind("q", tensors[kQ]);
    bind("k", tensors[kK]);
    bind("v", tensors[kV]);
    Tensor o = built->layout.o_heads_inner
                   ? Tensor::empty({p.batch, p.seq_q, p.heads, p.head_dim_v}, dtype, dev).permute({0, 2, 1, 3})
                   : Tensor::empty({p.batch, p.heads, p.seq_q, p.head_dim_v}, dtype, dev);
    Tensor lse = Tensor::empty({p.batch, p.heads, p.seq_q}, DataType::Float, dev);
    pack[built->tensors.at("o")] = o.data();
    pack[built->tensors.at("stats")] = lse.data();
    outputs = {o, lse, philox.first, philox.second};
  } else {
    bind("dO", tensors[kBwdGradOut]);
    bind("q", tensors[kBwdQ]);
    bind("k", tensors[kBwdK]);
    bind("v", tensors[kBwdV]);
    bind("o", tensors[kBwdOut]);
    bind("stats", tensors[kBwdLse]);
    // dq, dk, dv: views of one buffer laid out as q, k, v are where the graph writes them so, else
    // three dense tensors.
    if (built->layout.grads_like_inputs)
      outputs = gradientViews(*grads_buffer, tensors[kBwdQ], tensors[kBwdK], tensors[kBwdV], dtype, dev);
    else
      for (size_t index : {kBwdQ, kBwdK, kBwdV}) outputs.push_back(Tensor::empty(tensors[index].shape(), dtype, dev));
    for (size_t i = 0; i < 3; ++i) pack[built->tensors.at(std::string("d") + "qkv"[i])] = outputs[i].data();
  }
  if (built->tune)
    std::call_once(built->plan.tuned, [&] {
      tuneAttentionPlan(built->plan, *built->graph, handle, pack, device, currentStream(device),
                        describe(e, p, dtype, cudnn_rng));
    });
  // Workspace from the caching allocator (as int64 words), freed back to it after the call is queued.
  const int64_t plan = built->plan.index;
  const int64_t workspace_bytes = plan >= 0 ? built->plan.workspace : built->workspace;
  Tensor workspace = Tensor::empty({(workspace_bytes + 7) / 8}, DataType::Int, dev);
  void* workspace_at = workspace_bytes > 0 ? workspace.data() : nullptr;
  host_span::Scope execute_span("cuDNN execute");
  if (plan >= 0)
    checkCudnn(built->graph->execute_plan_at_index(handle, pack, workspace_at, plan), "execute");
  else
    checkCudnn(built->graph->execute(handle, pack, workspace_at), "execute");
  return outputs;
}

#endif

}  // namespace meshfuse::cuda
