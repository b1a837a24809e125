// An index space (row-major extents) walked by several operands at once, each with its own strides
// (in elements; 0 repeats an element along a broadcast axis). Kernels first simplify the space:
// axes of extent 1 are dropped and neighbouring axes that every operand walks as one run are merged,
// so a contiguous tensor becomes one axis and a broadcast bias two.
#pragma once
#include <cstdint>
#include <vector>

namespace meshfuse::cpu {

struct StridedSpace {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> strides;  // strides[operand][axis]

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  // Drops extent-1 axes and merges axis d into d+1 where stride[d] == stride[d+1] * shape[d+1]
  // for every operand. Keeps the row-major order of the space, so linear indices are unchanged.
  void coalesce();
  // Element offset of each operand at row-major linear index `linear`; fills `index` with the
  // multi-index (both sized by the caller's use; resized here).
  void locate(int64_t linear, std::vector<int64_t>& index, std::vector<int64_t>& offsets) const;
};

// Strides that read `shape`/`strides` (a tensor) broadcast to `out_shape` with numpy's rules:
// dims aligned on the right, extent-1 and missing dims get stride 0.
std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                                      const std::vector<int64_t>& out_shape);

}  // namespace meshfuse::cpu
