// View segments: permute and broadcast_in_dim never copy (they restride the input); reshape is a
// view of a contiguous input and a copy of any other.
#include <stdexcept>

#include "ops/shape_inference.h"
#include "runtime/cpu/cpu_kernels.h"

namespace meshfuse::cpu {

namespace {

// Inserts the axes missing from broadcast_dims with extent 1 and stride 0, then expands every
// extent-1 axis to the output extent (stride 0).
Tensor broadcastInDim(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& out_shape,
                      const std::string& what) {
  if (dims.size() != static_cast<size_t>(x.dim()))
    throw std::invalid_argument(what + ": broadcast_dims has " + std::to_string(dims.size()) + " entries for rank " +
                                std::to_string(x.dim()));
  std::vector<int64_t> strides(out_shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i], extent = x.size(static_cast<int64_t>(i));
    if (extent == out_shape[d])
      strides[d] = x.strides()[i];
    else if (extent != 1)
      throw std::invalid_argument(what + ": input axis " + std::to_string(i) + " of extent " + std::to_string(extent) +
                                  " cannot broadcast to " + std::to_string(out_shape[d]));
  }
  return Tensor(x.storage(), x.byteOffset(), x.dtype(), out_shape, strides);
}

}  // namespace

void runView(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  const Expr& e = soleExpr(seg);
  const Tensor& x = inputTensor(values, shapes, e.input(0));
  const std::vector<int64_t>& out_shape = shapeOf(shapes, e.out());
  const std::string what = toString(e.op()) + "(" + e.input(0)->name() + ")";
  Tensor result;
  switch (e.op()) {
    case OpType::Permute: result = x.permute(normalizeAxes(e.attrs().axes, x.dim(), what)); break;
    case OpType::BroadcastInDim:
      result = broadcastInDim(x, normalizeAxes(e.attrs().axes, static_cast<int64_t>(out_shape.size()), what), out_shape,
                              what);
      break;
    case OpType::Reshape:
      if (numelOf(out_shape) != x.numel())
        throw std::invalid_argument(what + ": cannot reshape " + shapeToString(x.shape()) + " into " +
                                    shapeToString(out_shape));
      result = x.contiguous().view(out_shape);
      break;
    default: throw std::logic_error("CPU view: " + toString(e.op()) + " in " + seg.toString());
  }
  if (result.shape() != out_shape)
    throw std::logic_error("CPU view: " + what + " gives shape " + shapeToString(result.shape()) + ", expected " +
                           shapeToString(out_shape));
  values.tensors[e.out()] = std::move(result);
}

}  // namespace meshfuse::cpu
