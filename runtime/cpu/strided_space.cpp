#include "runtime/cpu/strided_space.h"

#include <stdexcept>

namespace meshfuse::cpu {

int64_t StridedSpace::numel() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

void StridedSpace::coalesce() {
  std::vector<int64_t> new_shape;
  std::vector<std::vector<int64_t>> new_strides(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !new_shape.empty();
    for (size_t k = 0; k < strides.size() && merge; ++k) merge = new_strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      new_shape.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) new_strides[k].back() = strides[k][d];
    } else {
      new_shape.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) new_strides[k].push_back(strides[k][d]);
    }
  }
  shape = std::move(new_shape);
  strides = std::move(new_strides);
}

void StridedSpace::locate(int64_t linear, std::vector<int64_t>& index, std::vector<int64_t>& offsets) const {
  index.assign(shape.size(), 0);
  offsets.assign(strides.size(), 0);
  for (int64_t d = rank() - 1; d >= 0; --d) {
    index[d] = linear % shape[d];
    linear /= shape[d];
    for (size_t k = 0; k < strides.size(); ++k) offsets[k] += index[d] * strides[k][d];
  }
}

std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                                      const std::vector<int64_t>& out_shape) {
  if (shape.size() > out_shape.size())
    throw std::logic_error("broadcastStrides: operand has a higher rank than the result");
  std::vector<int64_t> out(out_shape.size(), 0);
  const size_t offset = out_shape.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == out_shape[offset + d])
      out[offset + d] = strides[d];
    else if (shape[d] != 1)
      throw std::logic_error("broadcastStrides: extents do not broadcast");
  }
  return out;
}

}  // namespace meshfuse::cpu
