// Generation of the normalization kernels (see normalization_codegen.h).
#include "runtime/cuda/normalization_codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "runtime/cuda/pointwise_codegen.h"

namespace meshfuse::cuda {

namespace {

using Program = NormalizationProgram;
using Varies = Program::Varies;
using Kind = Program::Operand::Kind;

bool isElement(Varies v) { return v == Varies::PerElement || v == Varies::PerColumn; }
int numLoadSlots(const Program& p) { return std::max<int>(1, static_cast<int>(p.loads.size())); }

std::string num(double v) {
  char buf[64];
  if (std::isfinite(v))
    std::snprintf(buf, sizeof buf, "%a", v);
  else
    std::snprintf(buf, sizeof buf, "%s",
                  std::isnan(v) ? "(infinity() - infinity())"
                  : v > 0       ? "infinity()"
                                : "(-infinity())");
  return buf;
}

// The value of `x` (compute type T) rounded to `dtype` and read back as T, as the CPU executor's
// applyRounding does.
std::string rounded(const std::string& x, DataType dtype, DataType compute) {
  const bool wide = compute == DataType::Double;
  switch (dtype) {
    case DataType::Half:
      return wide ? "static_cast<T>(__half2float(__double2half(" + x + ")))"
                  : "__half2float(__float2half_rn(" + x + "))";
    case DataType::BFloat16:
      return wide ? "static_cast<T>(__bfloat162float(__double2bfloat16(" + x + ")))"
                  : "__bfloat162float(__float2bfloat16_rn(" + x + "))";
    case DataType::Float: return wide ? "static_cast<T>(static_cast<float>(" + x + "))" : x;
    case DataType::Double: return x;
    case DataType::Bool: return "static_cast<T>((" + x + ") != 0)";
    case DataType::Int:
    case DataType::Int32: return "static_cast<T>(static_cast<i64>(" + x + "))";
  }
  throw std::logic_error("rounded: unknown dtype");
}

// A step's value from its operands (named a, b, c, all of type T). The element functions are the
// CPU executor's (runtime/cpu/pointwise_math.h): comparisons give 0 or 1, max/min propagate NaN.
std::string stepExpression(const Program::Step& s, DataType compute, bool apply_round = true) {
  std::string e;
  switch (s.op) {
    case OpType::Lt: e = "static_cast<T>(a < b)"; break;
    case OpType::Le: e = "static_cast<T>(a <= b)"; break;
    case OpType::Gt: e = "static_cast<T>(a > b)"; break;
    case OpType::Ge: e = "static_cast<T>(a >= b)"; break;
    case OpType::Eq: e = "static_cast<T>(a == b)"; break;
    case OpType::Ne: e = "static_cast<T>(a != b)"; break;
    case OpType::LogicalAnd: e = "static_cast<T>(a != 0 && b != 0)"; break;
    case OpType::LogicalOr: e = "static_cast<T>(a != 0 || b != 0)"; break;
    case OpType::LogicalNot: e = "static_cast<T>(a == 0)"; break;
    case OpType::Where: e = "(a != 0 ? b : c)"; break;
    case OpType::Max: e = "((a != a || a > b) ? a : b)"; break;
    case OpType::Min: e = "((a != a || a < b) ? a : b)"; break;
    case OpType::Relu: e = "(a < 0 ? static_cast<T>(0) : a)"; break;
    case OpType::Full:
    case OpType::Cast:
    case OpType::Set: e = "a"; break;
    case OpType::Exp:
      // Softmax's exp(x - max) is the kernel's hot instruction: in fp32, exp2 of a pre-scaled argument
      // (ex2.approx, a few instructions) instead of expf's accurate sequence. The relative error
      // (~2 ulp plus the argument's rounding, |x| * 2^-24) is far inside the fp32 tolerances.
      if (compute == DataType::Float) {
        e = "exp2f(a * 1.4426950408889634f)";
        break;
      }
      e = opExpression(s.op, compute);
      break;
    default: e = opExpression(s.op, compute);
  }
  return s.round && apply_round ? rounded(e, s.round_to, compute) : e;
}

bool isMax(OpType op) { return op == OpType::ReduceMax; }

}  // namespace

bool isExpensiveNormalizationOp(OpType op) {
  switch (op) {
    case OpType::Exp:
    case OpType::Log:
    case OpType::Tanh:
    case OpType::Erf:
    case OpType::Gelu:
    case OpType::Sigmoid:
    case OpType::Silu:
    case OpType::Pow: return true;
    default: return false;
  }
}

namespace {
bool isExpensive(OpType op) { return isExpensiveNormalizationOp(op); }
std::string identity(OpType op) { return isMax(op) ? "(-infinity())" : "static_cast<T>(0)"; }
std::string combine(OpType op, const std::string& a, const std::string& b) {
  return isMax(op) ? "maxNaN(" + a + ", " + b + ")" : "(" + a + " + " + b + ")";
}

class Emitter {
 public:
  Emitter(const Program& p, const NormalizationVariant* v) : p_(p), v_(v) {
    checkProgram();
    computeLevels();
  }

  std::string mainKernel(const std::string& name) {
    const NormalizationVariant& v = *v_;
    const bool persistent = v.items > 0;
    const int tx = v.threads_x, ty = v.threads_y, warps = tx > 32 ? tx / 32 : 1;
    prelude();
    s_ << "#define TX " << tx << "\n#define TY " << ty << "\n#define VEC " << v.vec << "\n";
    if (persistent) s_ << "#define ITEMS " << v.items << "\n#define EPT (ITEMS * VEC)\n";
    // Warp-level reduction over the TX lanes of a row (lanes of one row are consecutive).
    const int width = std::min(tx, 32);
    s_ << "__device__ __forceinline__ T warpSum(T v) {\n#pragma unroll\n  for (int o = " << width / 2
       << "; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n  return v;\n}\n";
    s_ << "__device__ __forceinline__ T warpMax(T v) {\n#pragma unroll\n  for (int o = " << width / 2
       << "; o > 0; o >>= 1) v = maxNaN(v, __shfl_xor_sync(0xffffffffu, v, o));\n  return v;\n}\n";

    const int cl = clusterSize();
    s_ << "#define CL " << cl << "\n";
    if (cl > 1) clusterHelpers();
    s_ << "extern \"C\" __global__ void __launch_bounds__(" << tx * ty;
    if (v.min_blocks > 0) s_ << ", " << v.min_blocks;
    s_ << ") " << name << "(const Params p) {\n";
    s_ << "  const int tx = threadIdx.x, ty = threadIdx.y;\n  const i64 n = p.n, rows = p.rows;\n"
       << "  (void)tx;\n  (void)n;\n";
    int max_per_level = 1;
    for (int l = 1; l <= levels_; ++l) max_per_level = std::max<int>(max_per_level, reductionsAt(l).size());
    // One __syncthreads per block-wide reduction: each level of a row has its own buffer (a single
    // level alternates two by row group), so a buffer is rewritten only after a later barrier that
    // every thread reaches after reading it; no barrier is needed before the writes.
    const int buffers = levels_ >= 2 ? levels_ : 2;
    if (tx > 32 && levels_ > 0) {
      s_ << "  __shared__ T red[" << buffers << "][" << max_per_level << "][TY][" << warps << "];\n";
      if (levels_ == 1) s_ << "  int buf = 0;\n";
    }
    // A row split over a cluster: each block's total goes to its cred slot, and every block adds the
    // cluster's slots in rank order after a cluster barrier (buffers reused as `red`'s are).
    if (cl > 1 && levels_ > 0) s_ << "  __shared__ T cred[" << buffers << "][" << max_per_level << "];\n";
    s_ << "  const unsigned crank = " << (cl > 1 ? "clusterRank()" : "0u") << ";\n  (void)crank;\n";
    constants("  ");
    const int outer = p_.numOuterReductions();
    if (outer > 0)
      s_ << "  const i64 slot = static_cast<i64>(blockIdx.x / CL) * TY + ty, parts = static_cast<i64>(gridDim.x / CL) "
            "* "
            "TY;\n";
    // The outer accumulators. Per-column inputs (weights) are read in each pass that needs them (from
    // L1/L2, where they stay): holding them in registers for all rows halved the occupancy.
    if (persistent) {
      for (int q = 0; q < outer; ++q)
        s_ << "  T O" << q << "[EPT];\n#pragma unroll\n  for (int e = 0; e < EPT; ++e) O" << q
           << "[e] = " << identity(outerStep(q).op) << ";\n";
    } else if (outer > 0) {
      forEachChunk("  ", false, "true", [&](const std::string& in) {
        s_ << in << "#pragma unroll\n" << in << "for (int k = 0; k < VEC; ++k)\n" << in << "  if (j0 + k < n) {\n";
        for (int q = 0; q < outer; ++q)
          s_ << in << "    static_cast<T*>(p.ws)[(" << q
             << " * parts + slot) * n + j0 + k] = " << identity(outerStep(q).op) << ";\n";
        s_ << in << "  }\n";
      });
    }

    s_ << "  for (i64 group = blockIdx.x / CL; group * TY < rows; group += gridDim.x / CL) {\n";
    const std::string in = "    ";
    s_ << in
       << "const i64 row = group * TY + ty;\n"
       // One row per block: the loop's condition already keeps the row in range.
       << in << "const bool row_ok = " << (ty == 1 ? "true" : "row < rows") << ";\n"
       << in << "const i64 safe_row = row_ok ? row : 0;\n"
       << in << "(void)safe_row;\n";
    for (size_t l = 0; l < p_.loads.size(); ++l) {
      const auto& port = p_.loads[l];
      if (port.varies == Varies::PerColumn || port.varies == Varies::Nothing) continue;
      s_ << in << "const i64 rl" << l << " = rowOffset(p, " << l << ", safe_row);\n";
      if (port.varies == Varies::PerRow)
        s_ << in << "const T lr" << l << " = row_ok ? " << loadExpr(static_cast<int>(l), "rl" + std::to_string(l))
           << " : static_cast<T>(0);\n";
    }
    for (size_t o = 0; o < p_.stores.size(); ++o)
      if (!p_.stores[o].after)
        s_ << in << "const i64 rs" << o << " = rowOffset(p, " << storePort(static_cast<int>(o)) << ", safe_row);\n";
    if (persistent && !v.stream) {
      for (size_t l = 0; l < p_.loads.size(); ++l)
        if (p_.loads[l].varies == Varies::PerElement) s_ << in << "T X" << l << "[EPT];\n";
      forEachChunk(in, true, "row_ok", [&](const std::string& ind) {
        for (size_t l = 0; l < p_.loads.size(); ++l)
          if (p_.loads[l].varies == Varies::PerElement)
            chunkLoad(ind, static_cast<int>(l), "rl" + std::to_string(l), true);
      });
    }
    if (persistent && v.prefetch) prefetchNextRows(in);
    if (persistent) {
      chooseCached();
      for (int t : cached_) s_ << in << "T E" << t << "[EPT];\n";
    }
    rowSteps(in, 0);
    for (int level = 1; level <= levels_; ++level) {
      const std::vector<int> reds = reductionsAt(level);
      for (int t : reds) s_ << in << "T acc" << t << " = " << identity(p_.steps[t].op) << ";\n";
      std::vector<Program::Operand> targets;
      for (int t : reds) targets.push_back(p_.steps[t].args[0]);
      elementPass(in, persistent, targets, [&](const std::string& ind) {
        for (int t : reds)
          s_ << ind << "if (ok) acc" << t << " = "
             << combine(p_.steps[t].op, "acc" + std::to_string(t), ref(p_.steps[t].args[0], persistent)) << ";\n";
      });
      for (int t : reds)
        s_ << in << "acc" << t << " = " << (isMax(p_.steps[t].op) ? "warpMax" : "warpSum") << "(acc" << t << ");\n";
      if (tx > 32) {
        const std::string b = levels_ == 1 ? "red[buf]" : "red[" + std::to_string(level - 1) + "]";
        s_ << in << "if ((tx & 31) == 0) {\n";
        for (size_t q = 0; q < reds.size(); ++q)
          s_ << in << "  " << b << "[" << q << "][ty][tx >> 5] = acc" << reds[q] << ";\n";
        s_ << in << "}\n" << in << "__syncthreads();\n";
        for (size_t q = 0; q < reds.size(); ++q) {
          const int t = reds[q];
          const std::string slot = b + "[" + std::to_string(q) + "][ty]";
          s_ << in << "acc" << t << " = " << slot << "[0];\n";
          s_ << in << "#pragma unroll\n"
             << in << "for (int w = 1; w < " << warps << "; ++w) acc" << t << " = "
             << combine(p_.steps[t].op, "acc" + std::to_string(t), slot + "[w]") << ";\n";
        }
      }
      if (cl > 1) {
        const std::string b = levels_ == 1 ? "cred[buf]" : "cred[" + std::to_string(level - 1) + "]";
        s_ << in << "if (tx == 0) {\n";
        for (size_t q = 0; q < reds.size(); ++q) s_ << in << "  " << b << "[" << q << "] = acc" << reds[q] << ";\n";
        s_ << in << "}\n" << in << "clusterSync();\n";
        for (size_t q = 0; q < reds.size(); ++q) {
          const int t = reds[q];
          const std::string at = "&" + b + "[" + std::to_string(q) + "]";
          s_ << in << "acc" << t << " = clusterLoad(" << at << ", 0);\n"
             << in << "#pragma unroll\n"
             << in << "for (unsigned c = 1; c < CL; ++c) acc" << t << " = "
             << combine(p_.steps[t].op, "acc" + std::to_string(t), "clusterLoad(" + at + ", c)") << ";\n";
        }
      }
      for (int t : reds) {
        s_ << in << "const T r" << t << " = ";
        if (p_.steps[t].op == OpType::Mean)
          s_ << "static_cast<T>(static_cast<double>(acc" << t << ") * (1.0 / static_cast<double>(n)));\n";
        else
          s_ << "acc" << t << ";\n";
      }
      rowSteps(in, level);
    }
    finalPass(in, persistent);
    if (tx > 32 && levels_ == 1) s_ << in << "buf ^= 1;\n";
    s_ << "  }\n";
    // No block leaves while another of its cluster may still read its shared memory.
    if (cl > 1) s_ << "  clusterSync();\n";
    if (outer > 0 && persistent) {
      forEachChunk("  ", true, "true", [&](const std::string& ind) {
        s_ << ind << "#pragma unroll\n" << ind << "for (int k = 0; k < VEC; ++k)\n" << ind << "  if (j0 + k < n) {\n";
        for (int q = 0; q < outer; ++q)
          s_ << ind << "    static_cast<T*>(p.ws)[(" << q << " * parts + slot) * n + j0 + k] = " << outerRef(q)
             << ";\n";
        s_ << ind << "  }\n";
      });
    }
    s_ << "}\n";
    return s_.str();
  }

  // prefetch.global.L2 of this thread's chunks of the next row group's contiguous element rows (a
  // hint: no registers, no wait; a row past the end is not touched).
  void prefetchNextRows(const std::string& in) {
    std::vector<int> ports;
    for (size_t l = 0; l < p_.loads.size(); ++l)
      if (p_.loads[l].varies == Varies::PerElement && vectorized(p_.loads[l])) ports.push_back(static_cast<int>(l));
    if (ports.empty()) return;
    s_ << in << "if (const i64 next = (group + gridDim.x / CL) * TY + ty; next < rows) {\n";
    for (int l : ports) s_ << in << "  const i64 nl" << l << " = rowOffset(p, " << l << ", next);\n";
    s_ << in << "#pragma unroll\n"
       << in << "  for (int it = 0; it < ITEMS; ++it) {\n"
       << in << "    const i64 j0 = " << chunkStart() << ";\n"
       << in << "    if (j0 < n) {\n";
    for (int l : ports)
      s_ << in << "      asm volatile(\"prefetch.global.L2 [%0];\" ::\"l\"(static_cast<const "
         << storageType(p_.loads[l].dtype) << "*>(p.in[" << l << "]) + nl" << l << " + j0));\n";
    s_ << in << "    }\n" << in << "  }\n" << in << "}\n";
  }

  // A block of kNormalizationEpilogueX x kNormalizationEpilogueY threads per tile of X columns: the
  // Y threads of a column add interleaved subsets of the partial rows (several loads in flight
  // each), then the first adds the Y sums in order. The order is fixed by the launch shape, so the
  // result is deterministic; a single thread per column walking all partials serially was latency
  // bound (a few dozen blocks for a row of 4096-12288 columns).
  std::string epilogueKernel(const std::string& name) {
    prelude();
    const int ex = kNormalizationEpilogueX, ey = kNormalizationEpilogueY, outer = p_.numOuterReductions();
    s_ << "extern \"C\" __global__ void __launch_bounds__(" << ex * ey << ") " << name << "(const Params p) {\n";
    s_ << "  const i64 n = p.n, rows = p.rows, parts = p.partials;\n  (void)rows;\n";
    s_ << "  const int cx = threadIdx.x, cy = threadIdx.y;\n";
    s_ << "  __shared__ T part[" << outer << "][" << ey << "][" << ex << "];\n";
    constants("  ");
    s_ << "  for (i64 j0 = static_cast<i64>(blockIdx.x) * " << ex << "; j0 < n; j0 += static_cast<i64>(gridDim.x) * "
       << ex << ") {\n";
    const std::string in = "    ";
    s_ << in << "const i64 j = j0 + cx;\n";
    std::set<int> steps, loads;
    for (const auto& st : p_.stores)
      if (st.after) collect(st.value, steps, loads, /*after=*/true);
    s_ << in << "if (j < n) {\n";
    for (int q = 0; q < outer; ++q) {
      const auto& st = outerStep(q);
      const std::string ws = "static_cast<const T*>(p.ws)[(" + std::to_string(q) + " * parts + s) * n + j]";
      s_ << in << "  {\n"
         << in << "    T sum = " << identity(st.op) << ";\n"
         << in << "#pragma unroll 4\n"
         << in << "    for (i64 s = cy; s < parts; s += " << ey << ") sum = " << combine(st.op, "sum", ws) << ";\n"
         << in << "    part[" << q << "][cy][cx] = sum;\n"
         << in << "  }\n";
    }
    s_ << in << "}\n" << in << "__syncthreads();\n";
    s_ << in << "if (cy == 0 && j < n) {\n";
    const std::string body = in + "  ";
    for (int l : loads) s_ << body << "const T x" << l << " = " << loadExpr(l, columnOffset(l, false, "j")) << ";\n";
    for (int t : steps) {
      const auto& st = p_.steps[t];
      if (st.outer) {
        const int q = outerIndex(t);
        s_ << body << "T e" << t << " = part[" << q << "][0][cx];\n";
        s_ << body << "#pragma unroll\n"
           << body << "for (int y = 1; y < " << ey << "; ++y) e" << t << " = "
           << combine(st.op, "e" + std::to_string(t), "part[" + std::to_string(q) + "][y][cx]") << ";\n";
        if (st.op == OpType::Mean)
          s_ << body << "e" << t << " = static_cast<T>(static_cast<double>(e" << t
             << ") * (1.0 / static_cast<double>(rows)));\n";
        continue;
      }
      elementStep(body, t, false);
    }
    for (size_t o = 0; o < p_.stores.size(); ++o) {
      const auto& st = p_.stores[o];
      if (!st.after) continue;
      const int port = storePort(static_cast<int>(o));
      const std::string value = storeConvert(ref(st.value, false), p_.compute, st.dtype);
      const std::string col = !st.has_columns ? "0" : st.contiguous_row ? "j" : generalColumn(port, "j");
      const std::string target = "static_cast<" + storageType(st.dtype) + "*>(p.out[" + std::to_string(o) + "])";
      if (st.has_rows)
        s_ << body << "for (i64 r = 0; r < rows; ++r) " << target << "[rowOffset(p, " << port << ", r) + " << col
           << "] = " << value << ";\n";
      else
        s_ << body << target << "[" << col << "] = " << value << ";\n";
    }
    s_ << in << "}\n" << in << "__syncthreads();\n";
    s_ << "  }\n}\n";
    return s_.str();
  }

 private:
  void checkProgram() const {
    if (p_.stores.empty()) throw std::invalid_argument("CUDA normalization codegen: no output");
    if (p_.compute != DataType::Float && p_.compute != DataType::Double)
      throw std::invalid_argument("CUDA normalization codegen: computes in Float or Double");
    if (p_.outer_rank < 1 || p_.inner_rank < 1 || p_.outer_rank > 16 || p_.inner_rank > 16)
      throw std::invalid_argument("CUDA normalization codegen: F needs 1 to 16 outer and inner axes");
    for (size_t i = 0; i < p_.steps.size(); ++i)
      for (const auto& a : p_.steps[i].args) {
        if (a.kind == Kind::Temp && a.index >= static_cast<int>(i))
          throw std::invalid_argument("CUDA normalization codegen: step " + std::to_string(i) +
                                      " uses a value defined later");
        if (a.kind == Kind::Load && a.index >= static_cast<int>(p_.loads.size()))
          throw std::invalid_argument("CUDA normalization codegen: step " + std::to_string(i) + " reads no load");
      }
    if (v_) {
      const auto& v = *v_;
      const bool tx_ok = (v.threads_x <= 32 && (v.threads_x & (v.threads_x - 1)) == 0) ||
                         (v.threads_x % 32 == 0 && v.threads_x <= 1024);
      if (!tx_ok || v.threads_y < 1 || v.threads_x * v.threads_y > 1024 || (v.threads_x * v.threads_y) % 32 != 0)
        throw std::invalid_argument("CUDA normalization codegen: a block of " + std::to_string(v.threads_x) + " x " +
                                    std::to_string(v.threads_y) + " threads");
      if (v.vec < 1 || v.vec > 16 || (v.vec & (v.vec - 1)) != 0 || v.items < 0)
        throw std::invalid_argument("CUDA normalization codegen: bad vector width or items");
    }
  }

  const Program::Step& outerStep(int q) const {
    int seen = 0;
    for (const auto& st : p_.steps)
      if (st.outer && seen++ == q) return st;
    throw std::logic_error("no outer reduction " + std::to_string(q));
  }
  int outerIndex(int t) const {
    int q = 0;
    for (int i = 0; i < t; ++i) q += p_.steps[i].outer ? 1 : 0;
    return q;
  }
  int storePort(int o) const { return numLoadSlots(p_) + o; }
  int clusterSize() const { return v_ && v_->items > 0 ? std::max(1, v_->cluster) : 1; }
  // The first column of chunk `it` of this thread (persistent variant): the cluster's blocks take
  // interleaved runs of TX chunks, so each warp's loads stay contiguous.
  static std::string chunkStart() { return "(static_cast<i64>(it) * TX * CL + crank * TX + tx) * VEC"; }
  // Cluster rank, barrier and a read of another block's shared memory, in PTX (sm_90: no
  // cooperative_groups header needed under NVRTC).
  void clusterHelpers() {
    const bool wide = p_.compute == DataType::Double;
    s_ << "__device__ __forceinline__ unsigned clusterRank() {\n  unsigned r;\n"
          "  asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n  return r;\n}\n"
          "__device__ __forceinline__ void clusterSync() {\n"
          "  asm volatile(\"barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;\" ::: "
          "\"memory\");\n}\n"
          "__device__ __forceinline__ T clusterLoad(const T* at, unsigned rank) {\n"
          "  unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(at)), remote;\n"
          "  asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(remote) : \"r\"(local), \"r\"(rank));\n"
          "  T v;\n  asm volatile(\"ld.shared::cluster."
       << (wide ? "f64 %0, [%1];\" : \"=d\"" : "f32 %0, [%1];\" : \"=f\"")
       << "(v) : \"r\"(remote) : \"memory\");\n  return v;\n}\n";
  }
  // Outer accumulator q's value for element (it, k) of this thread's row part (persistent variant).
  static std::string outerRef(int q) { return "O" + std::to_string(q) + "[it * VEC + k]"; }

  // The pass in which each value can first be computed: inner reductions of level L reduce values
  // that need only row values of levels below L.
  void computeLevels() {
    level_.assign(p_.steps.size(), 0);
    levels_ = 0;
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      const auto& st = p_.steps[i];
      int l = 0;
      for (const auto& a : st.args)
        if (a.kind == Kind::Temp) l = std::max(l, level_[a.index]);
      if (isReduction(st.op) && !st.outer) {
        ++l;
        levels_ = std::max(levels_, l);
      }
      level_[i] = l;
    }
  }
  std::vector<int> reductionsAt(int level) const {
    std::vector<int> out;
    for (size_t i = 0; i < p_.steps.size(); ++i)
      if (isReduction(p_.steps[i].op) && !p_.steps[i].outer && level_[i] == level) out.push_back(static_cast<int>(i));
    return out;
  }

  void prelude() {
    s_ << kernelPrelude();
    s_ << "typedef " << (p_.compute == DataType::Double ? "double" : "float") << " T;\n";
    s_ << "template <typename S, int N> struct __align__(sizeof(S) * N > 16 ? 16 : sizeof(S) * N) VPack { S v[N]; };\n";
    s_ << "__device__ __forceinline__ T infinity() { return static_cast<T>(__int_as_float(0x7f800000)); }\n";
    s_ << "__device__ __forceinline__ T maxNaN(T a, T b) { return (a != a || a > b) ? a : b; }\n";
    const int nl = numLoadSlots(p_), ns = static_cast<int>(p_.stores.size());
    const int r = p_.outer_rank + p_.inner_rank;
    s_ << "struct Params {\n  const void* in[" << nl << "];\n  void* out[" << ns << "];\n  void* ws;\n  double scal["
       << std::max(1, p_.num_scalars) << "];\n  i64 rows, n;\n  i64 outer_shape[" << p_.outer_rank
       << "];\n  i64 inner_shape[" << p_.inner_rank << "];\n  i64 st[" << nl + ns << "][" << r
       << "];\n  i64 partials;  // the epilogue's\n};\n";
    s_ << "static_assert(sizeof(Params) == " << 8 * normalizationParamWords(p_)
       << ", \"host and device disagree on the parameter block\");\n";
    // Offsets of row `r` (< rows) and of column `j` (< n) in a port's tensor (F's outer and inner
    // axes). The first axis takes no remainder (the index is within it): a 64-bit division is a long
    // instruction sequence, and with one outer axis a row's offsets need none.
    s_ << "__device__ __forceinline__ i64 rowOffset(const Params& p, int port, i64 r) {\n  i64 off = 0;\n#pragma "
          "unroll\n"
       << "  for (int d = " << p_.outer_rank - 1 << "; d > 0; --d) {\n"
       << "    off += (r % p.outer_shape[d]) * p.st[port][d];\n    r /= p.outer_shape[d];\n  }\n"
       << "  return off + r * p.st[port][0];\n}\n";
    s_ << "__device__ __forceinline__ i64 columnOffset(const Params& p, int port, i64 j) {\n  i64 off = 0;\n"
          "#pragma unroll\n  for (int d = "
       << p_.inner_rank - 1 << "; d > 0; --d) {\n    off += (j % p.inner_shape[d]) * p.st[port][" << p_.outer_rank
       << " + d];\n    j /= p.inner_shape[d];\n  }\n  return off + j * p.st[port][" << p_.outer_rank << "];\n}\n";
  }

  // Values that vary with nothing: the scalar-tensor loads and the steps on them and on numbers.
  void constants(const std::string& in) {
    for (size_t l = 0; l < p_.loads.size(); ++l)
      if (p_.loads[l].varies == Varies::Nothing)
        s_ << in << "const T lc" << l << " = " << loadExpr(static_cast<int>(l), "0") << ";\n";
    for (size_t t = 0; t < p_.steps.size(); ++t) {
      const auto& st = p_.steps[t];
      if (st.varies != Varies::Nothing || st.after || isReduction(st.op)) continue;
      s_ << in << "T c" << t << ";\n" << in << "{\n";
      operands(in + "  ", st, false);
      s_ << in << "  c" << t << " = " << stepExpression(st, p_.compute) << ";\n" << in << "}\n";
    }
  }

  // The per-row values (not reductions) of `level`.
  void rowSteps(const std::string& in, int level) {
    for (size_t t = 0; t < p_.steps.size(); ++t) {
      const auto& st = p_.steps[t];
      if (st.varies != Varies::PerRow || st.after || isReduction(st.op) || level_[t] != level) continue;
      s_ << in << "T r" << t << ";\n" << in << "{\n";
      operands(in + "  ", st, false);
      s_ << in << "  r" << t << " = " << stepExpression(st, p_.compute) << ";\n" << in << "}\n";
    }
  }

  void operands(const std::string& in, const Program::Step& st, bool persistent) {
    for (size_t k = 0; k < st.args.size() && k < 3; ++k)
      s_ << in << "const T " << static_cast<char>('a' + k) << " = " << ref(st.args[k], persistent) << ";\n";
  }

  // Whether load l's row sits in registers (X<l>), loaded once per row: per-element loads of the
  // persistent variant unless it streams them.
  bool inRegisters(int l, bool persistent) const {
    return persistent && !(v_ && v_->stream) && p_.loads[l].varies == Varies::PerElement;
  }

  // The name of an operand's value where it is used (inside an element loop for element values).
  std::string ref(const Program::Operand& o, bool persistent) const {
    switch (o.kind) {
      case Kind::Scalar: return "static_cast<T>(p.scal[" + std::to_string(o.index) + "])";
      case Kind::Constant: return "static_cast<T>(" + num(o.value) + ")";
      case Kind::Load: {
        const Varies v = p_.loads[o.index].varies;
        if (v == Varies::Nothing) return "lc" + std::to_string(o.index);
        if (v == Varies::PerRow) return "lr" + std::to_string(o.index);
        return inRegisters(o.index, persistent) ? "X" + std::to_string(o.index) + "[it * VEC + k]"
                                                : "x" + std::to_string(o.index);
      }
      case Kind::Temp: {
        const auto& st = p_.steps[o.index];
        if (cached_.count(o.index)) return "E" + std::to_string(o.index) + "[it * VEC + k]";
        if (st.after || isElement(st.varies)) return "e" + std::to_string(o.index);
        return (st.varies == Varies::Nothing ? "c" : "r") + std::to_string(o.index);
      }
    }
    throw std::logic_error("ref: unknown operand kind");
  }

  // The element steps and element loads that `o` needs (in the epilogue: also outer reductions).
  void collect(const Program::Operand& o, std::set<int>& steps, std::set<int>& loads, bool after) const {
    if (o.kind == Kind::Load) {
      if (isElement(p_.loads[o.index].varies)) loads.insert(o.index);
      return;
    }
    if (o.kind != Kind::Temp) return;
    const auto& st = p_.steps[o.index];
    const bool element = after ? (st.after || st.varies == Varies::PerColumn) : (isElement(st.varies) && !st.after);
    if (!element || !steps.insert(o.index).second) return;
    if (st.outer) return;  // the epilogue reads its partials
    for (const auto& a : st.args) collect(a, steps, loads, after);
  }

  // "(storage*)p.in[l]" element at offset `off`, converted to T.
  std::string loadExpr(int l, const std::string& off) const {
    const DataType d = p_.loads[l].dtype;
    return loadConvert("static_cast<const " + storageType(d) + "*>(p.in[" + std::to_string(l) + "])[" + off + "]", d,
                       p_.compute);
  }

  bool vectorized(const Program::Port& port) const { return v_ && v_->vec > 1 && port.contiguous_row; }
  std::string generalColumn(int port, const std::string& j) const {
    return "columnOffset(p, " + std::to_string(port) + ", " + j + ")";
  }
  std::string columnOffset(int l, bool, const std::string& j) const {
    const auto& port = p_.loads[l];
    if (!port.has_columns) return "0";
    return port.contiguous_row ? j : generalColumn(l, j);
  }

  // The chunks (vec consecutive elements) of this thread's part of a row: unrolled over the
  // register items (persistent) or a loop over the row (multi-pass). Defines j0 and chunk_ok.
  template <typename F>
  void forEachChunk(const std::string& in, bool persistent, const std::string& row_ok, F body) {
    if (persistent)
      s_ << in << "#pragma unroll\n"
         << in << "for (int it = 0; it < ITEMS; ++it) {\n"
         << in << "  const i64 j0 = " << chunkStart() << ";\n";
    else
      s_ << in << "for (i64 j0 = static_cast<i64>(tx) * VEC; j0 < n; j0 += TX * VEC) {\n";
    // The multi-pass loop and a row the threads' chunks cover exactly need no column check.
    const bool in_range = !persistent || (v_ && v_->exact);
    s_ << in << "  const bool chunk_ok = (" << row_ok << ")" << (in_range ? "" : " && j0 < n") << ";\n"
       << in << "  (void)chunk_ok;\n";
    body(in + "  ");
    s_ << in << "}\n";
  }

  // Loads load l's chunk into X<l>[it * VEC + k] (persistent) or x<l>_[k]; zeros outside the row.
  void chunkLoad(const std::string& in, int l, const std::string& row_off, bool persistent) {
    const auto& port = p_.loads[l];
    const std::string dst = persistent ? "X" + std::to_string(l) + "[it * VEC + k]" : "x" + std::to_string(l) + "_[k]";
    if (!persistent) s_ << in << "T x" << l << "_[VEC];\n";
    const std::string base = "static_cast<const " + storageType(port.dtype) + "*>(p.in[" + std::to_string(l) + "])";
    if (vectorized(port)) {
      const std::string pack = "VPack<" + storageType(port.dtype) + ", VEC>";
      s_ << in << "if (chunk_ok) {\n"
         << in << "  const " << pack << " pk = *reinterpret_cast<const " << pack << "*>(" << base << " + " << row_off
         << " + j0);\n"
         << in << "#pragma unroll\n"
         << in << "  for (int k = 0; k < VEC; ++k) " << dst << " = " << loadConvert("pk.v[k]", port.dtype, p_.compute)
         << ";\n"
         << in << "} else {\n"
         << in << "#pragma unroll\n"
         << in << "  for (int k = 0; k < VEC; ++k) " << dst << " = static_cast<T>(0);\n"
         << in << "}\n";
      return;
    }
    s_ << in << "#pragma unroll\n"
       << in << "for (int k = 0; k < VEC; ++k)\n"
       << in << "  " << dst << " = (chunk_ok && j0 + k < n) ? "
       << loadExpr(l, row_off + " + " + columnOffset(l, true, "(j0 + k)")) << " : static_cast<T>(0);\n";
  }

  void elementStep(const std::string& in, int t, bool persistent) {
    const auto& st = p_.steps[t];
    const std::string name = cached_.count(t) ? "E" + std::to_string(t) + "[it * VEC + k]" : "e" + std::to_string(t);
    if (!cached_.count(t)) s_ << in << "T " << name << ";\n";
    const bool keep_exact = storesRoundedStep(t) && !cached_.count(t) && !reciprocals_.count(t);
    if (keep_exact) s_ << in << "T " << name << "_exact;\n";
    s_ << in << "{\n";
    operands(in + "  ", st, persistent);
    if (keep_exact) {
      s_ << in << "  " << name << "_exact = " << stepExpression(st, p_.compute, false) << ";\n"
         << in << "  " << name << " = " << rounded(name + "_exact", st.round_to, p_.compute) << ";\n"
         << in << "}\n";
      return;
    }
    const std::string value = reciprocals_.count(t) ? "a * inv" + std::to_string(t) : stepExpression(st, p_.compute);
    s_ << in << "  " << name << " = " << value << ";\n" << in << "}\n";
  }

  // Whether an element output stores step t's value, rounded by t to the output's dtype (a cast
  // back to bf16 at the end of a fusion): the store then converts t's value before rounding, since
  // rounding twice to one dtype is rounding once, and saves the round trip through the dtype.
  bool storesRoundedStep(int t) const {
    const auto& st = p_.steps[t];
    // In Double the store's conversion goes through float: not the same single rounding.
    if (!st.round || st.after || !isElement(st.varies) || p_.compute != DataType::Float) return false;
    for (const auto& o : p_.stores)
      if (!o.after && o.has_columns && o.value.kind == Kind::Temp && o.value.index == t && o.dtype == st.round_to)
        return true;
    return false;
  }
  // The value an element output stores, in T (before its conversion to the output's dtype).
  std::string storedValue(const Program::Port& st, bool persistent) const {
    if (st.value.kind == Kind::Temp && st.dtype == p_.steps[st.value.index].round_to &&
        storesRoundedStep(st.value.index) && !cached_.count(st.value.index) && !reciprocals_.count(st.value.index))
      return "e" + std::to_string(st.value.index) + "_exact";
    return ref(st.value, persistent);
  }

  // An element quotient whose divisor is one value per row (softmax's e / sum): the row's
  // reciprocal is computed once and each element multiplies by it (within an ulp of the quotient;
  // an IEEE division per element is a long instruction sequence).
  bool rowDivisor(int t) const {
    const auto& st = p_.steps[t];
    if (st.op != OpType::Div || st.args.size() != 2 || st.after || st.round || !isElement(st.varies)) return false;
    const auto& b = st.args[1];
    if (b.kind == Kind::Load) return p_.loads[b.index].varies == Varies::PerRow;
    if (b.kind != Kind::Temp) return false;
    const auto& d = p_.steps[b.index];
    return d.varies == Varies::PerRow && !d.after;
  }
  void defineReciprocals(const std::string& in, const std::set<int>& steps) {
    for (int t : steps)
      if (rowDivisor(t) && reciprocals_.insert(t).second)
        s_ << in << "const T inv" << t << " = static_cast<T>(1) / " << ref(p_.steps[t].args[1], false) << ";\n";
  }

  // A loop over this thread's elements of the row computing `targets` (element operands); `use`
  // emits what to do with them per element (where `ok` says the element exists).
  template <typename F>
  void elementPass(const std::string& in, bool persistent, const std::vector<Program::Operand>& targets, F use,
                   const std::vector<int>& extra_loads = {}) {
    std::set<int> steps, loads(extra_loads.begin(), extra_loads.end());
    for (const auto& o : targets) collect(o, steps, loads, false);
    defineReciprocals(in, steps);
    if (persistent && v_ && v_->fence && passes_++ > 0) fenceRegisters(in, loads);
    forEachChunk(in, persistent, "row_ok", [&](const std::string& ind) {
      for (int l : loads)
        if (!inRegisters(l, persistent))
          chunkLoad(ind, l, p_.loads[l].varies == Varies::PerColumn ? "0" : "rl" + std::to_string(l), false);
      beforeElements_(ind);
      s_ << ind << "#pragma unroll\n" << ind << "for (int k = 0; k < VEC; ++k) {\n";
      const std::string body = ind + "  ";
      s_ << body
         << "const i64 j = j0 + k;\n"
         // Vector chunks lie wholly inside or outside the row (n % VEC == 0): one check per chunk.
         << body << "const bool ok = " << (v_ && v_->vec > 1 ? "chunk_ok" : "row_ok && j < n") << ";\n"
         << body << "(void)j;\n"
         << body << "(void)ok;\n";
      for (int l : loads)
        if (!inRegisters(l, persistent)) s_ << body << "const T x" << l << " = x" << l << "_[k];\n";
      for (int t : steps) {
        if (cached_.count(t) && computed_.count(t)) continue;  // in registers since an earlier pass
        elementStep(body, t, persistent);
      }
      for (int t : steps)
        if (cached_.count(t)) computed_.insert(t);
      use(body);
      s_ << ind << "}\n";
      afterElements_(ind);
    });
    beforeElements_ = [](const std::string&) {};
    afterElements_ = [](const std::string&) {};
  }

  // An empty asm that "modifies" each register-held input before a later pass: the compiler cannot
  // reuse values it computed from them in an earlier pass (LayerNorm backward's dy * w and x_hat),
  // so it recomputes them instead of keeping whole arrays of them alive across the barrier.
  void fenceRegisters(const std::string& in, const std::set<int>& loads) {
    const char* constraint = p_.compute == DataType::Double ? "+d" : "+f";
    for (int l : loads)
      if (inRegisters(l, true))
        s_ << in << "#pragma unroll\n"
           << in << "for (int e = 0; e < EPT; ++e) asm volatile(\"\" : \"" << constraint << "\"(X" << l << "[e]));\n";
  }

  // Stores of element values, outer accumulation; then the per-row stores.
  void finalPass(const std::string& in, bool persistent) {
    std::vector<Program::Operand> targets;
    std::vector<int> element_stores, row_stores;
    for (size_t o = 0; o < p_.stores.size(); ++o) {
      const auto& st = p_.stores[o];
      if (st.after) continue;
      (st.has_columns ? element_stores : row_stores).push_back(static_cast<int>(o));
      if (st.has_columns) targets.push_back(st.value);
    }
    std::vector<int> outer;
    for (size_t t = 0; t < p_.steps.size(); ++t)
      if (p_.steps[t].outer) {
        outer.push_back(static_cast<int>(t));
        targets.push_back(p_.steps[t].args[0]);
      }
    auto condition = [&](int o) {
      return p_.stores[o].has_rows ? std::string("row_ok") : std::string("(row_ok && row == 0)");
    };
    if (!targets.empty()) {
      beforeElements_ = [&](const std::string& ind) {
        for (int o : element_stores)
          if (vectorized(p_.stores[o]))
            s_ << ind << "VPack<" << storageType(p_.stores[o].dtype) << ", VEC> sp" << o << ";\n";
      };
      afterElements_ = [&](const std::string& ind) {
        for (int o : element_stores) {
          if (!vectorized(p_.stores[o])) continue;
          const std::string pack = "VPack<" + storageType(p_.stores[o].dtype) + ", VEC>";
          s_ << ind << "if (chunk_ok && " << condition(o) << ") *reinterpret_cast<" << pack << "*>(static_cast<"
             << storageType(p_.stores[o].dtype) << "*>(p.out[" << o << "]) + rs" << o << " + j0) = sp" << o << ";\n";
        }
      };
      elementPass(in, persistent, targets, [&](const std::string& body) {
        for (int o : element_stores) {
          const auto& st = p_.stores[o];
          const std::string value = storeConvert(storedValue(st, persistent), p_.compute, st.dtype);
          if (vectorized(st)) {
            s_ << body << "sp" << o << ".v[k] = " << value << ";\n";
            continue;
          }
          const std::string col = st.contiguous_row ? "j" : generalColumn(storePort(o), "j");
          s_ << body << "if (ok && " << condition(o) << ") static_cast<" << storageType(st.dtype) << "*>(p.out[" << o
             << "])[rs" << o << " + " << col << "] = " << value << ";\n";
        }
        for (size_t q = 0; q < outer.size(); ++q) {
          const auto& st = p_.steps[outer[q]];
          const std::string v = ref(st.args[0], persistent);
          if (persistent)
            s_ << body << "if (ok) " << outerRef(static_cast<int>(q)) << " = "
               << combine(st.op, outerRef(static_cast<int>(q)), v) << ";\n";
          else
            s_ << body << "if (ok) {\n"
               << body << "  T& w = static_cast<T*>(p.ws)[(" << q << " * parts + slot) * n + j];\n"
               << body << "  w = " << combine(st.op, "w", v) << ";\n"
               << body << "}\n";
        }
      });
    }
    for (int o : row_stores) {
      const auto& st = p_.stores[o];
      s_ << in << "if (tx == 0 && crank == 0 && " << condition(o) << ") static_cast<" << storageType(st.dtype)
         << "*>(p.out[" << o << "])[rs" << o << "] = " << storeConvert(ref(st.value, false), p_.compute, st.dtype)
         << ";\n";
    }
  }

  // Persistent variant: expensive per-element values (exp, say) that a later pass needs again are
  // kept in registers (E<t>) from the first pass that computes them, instead of recomputed:
  // softmax's exp(x - max) feeds both the sum and the output.
  void chooseCached() {
    if (v_ && v_->recompute) return;
    std::map<int, int> passes;  // step -> number of passes that need it
    auto count = [&](const std::vector<Program::Operand>& targets) {
      std::set<int> steps, loads;
      for (const auto& o : targets) collect(o, steps, loads, false);
      for (int t : steps) ++passes[t];
    };
    for (int level = 1; level <= levels_; ++level) {
      std::vector<Program::Operand> targets;
      for (int t : reductionsAt(level)) targets.push_back(p_.steps[t].args[0]);
      count(targets);
    }
    std::vector<Program::Operand> final_targets;
    for (const auto& st : p_.stores)
      if (!st.after && st.has_columns) final_targets.push_back(st.value);
    for (const auto& st : p_.steps)
      if (st.outer) final_targets.push_back(st.args[0]);
    count(final_targets);
    for (const auto& [t, n] : passes)
      if (n > 1 && p_.steps[t].varies == Varies::PerElement && isExpensive(p_.steps[t].op)) cached_.insert(t);
  }

  const Program& p_;
  const NormalizationVariant* v_;
  std::set<int> cached_, computed_, reciprocals_;
  int passes_ = 0;  // element passes emitted so far (the fence starts with the second)
  std::ostringstream s_;
  std::vector<int> level_;
  int levels_ = 0;
  std::function<void(const std::string&)> beforeElements_ = [](const std::string&) {};
  std::function<void(const std::string&)> afterElements_ = [](const std::string&) {};
};

}  // namespace

int NormalizationProgram::numOuterReductions() const {
  int n = 0;
  for (const auto& s : steps) n += s.outer ? 1 : 0;
  return n;
}

// A binary key (raw bytes of every field): the executor builds it on every execution to find the
// compiled kernel, where formatting text (doubles as %a) cost tens of microseconds per launch.
std::string NormalizationProgram::key() const {
  std::string k;
  k.reserve(64 + 24 * (loads.size() + stores.size()) + 48 * steps.size());
  auto put = [&](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto operand = [&](const Operand& o) {
    put(static_cast<uint8_t>(o.kind));
    put(o.index);
    if (o.kind == Operand::Kind::Constant) put(o.value);
  };
  auto port = [&](const Port& p) {
    put(static_cast<uint8_t>(p.dtype));
    put(static_cast<uint8_t>(p.varies));
    put(static_cast<uint8_t>(p.after | p.has_rows << 1 | p.has_columns << 2 | p.contiguous_row << 3));
    operand(p.value);
  };
  put(static_cast<uint8_t>(compute));
  put(outer_rank);
  put(inner_rank);
  put(num_scalars);
  put(loads.size());
  for (const auto& p : loads) port(p);
  put(stores.size());
  for (const auto& p : stores) port(p);
  put(steps.size());
  for (const auto& s : steps) {
    put(static_cast<int>(s.op));
    put(static_cast<uint8_t>(s.varies));
    put(static_cast<uint8_t>(s.after | s.outer << 1 | s.round << 2));
    put(static_cast<uint8_t>(s.round_to));
    put(s.scale);
    put(s.args.size());
    for (const auto& a : s.args) operand(a);
  }
  return k;
}

std::string NormalizationVariant::key() const {
  return "v" + std::to_string(vec) + "x" + std::to_string(threads_x) + "y" + std::to_string(threads_y) + "i" +
         std::to_string(items) + (stream ? "s" : "") + (prefetch ? "p" : "") + (recompute ? "r" : "") +
         (fence ? "f" : "") + (min_blocks > 0 ? "m" + std::to_string(min_blocks) : "") +
         // Both change the generated code: CL is compiled in, and an exact variant has no column check
         // (a kernel cached for a row its chunks cover must not run on a shorter row).
         (cluster > 1 ? "c" + std::to_string(cluster) : "") + (exact ? "e" : "");
}

size_t normalizationParamWords(const NormalizationProgram& p) {
  const size_t nl = static_cast<size_t>(numLoadSlots(p)), ns = p.stores.size();
  const size_t r = static_cast<size_t>(p.outer_rank + p.inner_rank);
  return nl + ns + 1 + static_cast<size_t>(std::max(1, p.num_scalars)) + 2 + r + (nl + ns) * r + 1;
}

std::string generateNormalizationSource(const NormalizationProgram& program, const NormalizationVariant& variant,
                                        const std::string& kernel_name) {
  return Emitter(program, &variant).mainKernel(kernel_name);
}

std::string generateNormalizationEpilogueSource(const NormalizationProgram& program, const std::string& kernel_name) {
  if (!program.hasEpilogue()) throw std::invalid_argument("CUDA normalization codegen: no outer reduction");
  return Emitter(program, nullptr).epilogueKernel(kernel_name);
}

}  // namespace meshfuse::cuda
