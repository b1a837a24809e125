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

std::string combine(OpType op) {
  if (op != OpType::ReduceMax) return "a + b";
  // NaN wins, as in the CPU's reductions and numpy's max (fmaxf dropped it); false for integers.
  return "((a != a || a > b) ? a : b)";
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
  s << "__device__ __forceinline__ " << acc << " combine(" << acc << " a, " << acc << " b) { return " << combine(op)
    << "; }\n";
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

std::string generateColumnReductionSource(OpType op, DataType in, DataType out, const ColumnReductionVariant& v,
                                          const std::string& name) {
  if (!isReduction(op)) throw std::invalid_argument("CUDA reduction codegen: " + toString(op) + " is not a reduction");
  const std::string acc = accType(out), sin = storageType(in), sout = storageType(out);
  const int cols_per_block = kColX * v.vec;
  std::ostringstream s;
  s << kernelPrelude();
  s << "struct Params {\n  const void* in;\n  void* out;\n  i64 rows;\n  i64 cols;\n  i64 row_stride;\n"
    << "  i64 rows_per_split;\n  double scale;\n};\n"
    << "static_assert(sizeof(Params) == " << 8 * kColumnReductionParamWords
    << ", \"host and device disagree on the parameter block\");\n\n";
  s << "__device__ __forceinline__ " << acc << " combine(" << acc << " a, " << acc << " b) { return " << combine(op)
    << "; }\n";
  // One 16-byte load: `vec` adjacent columns of one row, combined into the thread's accumulators.
  s << "__device__ __forceinline__ void add(" << acc << " (&a)[" << v.vec << "], const uint4 raw) {\n"
    << "  const " << sin << "* e = reinterpret_cast<const " << sin << "*>(&raw);\n"
    << "#pragma unroll\n  for (int j = 0; j < " << v.vec << "; ++j) a[j] = combine(a[j], "
    << loadConvert("e[j]", in, out) << ");\n}\n\n";
  s << "extern \"C\" __global__ void __launch_bounds__(" << kColX * kColY << ") " << name << "(const Params p) {\n"
    << "  __shared__ " << acc << " part[" << kColY << "][" << cols_per_block << "];\n"
    << "  const i64 c = (static_cast<i64>(blockIdx.x) * " << kColX << " + threadIdx.x) * " << v.vec << ";\n"
    << "  const i64 r0 = static_cast<i64>(blockIdx.y) * p.rows_per_split;\n"
    << "  const i64 r1 = min(p.rows, r0 + p.rows_per_split);\n"
    << "  " << acc << " a[" << v.vec << "];\n"
    << "#pragma unroll\n  for (int j = 0; j < " << v.vec << "; ++j) a[j] = " << identity(op, out) << ";\n"
    << "  if (c < p.cols) {\n"
    << "    const " << sin << "* base = static_cast<const " << sin << "*>(p.in) + c;\n"
    << "    const i64 step = static_cast<i64>(" << kColY << ") * p.row_stride;\n"
    << "    i64 r = r0 + threadIdx.y;\n"
    << "    const " << sin
    << "* at = base + r * p.row_stride;\n"
    // Four rows in flight per thread: the loads are issued before any is combined.
    << "    for (; r + " << 3 * kColY << " < r1; r += " << 4 * kColY << ", at += 4 * step) {\n"
    << "      const uint4 x0 = __ldg(reinterpret_cast<const uint4*>(at));\n"
    << "      const uint4 x1 = __ldg(reinterpret_cast<const uint4*>(at + step));\n"
    << "      const uint4 x2 = __ldg(reinterpret_cast<const uint4*>(at + 2 * step));\n"
    << "      const uint4 x3 = __ldg(reinterpret_cast<const uint4*>(at + 3 * step));\n"
    << "      add(a, x0);\n      add(a, x1);\n      add(a, x2);\n      add(a, x3);\n    }\n"
    << "    for (; r < r1; r += " << kColY << ", at += step) add(a, __ldg(reinterpret_cast<const uint4*>(at)));\n"
    << "  }\n"
    << "#pragma unroll\n  for (int j = 0; j < " << v.vec << "; ++j) part[threadIdx.y][threadIdx.x * " << v.vec
    << " + j] = a[j];\n"
    << "  __syncthreads();\n"
    << "  for (int col = threadIdx.y * " << kColX << " + threadIdx.x; col < " << cols_per_block
    << "; col += " << kColX * kColY << ") {\n"
    << "    const i64 oc = static_cast<i64>(blockIdx.x) * " << cols_per_block << " + col;\n"
    << "    if (oc >= p.cols) continue;\n"
    << "    " << acc << " t = part[0][col];\n"
    << "#pragma unroll\n    for (int y = 1; y < " << kColY << "; ++y) t = combine(t, part[y][col]);\n";
  if (op == OpType::Mean) s << "    t = t * static_cast<" << acc << ">(p.scale);\n";
  s << "    static_cast<" << sout
    << "*>(p.out)[static_cast<i64>(blockIdx.y) * p.cols + oc] = " << storeConvert("t", out, out) << ";\n  }\n}\n";
  return s.str();
}

namespace {
const char* const kColumnKernelName = "meshfuse_column_reduction";

// One launch of the column kernel over `rows` x `cols` at `in` (row stride `row_stride`) into `out`
// ([splits, cols], contiguous).
void launchColumnReduction(int device, OpType op, const void* in, DataType in_t, void* out, DataType out_t,
                           int64_t rows, int64_t cols, int64_t row_stride, int64_t splits, double scale) {
  ColumnReductionVariant v;
  v.vec = static_cast<int>(16 / dataTypeSize(in_t));
  const std::string key = "column_reduction|" + std::to_string(static_cast<int>(op)) + "|" +
                          std::to_string(static_cast<int>(in_t)) + ">" + std::to_string(static_cast<int>(out_t));
  KernelFunction kernel = cachedKernel(
      device, key, [&] { return generateColumnReductionSource(op, in_t, out_t, v, kColumnKernelName); },
      kColumnKernelName);
  const int64_t rows_per_split = (rows + splits - 1) / splits;
  std::vector<uint64_t> words(kColumnReductionParamWords);
  words[0] = reinterpret_cast<uintptr_t>(in);
  words[1] = reinterpret_cast<uintptr_t>(out);
  words[2] = static_cast<uint64_t>(rows);
  words[3] = static_cast<uint64_t>(cols);
  words[4] = static_cast<uint64_t>(row_stride);
  words[5] = static_cast<uint64_t>(rows_per_split);
  std::memcpy(&words[6], &scale, 8);
  const int64_t col_blocks = (cols / v.vec + kColX - 1) / kColX;
  DeviceGuard guard(device);
  launchKernel(kernel, static_cast<unsigned>(col_blocks), kColX, currentStream(device), words.data(), 0,
               static_cast<unsigned>(splits), kColY);
}

// The vectorized column kernel when `x` is a matrix of contiguous columns reduced over its rows,
// 16-byte aligned, of floating dtypes; false (nothing launched) otherwise.
bool tryColumnReduction(int device, OpType op, const Tensor& x, const AxisGroup& k, const AxisGroup& r,
                        const Tensor& out) {
  const DataType in_t = x.dtype(), out_t = out.dtype();
  if (!isFloatingPoint(in_t) || !isFloatingPoint(out_t) || k.extents.size() != 1 || r.extents.size() != 1 ||
      k.strides[0] != 1)
    return false;
  const int64_t vec = 16 / static_cast<int64_t>(dataTypeSize(in_t));
  const int64_t rows = r.extents[0], cols = k.extents[0], row_stride = r.strides[0];
  if (cols % vec != 0 || row_stride % vec != 0 || reinterpret_cast<uintptr_t>(x.data()) % 16 != 0) return false;
  // Enough blocks for four per multiprocessor, each split at least 64 rows long. The second pass
  // reads the partial results 16 bytes at a time too, so splits need the columns to fill whole
  // vectors of the accumulator's type as well (a wider one than the input's: a single pass).
  const DataType acc_t = accType(out_t) == "double" ? DataType::Double : DataType::Float;
  const bool partials_vectorize = cols % (16 / static_cast<int64_t>(dataTypeSize(acc_t))) == 0;
  const int64_t col_blocks = (cols / vec + kColX - 1) / kColX;
  const int64_t target = static_cast<int64_t>(multiprocessorCount(device)) * 4;
  const int64_t splits = partials_vectorize ? std::clamp<int64_t>((target + col_blocks - 1) / col_blocks, 1,
                                                                  std::max<int64_t>(rows / 64, 1))
                                            : 1;
  const double scale = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  if (splits == 1) {
    launchColumnReduction(device, op, x.data(), in_t, out.data(), out_t, rows, cols, row_stride, 1, scale);
    return true;
  }
  // Partial results in the accumulator's type, then the same kernel over them (a mean sums first).
  const Tensor partial = Tensor::empty({splits, cols}, acc_t, Device::cuda(device));
  const OpType first = op == OpType::Mean ? OpType::Sum : op;
  launchColumnReduction(device, first, x.data(), in_t, partial.data(), acc_t, rows, cols, row_stride, splits, 1.0);
  launchColumnReduction(device, op, partial.data(), acc_t, out.data(), out_t, splits, cols, cols, 1, scale);
  return true;
}
}  // namespace

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
  if (!v.row && tryColumnReduction(device, op, x, k, r, out)) return;

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
