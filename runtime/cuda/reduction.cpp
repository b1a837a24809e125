// Generated reduction kernels (see reduction.h).
#include "runtime/cuda/reduction.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "runtime/cuda/kernel_cache.h"
#include "runtime/cuda/pointwise_codegen.h"
#include "runtime/cuda/streams.h"

namespace meshfuse::cuda {

namespace {
constexpr int kRowBlock = 256;
constexpr int kColX = 32, kColY = 16;
const char* const kKernelName = "meshfuse_reduction";

std::string accType(DataType out) { return computeType(out) == "bool" ? "int" : computeType(out); }

std::string identity(OpType op, DataType out) {
  const std::string acc = accType(out);
  if (op != OpType::ReduceMax) return "static_cast<" + acc + ">(0)";
  if (acc == "float") return "-__int_as_float(0x7f800000)";
  if (acc == "double") return "-__longlong_as_double(0x7ff0000000000000LL)";
  if (acc == "i64") return "(-9223372036854775807LL - 1)";
  if (acc == "int") return out == DataType::Bool ? "0" : "(-2147483647 - 1)";
  throw std::logic_error("reduction identity: unexpected accumulator " + acc);
}

std::string combine(OpType op, DataType out) {
  const std::string acc = accType(out);
  if (op != OpType::ReduceMax) return "a + b";
  if (acc == "float") return "fmaxf(a, b)";
  if (acc == "double") return "fmax(a, b)";
  return "(a > b ? a : b)";
}

// Groups of axes with their extents and input strides, extent-1 axes dropped, neighbours merged.
struct AxisGroup {
  std::vector<int64_t> extents, strides;
};
AxisGroup makeGroup(const Tensor& x, const std::vector<bool>& take) {
  AxisGroup g;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!take[d] || x.size(d) == 1) continue;
    if (!g.extents.empty() && g.strides.back() == x.strides()[d] * x.size(d)) {
      g.extents.back() *= x.size(d);
      g.strides.back() = x.strides()[d];
    } else {
      g.extents.push_back(x.size(d));
      g.strides.push_back(x.strides()[d]);
    }
  }
  if (g.extents.empty()) {
    g.extents.push_back(1);
    g.strides.push_back(0);
  }
  return g;
}
}  // namespace

size_t reductionParamWords(const ReductionVariant& v) {
  return 5 + 2 * static_cast<size_t>(v.kept_ndim) + 2 * static_cast<size_t>(v.reduced_ndim);
}

std::string generateReductionSource(OpType op, DataType in, DataType out, const ReductionVariant& v,
                                    const std::string& name) {
  if (!isReduction(op)) throw std::invalid_argument("CUDA reduction codegen: " + toString(op) + " is not a reduction");
  const std::string acc = accType(out), sin = storageType(in), sout = storageType(out);
  std::ostringstream s;
  s << kernelPrelude();
  s << "struct Params {\n  const void* in;\n  void* out;\n  i64 n_out;\n  i64 n_red;\n  double scale;\n"
    << "  i64 kshape[" << v.kept_ndim << "];\n  i64 kstride[" << v.kept_ndim << "];\n"
    << "  i64 rshape[" << v.reduced_ndim << "];\n  i64 rstride[" << v.reduced_ndim << "];\n};\n"
    << "static_assert(sizeof(Params) == " << 8 * reductionParamWords(v)
    << ", \"host and device disagree on the parameter block\");\n\n";
  s << "__device__ __forceinline__ " << acc << " combine(" << acc << " a, " << acc << " b) { return "
    << combine(op, out) << "; }\n";
  // Offset of a linear index within a group of axes (innermost last).
  for (const char* g : {"k", "r"}) {
    int nd = std::string(g) == "k" ? v.kept_ndim : v.reduced_ndim;
    s << "__device__ __forceinline__ i64 " << g << "offset(const Params& p, i64 i) {\n  i64 off = 0;\n"
      << "#pragma unroll\n  for (int d = " << nd - 1 << "; d >= 0; --d) {\n    off += (i % p." << g << "shape[d]) * p."
      << g << "stride[d];\n    i /= p." << g << "shape[d];\n  }\n  return off;\n}\n";
  }
  s << "__device__ __forceinline__ " << acc << " load(const Params& p, i64 off) {\n  return "
    << loadConvert("static_cast<const " + sin + "*>(p.in)[off]", in, out == DataType::Bool ? DataType::Int32 : out)
    << ";\n}\n";
  s << "__device__ __forceinline__ void store(const Params& p, i64 o, " << acc << " a) {\n";
  if (op == OpType::Mean) s << "  a = a * static_cast<" << acc << ">(p.scale);\n";
  s << "  static_cast<" << sout
    << "*>(p.out)[o] = " << storeConvert("a", out == DataType::Bool ? DataType::Int32 : out, out) << ";\n}\n\n";

  if (v.row) {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kRowBlock << ") " << name << "(const Params p) {\n"
      << "  __shared__ " << acc << " warp_acc[" << kRowBlock / 32 << "];\n"
      << "  for (i64 o = blockIdx.x; o < p.n_out; o += gridDim.x) {\n"
      << "    const i64 base = koffset(p, o);\n"
      << "    " << acc << " a = " << identity(op, out) << ";\n"
      << "    for (i64 r = threadIdx.x; r < p.n_red; r += blockDim.x) a = combine(a, load(p, base + roffset(p, r)));\n"
      << "#pragma unroll\n    for (int m = 16; m > 0; m >>= 1) a = combine(a, __shfl_xor_sync(0xffffffffu, a, m));\n"
      << "    if ((threadIdx.x & 31) == 0) warp_acc[threadIdx.x >> 5] = a;\n"
      << "    __syncthreads();\n"
      << "    if (threadIdx.x == 0) {\n"
      << "      for (int w = 1; w < " << kRowBlock / 32 << "; ++w) a = combine(a, warp_acc[w]);\n"
      << "      store(p, o, a);\n    }\n    __syncthreads();\n  }\n}\n";
  } else {
    s << "extern \"C\" __global__ void __launch_bounds__(" << kColX * kColY << ") " << name << "(const Params p) {\n"
      << "  __shared__ " << acc << " part[" << kColY << "][" << kColX + 1 << "];\n"
      << "  for (i64 o0 = static_cast<i64>(blockIdx.x) * " << kColX
      << "; o0 < p.n_out; o0 += static_cast<i64>(gridDim.x) * " << kColX << ") {\n"
      << "    const i64 o = o0 + threadIdx.x;\n"
      << "    " << acc << " a = " << identity(op, out) << ";\n"
      << "    if (o < p.n_out) {\n      const i64 base = koffset(p, o);\n"
      << "      for (i64 r = threadIdx.y; r < p.n_red; r += blockDim.y) a = combine(a, load(p, base + roffset(p, "
         "r)));\n"
      << "    }\n    part[threadIdx.y][threadIdx.x] = a;\n    __syncthreads();\n"
      << "    if (threadIdx.y == 0 && o < p.n_out) {\n"
      << "      for (int y = 1; y < " << kColY << "; ++y) a = combine(a, part[y][threadIdx.x]);\n"
      << "      store(p, o, a);\n    }\n    __syncthreads();\n  }\n}\n";
  }
  return s.str();
}

void runReduction(int device, OpType op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out) {
  if (x.device() != Device::cuda(device) || out.device() != Device::cuda(device))
    throw std::invalid_argument("CUDA reduction: " + x.toString() + " -> " + out.toString() +
                                " must be on cuda:" + std::to_string(device));
  if (!out.isContiguous()) throw std::invalid_argument("CUDA reduction: the output must be contiguous");
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), false);
  for (int64_t a : axes) {
    int64_t n = a < 0 ? a + x.dim() : a;
    if (n < 0 || n >= x.dim())
      throw std::invalid_argument("CUDA reduction: axis " + std::to_string(a) + " is out of range for " + x.toString());
    reduced[n] = true;
  }
  std::vector<bool> kept(reduced.size());
  int64_t n_out = 1, n_red = 1;
  for (size_t d = 0; d < reduced.size(); ++d) {
    kept[d] = !reduced[d];
    (reduced[d] ? n_red : n_out) *= x.size(static_cast<int64_t>(d));
  }
  if (out.numel() != n_out)
    throw std::invalid_argument("CUDA reduction: output " + out.toString() + " does not hold the " +
                                std::to_string(n_out) + " kept elements of " + x.toString());
  if (n_out == 0) return;
  if (n_red == 0 && op == OpType::ReduceMax)
    throw std::invalid_argument("CUDA reduction: max over an empty axis of " + x.toString());
  const AxisGroup k = makeGroup(x, kept), r = makeGroup(x, reduced);

  ReductionVariant v;
  v.kept_ndim = static_cast<int>(k.extents.size());
  v.reduced_ndim = static_cast<int>(r.extents.size());
  v.row = r.strides.back() == 1 || n_out == 1;  // contiguous reduced elements, or a single output

  std::vector<uint64_t> words;
  words.push_back(reinterpret_cast<uintptr_t>(x.data()));
  words.push_back(reinterpret_cast<uintptr_t>(out.data()));
  words.push_back(static_cast<uint64_t>(n_out));
  words.push_back(static_cast<uint64_t>(n_red));
  double scale = n_red > 0 ? 1.0 / static_cast<double>(n_red) : 0.0;
  uint64_t w;
  std::memcpy(&w, &scale, 8);
  words.push_back(w);
  for (const auto* vec : {&k.extents, &k.strides, &r.extents, &r.strides})
    for (int64_t e : *vec) words.push_back(static_cast<uint64_t>(e));

  if (words.size() != reductionParamWords(v)) throw std::logic_error("CUDA reduction: parameter block size mismatch");
  const DataType in_t = x.dtype(), out_t = out.dtype();
  const std::string key = "reduction|" + std::to_string(static_cast<int>(op)) + "|" +
                          std::to_string(static_cast<int>(in_t)) + ">" + std::to_string(static_cast<int>(out_t)) +
                          "|k" + std::to_string(v.kept_ndim) + "r" + std::to_string(v.reduced_ndim) +
                          (v.row ? "row" : "col");
  KernelFunction kernel = cachedKernel(
      device, key, [&] { return generateReductionSource(op, in_t, out_t, v, kKernelName); }, kKernelName);
  const int64_t max_blocks = static_cast<int64_t>(multiprocessorCount(device)) * 16;
  DeviceGuard guard(device);
  if (v.row) {
    unsigned grid = static_cast<unsigned>(std::min(n_out, max_blocks));
    launchKernel(kernel, grid, kRowBlock, currentStream(device), words.data());
  } else {
    unsigned grid = static_cast<unsigned>(std::min((n_out + kColX - 1) / kColX, max_blocks));
    launchKernel(kernel, grid, kColX, currentStream(device), words.data(), 0, 1, kColY);
  }
}

}  // namespace meshfuse::cuda
