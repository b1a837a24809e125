#include "host_ir/comm_layout.h"

#include <stdexcept>

namespace meshfuse {

namespace {
// Whether every axis before `axis` has extent 1: then chunks along `axis` are already contiguous blocks.
bool leadingAxis(const std::vector<int64_t>& shape, int axis) {
  for (int i = 0; i < axis; ++i)
    if (shape[i] != 1) return false;
  return true;
}

// shape with `axis` split into [parts, extent/parts].
std::vector<int64_t> splitShape(const std::vector<int64_t>& shape, int axis, int64_t parts) {
  std::vector<int64_t> s = shape;
  if (shape[axis] % parts != 0)
    throw std::logic_error("axis " + std::to_string(axis) + " of " + shapeToString(shape) + " does not split into " +
                           std::to_string(parts));
  s[axis] = shape[axis] / parts;
  s.insert(s.begin() + axis, parts);
  return s;
}

// The permutation moving dimension `from` to position 0 (or position 0 to `to`).
std::vector<int64_t> moveToFront(size_t rank, int from) {
  std::vector<int64_t> p{from};
  for (size_t i = 0; i < rank; ++i)
    if (static_cast<int>(i) != from) p.push_back(static_cast<int64_t>(i));
  return p;
}
std::vector<int64_t> moveFromFront(size_t rank, int to) {
  std::vector<int64_t> p;
  for (size_t i = 1; i < rank; ++i) {
    if (static_cast<int>(p.size()) == to) p.push_back(0);
    p.push_back(static_cast<int64_t>(i));
  }
  if (static_cast<int>(p.size()) == to) p.push_back(0);
  return p;
}
}  // namespace

Tensor blocksAlong(const Tensor& t, int axis, int64_t parts) {
  Tensor c = t.contiguous();
  std::vector<int64_t> split = splitShape(c.shape(), axis, parts);
  if (leadingAxis(c.shape(), axis)) {
    std::vector<int64_t> block_shape(split.begin(), split.end());
    block_shape.erase(block_shape.begin() + axis);
    block_shape.insert(block_shape.begin(), parts);
    return c.view(block_shape);
  }
  Tensor permuted = c.view(split).permute(moveToFront(split.size(), axis));
  Tensor out = Tensor::empty(permuted.shape(), t.dtype(), t.device());
  out.copyFrom(permuted);
  return out;
}

Tensor unblockAlong(const Tensor& blocks, int axis, int64_t parts, const std::vector<int64_t>& out_shape) {
  std::vector<int64_t> split = splitShape(out_shape, axis, parts);
  if (leadingAxis(out_shape, axis)) return blocks.contiguous().view(out_shape);
  std::vector<int64_t> block_layout = split;  // [parts, ..., extent/parts, ...]
  block_layout.erase(block_layout.begin() + axis);
  block_layout.insert(block_layout.begin(), parts);
  Tensor src = blocks.contiguous().view(block_layout).permute(moveFromFront(split.size(), axis));
  Tensor out = Tensor::empty(out_shape, blocks.dtype(), blocks.device());
  Tensor out_split = out.view(split);
  out_split.copyFrom(src);
  return out;
}

}  // namespace meshfuse
