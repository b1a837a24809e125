#include "runtime/view_ops.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace meshfuse {

Tensor broadcastInDimView(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& out_shape,
                          const std::string& what) {
  if (dims.size() != static_cast<size_t>(x.dim()))
    throw std::invalid_argument(what + ": broadcast_dims has " + std::to_string(dims.size()) + " entries for rank " +
                                std::to_string(x.dim()));
  std::vector<int64_t> strides(out_shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t extent = x.size(static_cast<int64_t>(i)), target = out_shape.at(dims[i]);
    if (extent != target && extent != 1)
      throw std::invalid_argument(what + ": input axis " + std::to_string(i) + " of extent " + std::to_string(extent) +
                                  " cannot broadcast to " + std::to_string(target));
    strides[dims[i]] = extent == target ? x.strides()[i] : 0;
  }
  return Tensor(x.storage(), x.byteOffset(), x.dtype(), out_shape, strides);
}

Tensor sliceView(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& steps,
                 const std::vector<int64_t>& out_shape) {
  if (starts.size() != static_cast<size_t>(x.dim()) || steps.size() != starts.size() ||
      out_shape.size() != starts.size())
    throw std::logic_error("sliceView: one start, step and extent per axis of " + x.toString());
  int64_t offset = x.byteOffset();
  std::vector<int64_t> strides(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t last = starts[d] + steps[d] * (out_shape[d] - 1);
    if (out_shape[d] > 0 && (starts[d] < 0 || last >= x.size(d)))
      throw std::invalid_argument("slice: axis " + std::to_string(d) + " reads up to index " + std::to_string(last) +
                                  " of extent " + std::to_string(x.size(d)));
    if (out_shape[d] > 0) offset += starts[d] * x.strides()[d] * static_cast<int64_t>(x.itemsize());
    strides[d] = x.strides()[d] * steps[d];
  }
  return Tensor(x.storage(), offset, x.dtype(), out_shape, strides);
}

namespace {

// The concatenation as a view of the parts' storage when they already lie end to end along `dim`
// there (one storage, one dtype and strides, equal extents off `dim`, each part starting where the one
// before it ends); undefined otherwise. Element c of part k along `dim` sits at part 0's offset plus
// (the extents before k + c) times dim's stride, which is where the view puts it: the view reads
// exactly the parts' elements. CUDA attention's backward writes dq, dk and dv so when q, k and v are
// views of one fused projection (runtime/cuda/attention.cpp), and the transformer concatenates them.
Tensor adjacentConcatenation(const std::vector<Tensor>& parts, int64_t dim, const std::vector<int64_t>& out_shape) {
  const Tensor& first = parts.front();
  if (!first.defined() || static_cast<int64_t>(out_shape.size()) != first.dim()) return {};
  int64_t next = first.byteOffset();
  for (const Tensor& p : parts) {
    if (p.storage() != first.storage() || p.dtype() != first.dtype() || p.strides() != first.strides() ||
        p.byteOffset() != next)
      return {};
    for (int64_t d = 0; d < p.dim(); ++d)
      if (d != dim && p.size(d) != out_shape[d]) return {};
    next += p.size(dim) * p.strides()[dim] * static_cast<int64_t>(p.itemsize());
  }
  return Tensor(first.storage(), first.byteOffset(), first.dtype(), out_shape, first.strides());
}

}  // namespace

Tensor concatenate(const std::vector<Tensor>& parts, int64_t dim, const std::vector<int64_t>& out_shape) {
  if (parts.empty()) throw std::logic_error("concatenate: no tensors");
  int64_t covered = 0;
  for (const Tensor& p : parts) covered += p.size(dim);
  if (covered == out_shape.at(dim) && parts.size() > 1) {
    Tensor view = adjacentConcatenation(parts, dim, out_shape);
    if (view.defined()) return view;
  }
  Tensor out = Tensor::empty(out_shape, parts[0].dtype(), parts[0].device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    if (p.size(dim) > 0) out.slice(dim, at, p.size(dim)).copyFrom(p);
    at += p.size(dim);
  }
  if (at != out_shape.at(dim))
    throw std::logic_error("concatenate: the parts cover " + std::to_string(at) + " of " + shapeToString(out_shape));
  return out;
}

Tensor strideOrdered(const Tensor& x, const std::vector<int64_t>& stride_order) {
  const int64_t rank = x.dim();
  // Memory order, outermost first: the axes by decreasing stride_order.
  std::vector<int64_t> memory(rank);
  std::iota(memory.begin(), memory.end(), 0);
  std::stable_sort(memory.begin(), memory.end(),
                   [&](int64_t a, int64_t b) { return stride_order[a] > stride_order[b]; });
  std::vector<int64_t> memory_shape(rank), back(rank);
  for (int64_t i = 0; i < rank; ++i) {
    memory_shape[i] = x.size(memory[i]);
    back[memory[i]] = i;
  }
  Tensor out = Tensor::empty(memory_shape, x.dtype(), x.device()).permute(back);
  out.copyFrom(x);
  return out;
}

}  // namespace meshfuse
