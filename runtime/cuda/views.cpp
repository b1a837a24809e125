#include "runtime/cuda/views.h"

#include <stdexcept>

#include "ops/shape_inference.h"
#include "runtime/view_ops.h"

namespace meshfuse::cuda {

Tensor applyView(const Expr& e, const Tensor& x, const std::vector<int64_t>& out_shape) {
  const std::string what = toString(e.op()) + "(" + e.input(0)->name() + ") on CUDA";
  Tensor result;
  switch (e.op()) {
    case OpType::Permute: result = x.permute(normalizeAxes(e.attrs().axes, x.dim(), what)); break;
    case OpType::BroadcastInDim: {
      const auto dims = normalizeAxes(e.attrs().axes, static_cast<int64_t>(out_shape.size()), what);
      if (dims.size() != static_cast<size_t>(x.dim()))
        throw UserError(what + ": broadcast_dims has " + std::to_string(dims.size()) + " entries for " + x.toString());
      result = broadcastInDimView(x, dims, out_shape, what);
      break;
    }
    case OpType::Slice: result = sliceView(x, e.attrs().axes, e.attrs().strides, out_shape); break;
    case OpType::StrideOrder: result = strideOrdered(x, e.attrs().axes); break;
    case OpType::Reshape:
      if (numelOf(out_shape) != x.numel())
        throw UserError(what + ": cannot reshape " + shapeToString(x.shape()) + " into " + shapeToString(out_shape));
      result = x.contiguous().view(out_shape);
      break;
    default: throw std::logic_error("CUDA view: " + toString(e.op()) + " is not a view op");
  }
  if (result.shape() != out_shape)
    throw std::logic_error(what + " gives " + shapeToString(result.shape()) + ", expected " + shapeToString(out_shape));
  return result;
}

}  // namespace meshfuse::cuda
