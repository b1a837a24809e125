// Reduction segments: one Sum / ReduceMax / Mean over some axes of a tensor of any strides.
// Floats accumulate in double, integers and bools in int64. The input is split into its kept axes
// and its reduced axes (each group sorted by stride and coalesced); then either
//  - rows: each output reduces a run of elements along the reduced axes (inner reduced axis
//    contiguous: a simd loop), or
//  - columns: when the inner *kept* axis is the contiguous one (reducing outer axes), a block of
//    neighbouring outputs is accumulated together with one vectorizable loop per reduced element.
// When there are too few outputs to occupy every thread, the reduced range is split into chunks
// whose partial results are combined afterwards.
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "ops/shape_inference.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/element_traits.h"
#include "runtime/cpu/simd_clones.h"
#include "runtime/cpu/strided_space.h"
#include "runtime/nan_propagating.h"

namespace meshfuse::cpu {

namespace {

// Outputs accumulated together by the column kernel: a whole row where its accumulators fit in L2
// (each reduced row is then read as one contiguous run, as numpy streams it), else blocks of this
// many. Blocks of 512 columns read a [4096, 4096] float matrix's rows in 2 KB pieces 16 KB apart:
// 0.2-0.3 of the memory bandwidth, 2.6-4.8x numpy's time.
constexpr int64_t kColumnBlockBytes = 256 * 1024;
constexpr int64_t kMinChunk = 1 << 14;           // fewest reduced elements worth a task of their own
constexpr int64_t kParallelThreshold = 1 << 15;  // input elements below which one thread does it all
constexpr int kMaxRank = 16;

template <typename A>
struct SumOp {
  static constexpr bool is_sum = true;
  static A init() { return A(0); }
  static A combine(A x, A y) { return x + y; }
};

template <typename A>
struct MaxOp {
  static constexpr bool is_sum = false;
  static A init() {
    if constexpr (std::numeric_limits<A>::has_infinity)
      return -std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::lowest();
  }
  static A combine(A x, A y) { return nanPropagatingMax(x, y); }  // NaN wins, as in torch
};

// A row-major walk over a coalesced space of one operand, element by element.
struct Odometer {
  const StridedSpace& space;
  int64_t index[kMaxRank] = {};
  int64_t offset = 0;
  Odometer(const StridedSpace& s, int64_t linear) : space(s) {
    for (int64_t d = s.rank() - 1; d >= 0; --d) {
      index[d] = linear % s.shape[d];
      linear /= s.shape[d];
      offset += index[d] * s.strides[0][d];
    }
  }
  void next() {
    for (int64_t d = space.rank() - 1; d >= 0; --d) {
      offset += space.strides[0][d];
      if (++index[d] < space.shape[d]) return;
      offset -= space.strides[0][d] * space.shape[d];
      index[d] = 0;
    }
  }
};

// In/out element offsets of kept linear index `m` (kept has operands {input, output}).
void keptOffsets(const StridedSpace& kept, int64_t m, int64_t& in_off, int64_t& out_off) {
  in_off = out_off = 0;
  for (int64_t d = kept.rank() - 1; d >= 0; --d) {
    int64_t i = m % kept.shape[d];
    m /= kept.shape[d];
    in_off += i * kept.strides[0][d];
    out_off += i * kept.strides[1][d];
  }
}

// Its own SIMD clones, as accumulateColumns below: in the baseline build a contiguous run (a row's
// sum or max over the last axis) went two doubles at a time. A max over a contiguous run keeps 64
// lanes (four AVX-512 vectors of floats, whose compares overlap), each folded with the
// NaN-propagating max, then folds the lanes: one chain of dependent compares per element was 4-7x
// slower than numpy and JAX.
template <typename S, typename A, typename Op>
MESHFUSE_SIMD_CLONES A accumulateRun(const S* __restrict p, int64_t n, int64_t stride, A acc) {
  if constexpr (Op::is_sum) {
    A s = A(0);
    if (stride == 1) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += loadInLoop<S, A>(p[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) s += loadInLoop<S, A>(p[i * stride]);
    }
    return acc + s;
  } else {
    int64_t i = 0;
    if (stride == 1) {
      constexpr int64_t kLanes = 64;
      A lanes[kLanes];
      for (A& lane : lanes) lane = Op::init();
      for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] = Op::combine(lanes[l], loadInLoop<S, A>(p[i + l]));
      }
      for (const A& lane : lanes) acc = Op::combine(acc, lane);
    }
    for (; i < n; ++i) acc = Op::combine(acc, loadInLoop<S, A>(p[i * stride]));
    return acc;
  }
}

// Reduces linear indices [begin, end) of the reduced space, in runs along its inner axis.
template <typename S, typename A, typename Op>
A reduceRange(const S* base, const StridedSpace& red, int64_t begin, int64_t end) {
  A acc = Op::init();
  if (begin >= end) return acc;
  if (red.rank() == 0) return Op::combine(acc, loadInLoop<S, A>(base[0]));
  const int64_t last = red.rank() - 1, inner = red.shape[last], stride = red.strides[0][last];
  Odometer pos(red, begin);
  for (int64_t i = begin; i < end;) {
    const int64_t run = std::min(inner - pos.index[last], end - i);
    acc = accumulateRun<S, A, Op>(base + pos.offset, run, stride, acc);
    i += run;
    // Jump to the start of the next run: step the inner axis to its end, then carry once.
    pos.offset += (inner - 1 - pos.index[last]) * stride;
    pos.index[last] = inner - 1;
    pos.next();
  }
  return acc;
}

int64_t chunksFor(int64_t tasks, int64_t reduce_len) {
#ifdef _OPENMP
  const int64_t threads = omp_get_max_threads();
#else
  const int64_t threads = 1;  // built without OpenMP (MESHFUSE_OPENMP=OFF)
#endif
  if (tasks >= 4 * threads) return 1;
  const int64_t wanted = (4 * threads + tasks - 1) / tasks;
  return std::max<int64_t>(1, std::min(wanted, reduce_len / kMinChunk));
}

struct ReductionPlan {
  StridedSpace kept;  // operands: input strides, output strides
  StridedSpace red;   // operand: input strides
  int64_t outputs = 0, count = 0;
};

template <typename S, typename A, typename Op>
void reduceRows(const S* base, const ReductionPlan& p, A* result) {
  const int64_t chunks = chunksFor(p.outputs, p.count);
  std::vector<A> partial(chunks > 1 ? p.outputs * chunks : 0);
  const int64_t tasks = p.outputs * chunks;
#pragma omp parallel for schedule(static) if (p.outputs * p.count >= kParallelThreshold)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t m = t / chunks, c = t % chunks;
    int64_t in_off, out_off;
    keptOffsets(p.kept, m, in_off, out_off);
    A acc = reduceRange<S, A, Op>(base + in_off, p.red, p.count * c / chunks, p.count * (c + 1) / chunks);
    if (chunks == 1)
      result[out_off] = acc;
    else
      partial[t] = acc;
  }
  if (chunks == 1) return;
  for (int64_t m = 0; m < p.outputs; ++m) {
    int64_t in_off, out_off;
    keptOffsets(p.kept, m, in_off, out_off);
    A acc = Op::init();
    for (int64_t c = 0; c < chunks; ++c) acc = Op::combine(acc, partial[m * chunks + c]);
    result[out_off] = acc;
  }
}

// acc[j] = combine(acc[j], src[j * stride]) for j < n: one reduced element of a block of columns.
// Its own SIMD clones (the library's baseline build would convert and add two doubles at a time;
// AVX-512 does eight, and the bias gradients of the transformer layer's backward, column sums of
// [512, 2048] floats, took 0.5-0.9 ms each).
template <typename S, typename A, typename Op>
MESHFUSE_SIMD_CLONES void accumulateColumns(A* __restrict acc, const S* __restrict src, int64_t n, int64_t stride) {
  if (stride == 1) {
    for (int64_t j = 0; j < n; ++j) acc[j] = Op::combine(acc[j], loadInLoop<S, A>(src[j]));
  } else {
    for (int64_t j = 0; j < n; ++j) acc[j] = Op::combine(acc[j], loadInLoop<S, A>(src[j * stride]));
  }
}

// The same for four reduced elements at once (rows r..r+3 of a column block), in order: the block's
// accumulators are loaded and stored once per four rows instead of once per row (sums only).
template <typename S, typename A, typename Op>
MESHFUSE_SIMD_CLONES void accumulateColumns4(A* __restrict acc, const S* __restrict s0, const S* __restrict s1,
                                             const S* __restrict s2, const S* __restrict s3, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const A a = Op::combine(Op::combine(acc[j], loadInLoop<S, A>(s0[j])), loadInLoop<S, A>(s1[j]));
    acc[j] = Op::combine(Op::combine(a, loadInLoop<S, A>(s2[j])), loadInLoop<S, A>(s3[j]));
  }
}

template <typename S, typename A, typename Op>
void reduceColumns(const S* base, const ReductionPlan& p, A* result) {
  // The inner kept axis is the vector axis; the outer kept axes pick a block's origin.
  StridedSpace outer = p.kept;
  const int64_t vlen_total = outer.shape.back(), vin = outer.strides[0].back(), vout = outer.strides[1].back();
  outer.shape.pop_back();
  outer.strides[0].pop_back();
  outer.strides[1].pop_back();
  const int64_t block_len = std::max<int64_t>(1, std::min<int64_t>(vlen_total, kColumnBlockBytes / sizeof(A)));
  const int64_t outer_n = outer.numel(), blocks = (vlen_total + block_len - 1) / block_len;
  // Each reduced row of a block is block_len elements of work: split the rows by that much work.
  const int64_t chunks = std::min(p.count, chunksFor(outer_n * blocks, p.count * block_len));
  std::vector<A> partial(chunks > 1 ? outer_n * vlen_total * chunks : 0);
  const int64_t tasks = outer_n * blocks * chunks;
#pragma omp parallel for schedule(static) if (p.outputs * p.count >= kParallelThreshold)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / (blocks * chunks), b = (t / chunks) % blocks, c = t % chunks;
    int64_t in_off, out_off;
    keptOffsets(outer, o, in_off, out_off);
    const int64_t j0 = b * block_len, vlen = std::min(block_len, vlen_total - j0);
    std::vector<A> acc_buffer(static_cast<size_t>(vlen), Op::init());
    A* acc = acc_buffer.data();
    const int64_t r_begin = p.count * c / chunks, r_end = p.count * (c + 1) / chunks;
    Odometer pos(p.red, r_begin);
    const S* block_base = base + in_off + j0 * vin;
    int64_t r = r_begin;
    if (Op::is_sum && vin == 1) {  // a max's nested selects do not vectorize: it takes a row at a time
      for (; r + 4 <= r_end; r += 4) {
        const S* rows[4];
        for (const S*& row : rows) {
          row = block_base + pos.offset;
          pos.next();
        }
        accumulateColumns4<S, A, Op>(acc, rows[0], rows[1], rows[2], rows[3], vlen);
      }
    }
    for (; r < r_end; ++r, pos.next()) accumulateColumns<S, A, Op>(acc, block_base + pos.offset, vlen, vin);
    for (int64_t j = 0; j < vlen; ++j) {
      if (chunks == 1)
        result[out_off + (j0 + j) * vout] = acc[j];
      else
        partial[((o * vlen_total) + j0 + j) * chunks + c] = acc[j];
    }
  }
  if (chunks == 1) return;
  for (int64_t o = 0; o < outer_n; ++o) {
    int64_t in_off, out_off;
    keptOffsets(outer, o, in_off, out_off);
    for (int64_t j = 0; j < vlen_total; ++j) {
      A acc = Op::init();
      for (int64_t c = 0; c < chunks; ++c) acc = Op::combine(acc, partial[(o * vlen_total + j) * chunks + c]);
      result[out_off + j * vout] = acc;
    }
  }
}

// Sorts a group's axes by decreasing input stride (the order that walks memory forward), then
// coalesces them.
void sortAndCoalesce(StridedSpace& s) {
  std::vector<size_t> order(s.shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return std::abs(s.strides[0][a]) > std::abs(s.strides[0][b]); });
  StridedSpace sorted;
  sorted.strides.resize(s.strides.size());
  for (size_t i : order) {
    sorted.shape.push_back(s.shape[i]);
    for (size_t k = 0; k < s.strides.size(); ++k) sorted.strides[k].push_back(s.strides[k][i]);
  }
  sorted.coalesce();
  s = std::move(sorted);
}

ReductionPlan planReduction(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  ReductionPlan p;
  p.kept.strides.resize(2);
  p.red.strides.resize(1);
  // Output strides of the kept axes: the output is contiguous over the kept (and kept-as-1) axes.
  std::vector<int64_t> out_shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced || keepdim) out_shape.push_back(reduced ? 1 : x.size(d));
  }
  const std::vector<int64_t> out_strides = contiguousStrides(out_shape);
  int64_t out_axis = 0;
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (reduced) {
      p.red.shape.push_back(x.size(d));
      p.red.strides[0].push_back(x.strides()[d]);
      if (keepdim) ++out_axis;
    } else {
      p.kept.shape.push_back(x.size(d));
      p.kept.strides[0].push_back(x.strides()[d]);
      p.kept.strides[1].push_back(out_strides[out_axis++]);
    }
  }
  p.outputs = p.kept.numel();
  p.count = p.red.numel();
  sortAndCoalesce(p.kept);
  sortAndCoalesce(p.red);
  if (p.kept.rank() > kMaxRank || p.red.rank() > kMaxRank)
    throw std::invalid_argument("CPU reduction: rank exceeds " + std::to_string(kMaxRank));
  return p;
}

template <typename S, typename A, typename Op>
void reduceInto(const S* base, const ReductionPlan& p, A* result) {
  const int64_t red_inner = p.red.rank() ? std::abs(p.red.strides[0].back()) : 0;
  const bool columns = p.kept.rank() > 0 && p.red.rank() > 0 && red_inner != 1 && p.kept.shape.back() >= 8 &&
                       std::abs(p.kept.strides[0].back()) < red_inner;
  if (columns)
    reduceColumns<S, A, Op>(base, p, result);
  else
    reduceRows<S, A, Op>(base, p, result);
}

}  // namespace

void runReduction(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  const Expr& e = soleExpr(seg);
  if (!isReduction(e.op())) throw std::logic_error("CPU reduction: " + toString(e.op()) + " in " + seg.toString());
  const Tensor& x = inputTensor(values, shapes, e.input(0));
  const std::vector<int64_t> axes =
      normalizeAxes(e.attrs().axes, x.dim(), toString(e.op()) + "(" + e.input(0)->name() + ")");
  ReductionPlan p = planReduction(x, axes, e.attrs().keepdim);
  Tensor& out = allocateOutput(values, shapes, e.out());
  if (out.numel() != p.outputs)
    throw std::logic_error("CPU reduction: " + e.out()->name() + " has shape " + shapeToString(out.shape()) +
                           ", inconsistent with reducing " + shapeToString(x.shape()));
  if (p.outputs == 0) return;
  if (e.op() == OpType::ReduceMax && p.count == 0)
    throw std::invalid_argument("max(" + e.input(0)->name() + "): reducing an axis of extent 0 has no identity");

  if (p.count == 1) {
    // Every reduced axis has extent 1: the result is the input, converted to the output's dtype
    // (the sum, max and mean of one element). A strided copy, with no accumulator array (a
    // [1, 4096, 4096] sum took 340 ms through the column kernel and its 128 MB of doubles).
    std::vector<int64_t> view_shape, view_strides;
    for (int64_t d = 0; d < x.dim(); ++d) {
      const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
      if (reduced && !e.attrs().keepdim) continue;
      view_shape.push_back(x.size(d));
      view_strides.push_back(x.strides()[d]);
    }
    out.copyFrom(Tensor(x.storage(), x.byteOffset(), x.dtype(), view_shape, view_strides));
    return;
  }

  dispatchStorage(x.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (e.op() == OpType::ReduceMax) {
      // A max is one of its operands: float holds a Float, Half or BFloat16 one exactly, with twice
      // the lanes of double.
      using M =
          std::conditional_t<std::is_same_v<S, double>, double, std::conditional_t<kIsFloatStorage<S>, float, int64_t>>;
      std::vector<M> result(static_cast<size_t>(p.outputs));
      reduceInto<S, M, MaxOp<M>>(x.dataAs<const S>(), p, result.data());
      dispatchStorage(out.dtype(), [&](auto out_tag) {
        using O = typename decltype(out_tag)::type;
        O* dst = out.dataAs<O>();
        for (int64_t i = 0; i < p.outputs; ++i) dst[i] = Elem<O>::template store<M>(result[i]);
      });
      return;
    }
    using A = std::conditional_t<kIsFloatStorage<S>, double, int64_t>;  // the accumulator
    std::vector<A> result(static_cast<size_t>(p.outputs));
    reduceInto<S, A, SumOp<A>>(x.dataAs<const S>(), p, result.data());
    const bool mean = e.op() == OpType::Mean;
    const double count = static_cast<double>(p.count);
    dispatchStorage(out.dtype(), [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      O* dst = out.dataAs<O>();
      const int64_t n = p.outputs;
      if (mean) {
        for (int64_t i = 0; i < n; ++i)
          dst[i] = Elem<O>::template store<double>(static_cast<double>(result[i]) / count);
      } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = Elem<O>::template store<A>(result[i]);
      }
    });
  });
}

}  // namespace meshfuse::cpu
