#include "runtime/cuda/views.h"

#include <stdexcept>

#include "ops/shape_inference.h"

namespace meshfuse::cuda {

namespace {
// Output axis dims[i] takes input axis i (its stride, or 0 where an extent of 1 broadcasts); the
// other output axes are new, with stride 0.
Tensor restrideForBroadcast(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& out_shape,
                            const std::string& what) {
  std::vector<int64_t> strides(out_shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t extent = x.size(static_cast<int64_t>(i)), target = out_shape.at(dims[i]);
    if (extent != target && extent != 1)
      throw UserError(what + ": axis " + std::to_string(i) + " of extent " + std::to_string(extent) +
                      " cannot broadcast to " + std::to_string(target));
    strides[dims[i]] = extent == target ? x.strides()[i] : 0;
  }
  return Tensor(x.storage(), x.byteOffset(), x.dtype(), out_shape, strides);
}
}  // namespace

Tensor applyView(const Expr& e, const Tensor& x, const std::vector<int64_t>& out_shape) {
  const std::string what = toString(e.op()) + "(" + e.input(0)->name() + ") on CUDA";
  Tensor result;
  switch (e.op()) {
    case OpType::Permute: result = x.permute(normalizeAxes(e.attrs().axes, x.dim(), what)); break;
    case OpType::BroadcastInDim: {
      const auto dims = normalizeAxes(e.attrs().axes, static_cast<int64_t>(out_shape.size()), what);
      if (dims.size() != static_cast<size_t>(x.dim()))
        throw UserError(what + ": broadcast_dims has " + std::to_string(dims.size()) + " entries for " + x.toString());
      result = restrideForBroadcast(x, dims, out_shape, what);
      break;
    }
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
