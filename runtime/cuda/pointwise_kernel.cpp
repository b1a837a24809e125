// Variant choice, parameter packing and launch of the fused pointwise kernels.
#include "runtime/cuda/pointwise_kernel.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/streams.h"
#include "runtime/host_span.h"

namespace meshfuse::cuda {

namespace {
constexpr int kBlock = 256;
constexpr int kBlocksPerSm = 8;
const char* const kKernelName = "meshfuse_pointwise";

std::vector<int64_t> iterationShape(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  size_t rank = 0;
  for (const auto* group : {&inputs, &outputs})
    for (const Tensor& t : *group) rank = std::max(rank, t.shape().size());
  std::vector<int64_t> shape(rank, 1);
  for (const auto* group : {&inputs, &outputs})
    for (const Tensor& t : *group) {
      size_t offset = rank - t.shape().size();
      for (size_t d = 0; d < t.shape().size(); ++d) {
        int64_t e = t.shape()[d];
        int64_t& s = shape[offset + d];
        if (e == s || e == 1) continue;
        if (s != 1)
          throw std::invalid_argument("CUDA pointwise: " + t.toString() + " does not broadcast to " +
                                      shapeToString(shape));
        s = e;
      }
    }
  return shape;
}

// The strides of `t` over the iteration shape: zero where it broadcasts.
std::vector<int64_t> alignedStrides(const Tensor& t, const std::vector<int64_t>& iter) {
  std::vector<int64_t> st(iter.size(), 0);
  size_t offset = iter.size() - t.shape().size();
  for (size_t d = 0; d < t.shape().size(); ++d)
    st[offset + d] = (t.shape()[d] == 1 && iter[offset + d] != 1) ? 0 : t.strides()[d];
  return st;
}

bool denseOver(const Tensor& t, const std::vector<int64_t>& iter) { return t.shape() == iter && t.isContiguous(); }

struct Layout {
  std::vector<int64_t> iter;
  std::vector<std::vector<int64_t>> strides;  // inputs then outputs
};

// Drops extent-1 axes and merges neighbours that are contiguous in every tensor.
Layout coalesce(const std::vector<int64_t>& iter, const std::vector<std::vector<int64_t>>& strides) {
  Layout out;
  out.strides.resize(strides.size());
  for (size_t d = 0; d < iter.size(); ++d) {
    if (iter[d] == 1) continue;
    bool merge = !out.iter.empty();
    for (size_t t = 0; merge && t < strides.size(); ++t) merge = out.strides[t].back() == strides[t][d] * iter[d];
    if (merge) {
      out.iter.back() *= iter[d];
      for (size_t t = 0; t < strides.size(); ++t) out.strides[t].back() = strides[t][d];
    } else {
      out.iter.push_back(iter[d]);
      for (size_t t = 0; t < strides.size(); ++t) out.strides[t].push_back(strides[t][d]);
    }
  }
  if (out.iter.empty()) {
    out.iter.push_back(1);
    for (auto& s : out.strides) s.push_back(0);
  }
  return out;
}

bool fits32(const Layout& l) {
  const int64_t limit = int64_t{1} << 31;
  if (numelOf(l.iter) >= limit) return false;
  for (const auto& st : l.strides) {
    int64_t span = 0;
    for (size_t d = 0; d < l.iter.size(); ++d) span += (l.iter[d] - 1) * st[d];
    if (span >= limit) return false;
  }
  return true;
}

void checkDevice(const Tensor& t, int device, const char* role) {
  if (t.device() != Device::cuda(device))
    throw std::invalid_argument(std::string("CUDA pointwise: ") + role + " " + t.toString() +
                                " is not on cuda:" + std::to_string(device));
}

// The index strides of each random op over `iter` (right-aligned, as the RandomIndex gives them).
std::vector<std::vector<int64_t>> randomStrides(const std::vector<RandomIndex>& random,
                                                const std::vector<int64_t>& iter) {
  std::vector<std::vector<int64_t>> out;
  for (const RandomIndex& r : random) {
    std::vector<int64_t> st = r.identity ? contiguousStrides(iter) : std::vector<int64_t>(iter.size(), 0);
    if (!r.identity) {
      if (r.strides.size() > iter.size()) throw std::logic_error("CUDA pointwise: random index of a higher rank");
      std::copy(r.strides.begin(), r.strides.end(), st.end() - static_cast<std::ptrdiff_t>(r.strides.size()));
    }
    out.push_back(std::move(st));
  }
  return out;
}
}  // namespace

PointwiseVariant choosePointwiseVariant(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                        const std::vector<RandomIndex>& random) {
  const std::vector<int64_t> iter = iterationShape(inputs, outputs);
  PointwiseVariant v;
  bool dense = true;
  for (const RandomIndex& r : random) dense = dense && r.identity;
  size_t widest = 1;
  for (const auto* group : {&inputs, &outputs})
    for (const Tensor& t : *group) {
      dense = dense && denseOver(t, iter);
      widest = std::max(widest, t.itemsize());
    }
  if (dense) {
    v.contiguous = true;
    int vec = static_cast<int>(16 / widest);
    auto aligned = [&](int w) {
      for (const auto* group : {&inputs, &outputs})
        for (const Tensor& t : *group)
          if (reinterpret_cast<uintptr_t>(t.data()) % (static_cast<uintptr_t>(w) * t.itemsize()) != 0) return false;
      return true;
    };
    while (vec > 1 && !aligned(vec)) vec /= 2;
    v.vector_width = vec;
    return v;
  }
  std::vector<std::vector<int64_t>> strides;
  for (const auto* group : {&inputs, &outputs})
    for (const Tensor& t : *group) strides.push_back(alignedStrides(t, iter));
  for (auto& st : randomStrides(random, iter)) strides.push_back(std::move(st));
  Layout l = coalesce(iter, strides);
  v.contiguous = false;
  v.ndim = static_cast<int>(l.iter.size());
  v.index32 = fits32(l);
  return v;
}

void runPointwise(int device, const PointwiseProgram& program, const std::vector<Tensor>& inputs,
                  const std::vector<double>& scalars, const std::vector<Tensor>& outputs,
                  const std::vector<RandomIndex>& random_in, const std::string& program_key) {
  host_span::Scope span("pointwise: checks and parameters");
  std::vector<RandomIndex> random = random_in;
  random.resize(static_cast<size_t>(program.numRandom()));
  if (inputs.size() != program.inputs.size() || outputs.size() != program.outputs.size() ||
      static_cast<int>(scalars.size()) != program.num_scalars)
    throw std::invalid_argument("CUDA pointwise: the program takes " + std::to_string(program.inputs.size()) +
                                " inputs, " + std::to_string(program.num_scalars) + " scalars and " +
                                std::to_string(program.outputs.size()) + " outputs");
  const std::vector<DataType> out_types = program.outputDtypes();
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkDevice(inputs[i], device, "input");
    if (inputs[i].dtype() != program.inputs[i])
      throw std::invalid_argument("CUDA pointwise: input " + std::to_string(i) + " is " + inputs[i].toString() +
                                  ", the program expects " + toString(program.inputs[i]));
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    checkDevice(outputs[o], device, "output");
    if (outputs[o].dtype() != out_types[o])
      throw std::invalid_argument("CUDA pointwise: output " + std::to_string(o) + " is " + outputs[o].toString() +
                                  ", the program produces " + toString(out_types[o]));
  }
  const std::vector<int64_t> iter = iterationShape(inputs, outputs);
  const int64_t n = numelOf(iter);
  if (n == 0) return;

  const PointwiseVariant variant = choosePointwiseVariant(inputs, outputs, random);
  std::vector<uint64_t> words;
  words.reserve(pointwiseParamWords(program, variant));
  auto push_ptr = [&](const void* p) { words.push_back(reinterpret_cast<uintptr_t>(p)); };
  auto push_double = [&](double d) {
    uint64_t w;
    std::memcpy(&w, &d, 8);
    words.push_back(w);
  };
  for (const Tensor& t : inputs) push_ptr(t.data());
  if (inputs.empty()) push_ptr(nullptr);
  for (const Tensor& t : outputs) push_ptr(t.data());
  for (double s : scalars) push_double(s);
  if (scalars.empty()) push_double(0);
  words.push_back(static_cast<uint64_t>(n));
  for (const RandomIndex& r : random) words.push_back(static_cast<uint64_t>(r.identity ? 0 : r.base));
  if (!variant.contiguous) {
    std::vector<std::vector<int64_t>> strides;
    for (const Tensor& t : inputs) strides.push_back(alignedStrides(t, iter));
    if (inputs.empty()) strides.push_back(std::vector<int64_t>(iter.size(), 0));
    for (const Tensor& t : outputs) strides.push_back(alignedStrides(t, iter));
    for (auto& st : randomStrides(random, iter)) strides.push_back(std::move(st));
    Layout l = coalesce(iter, strides);
    for (int64_t e : l.iter) words.push_back(static_cast<uint64_t>(e));
    for (const auto& st : l.strides)
      for (int64_t s : st) words.push_back(static_cast<uint64_t>(s));
  }
  if (words.size() != pointwiseParamWords(program, variant))
    throw std::logic_error("CUDA pointwise: parameter block size mismatch");

  const std::string key = "pointwise|" + (program_key.empty() ? program.key() : program_key) + "|" + variant.key();
  KernelFunction kernel = cachedKernel(
      device, key, [&] { return generatePointwiseSource(program, variant, kKernelName); }, kKernelName);
  const int64_t per_thread = pointwiseElementsPerThread(program, variant);
  const int64_t work = (n + per_thread - 1) / per_thread;
  const int64_t max_blocks = static_cast<int64_t>(multiprocessorCount(device)) * kBlocksPerSm;
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, std::min((work + kBlock - 1) / kBlock, max_blocks)));
  DeviceGuard guard(device);
  launchKernel(kernel, grid, kBlock, currentStream(device), words.data());
}

}  // namespace meshfuse::cuda
