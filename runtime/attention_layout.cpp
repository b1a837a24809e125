#include "runtime/attention_layout.h"

#include <algorithm>
#include <limits>

namespace meshfuse {

std::optional<GradientBuffer> gradientBufferLike(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.defined() || q.dim() != 4 || k.storage() != q.storage() || v.storage() != q.storage() ||
      k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.shape() != q.shape() || v.shape() != q.shape() ||
      k.strides() != q.strides() || v.strides() != q.strides() || q.strides()[3] != 1)
    return std::nullopt;
  const auto item = static_cast<int64_t>(q.itemsize());
  const int64_t row = q.size(3);
  const int64_t dk = (k.byteOffset() - q.byteOffset()) / item, dv = (v.byteOffset() - q.byteOffset()) / item;
  int64_t outer = std::numeric_limits<int64_t>::max(), extent = 1;
  for (int64_t d = 0; d < 4; ++d) {
    if (q.strides()[d] < 0) return std::nullopt;
    if (d < 3 && q.size(d) > 1) outer = std::min(outer, q.strides()[d]);
    extent += (q.size(d) - 1) * q.strides()[d];
  }
  if (dk < row || dv - dk < row || dv + row > outer) return std::nullopt;
  return GradientBuffer{dv + extent, q.byteOffset()};
}

std::vector<Tensor> gradientViews(const GradientBuffer& buffer, const Tensor& q, const Tensor& k, const Tensor& v,
                                  DataType dtype, Device device) {
  const std::shared_ptr<Storage> storage = Tensor::empty({buffer.elements}, dtype, device).storage();
  const auto scale = static_cast<int64_t>(dataTypeSize(dtype)), input_item = static_cast<int64_t>(q.itemsize());
  std::vector<Tensor> views;
  for (const Tensor* input : {&q, &k, &v})
    views.emplace_back(storage, (input->byteOffset() - buffer.byte_offset) / input_item * scale, dtype, input->shape(),
                       input->strides());
  return views;
}

}  // namespace meshfuse
