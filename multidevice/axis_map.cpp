#include "multidevice/axis_map.h"

#include <algorithm>

namespace meshfuse {

namespace {
// Numpy broadcasting aligns trailing axes.
std::vector<int> rightAligned(int64_t in_rank, int64_t out_rank) {
  std::vector<int> m(in_rank);
  for (int64_t a = 0; a < in_rank; ++a) m[a] = static_cast<int>(a + out_rank - in_rank);
  return m;
}

std::vector<int> matmulAxes(const Expr* e, size_t i) {
  int64_t ra = e->inputTv(0)->ndim(), rb = e->inputTv(1)->ndim();
  int64_t out_rank = e->out()->ndim();
  bool a_vec = ra == 1, b_vec = rb == 1;
  int64_t out_batch = out_rank - (a_vec ? 0 : 1) - (b_vec ? 0 : 1);
  int64_t rank = i == 0 ? ra : rb;
  std::vector<int> m(rank, kNoAxis);
  if (i == 0) {
    m[rank - 1] = kReducedAxis;
    if (!a_vec) m[rank - 2] = static_cast<int>(out_batch);
    int64_t batch = a_vec ? 0 : rank - 2;
    for (int64_t a = 0; a < batch; ++a) m[a] = static_cast<int>(a + out_batch - batch);
  } else {
    if (b_vec) {
      m[0] = kReducedAxis;
    } else {
      m[rank - 2] = kReducedAxis;
      m[rank - 1] = static_cast<int>(out_rank - 1);
      int64_t batch = rank - 2;
      for (int64_t a = 0; a < batch; ++a) m[a] = static_cast<int>(a + out_batch - batch);
    }
  }
  return m;
}

std::vector<int> linearAxes(const Expr* e, size_t i) {
  int64_t out_rank = e->out()->ndim();
  const TensorView* in = e->inputTv(i);
  if (i == 0) {
    std::vector<int> m(in->ndim());
    for (int64_t a = 0; a + 1 < in->ndim(); ++a) m[a] = static_cast<int>(a);
    m.back() = kReducedAxis;
    return m;
  }
  if (i == 1) {
    if (in->ndim() == 1) return {kReducedAxis};
    return {static_cast<int>(out_rank - 1), kReducedAxis};
  }
  return {static_cast<int>(out_rank - 1)};  // bias [N]
}
// A reshape maps groups of consecutive input axes onto groups of consecutive output axes of the
// same element count. A group's first input axis maps to its first output axis: an outer split of
// it into d blocks is an outer split of the flattened group into d contiguous runs, which is the
// same as an outer split of the first output axis wherever the extents divide by d (the resharding
// pass checks that). Splits (e = h * dh -> [h, dh]) and merges ([b, s] -> b * s) are such groups.
std::vector<int> reshapeAxes(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int> m(in.size(), kNoAxis);
  const bool known = std::none_of(in.begin(), in.end(), [](int64_t e) { return e < 0; }) &&
                     std::none_of(out.begin(), out.end(), [](int64_t e) { return e < 0; });
  if (!known) {
    // Symbolic extents (a batch bound at execute, say): the static trailing axes form groups from
    // the back, as below from the front ([-1, 16] -> [-1, 4, 4]: axis 1 -> axis 1); what is left on
    // each side then holds as many elements as the other, so it is one group starting at axis 0.
    size_t i = in.size(), j = out.size();
    while (i > 0 && j > 0 && in[i - 1] >= 0 && out[j - 1] >= 0) {
      if (in[i - 1] == 1 && out[j - 1] != 1) {
        --i;
        continue;
      }
      if (out[j - 1] == 1 && in[i - 1] != 1) {
        --j;
        continue;
      }
      const size_t group_end_i = i, group_end_j = j;
      int64_t pi = in[--i], pj = out[--j];
      while (pi != pj) {
        if (pi < pj && i > 0 && in[i - 1] >= 0)
          pi *= in[--i];
        else if (pj < pi && j > 0 && out[j - 1] >= 0)
          pj *= out[--j];
        else
          break;
      }
      if (pi != pj) {     // the group reaches into the symbolic part: it belongs to the prefix, whole
        i = group_end_i;  // ([-1, 8] -> [64]: one group from axis 0, which keeps a sharding there)
        j = group_end_j;
        break;
      }
      m[i] = static_cast<int>(j);
    }
    if (i > 0 && j > 0) m[0] = 0;
    return m;
  }
  size_t i = 0, j = 0;
  while (i < in.size() && j < out.size()) {
    // Extent-1 axes form groups of their own where they can (they carry no blocks). One facing an
    // axis of extent > 1 joins no group: the group starts at the next axis, where the blocks of a
    // sharding begin ([1, 4, 1] sharded on axis 1 -> [2, 2] sharded on axis 0 stays local).
    if (in[i] == 1 && out[j] != 1) {
      ++i;
      continue;
    }
    if (out[j] == 1 && in[i] != 1) {
      ++j;
      continue;
    }
    const size_t gi = i, gj = j;
    int64_t pi = in[i++], pj = out[j++];
    while (pi != pj) {
      if (pi < pj && i < in.size())
        pi *= in[i++];
      else if (j < out.size())
        pj *= out[j++];
      else
        break;
    }
    if (pi != pj) break;
    m[gi] = static_cast<int>(gj);
  }
  return m;
}
}  // namespace

std::vector<int> inputToOutputAxes(const Expr* e, size_t i) {
  const TensorView* in = e->inputTv(i);
  if (in == nullptr) return {};
  const int64_t out_rank = e->out()->ndim();
  const auto& attrs = e->attrs();
  OpType op = e->op();
  if (isPointwise(op)) return rightAligned(in->ndim(), out_rank);
  switch (op) {
    case OpType::Sum:
    case OpType::ReduceMax:
    case OpType::Mean: {
      std::vector<int> m(in->ndim());
      int next = 0;
      for (int64_t a = 0; a < in->ndim(); ++a) {
        bool reduced = std::find(attrs.axes.begin(), attrs.axes.end(), a) != attrs.axes.end();
        if (reduced) {
          m[a] = kReducedAxis;
          if (attrs.keepdim) ++next;
        } else {
          m[a] = next++;
        }
      }
      return m;
    }
    case OpType::BroadcastInDim: {
      std::vector<int> m(in->ndim());
      for (int64_t a = 0; a < in->ndim(); ++a) m[a] = static_cast<int>(attrs.axes[a]);
      return m;
    }
    case OpType::Permute: {
      std::vector<int> m(in->ndim());
      for (size_t j = 0; j < attrs.axes.size(); ++j) m[attrs.axes[j]] = static_cast<int>(j);
      return m;
    }
    case OpType::Reshape: return reshapeAxes(in->shape(), e->out()->shape());
    case OpType::StrideOrder: return rightAligned(in->ndim(), out_rank);
    case OpType::Slice: {
      // An axis taken whole keeps its blocks; a sliced one has no block-aligned counterpart.
      std::vector<int> m(in->ndim());
      for (int64_t a = 0; a < in->ndim(); ++a) {
        const bool whole = attrs.axes[a] == 0 && attrs.strides[a] == 1 && attrs.shape[a] == in->shape()[a];
        m[a] = whole ? static_cast<int>(a) : kNoAxis;
      }
      return m;
    }
    case OpType::Cat: {
      std::vector<int> m(in->ndim());
      for (int64_t a = 0; a < in->ndim(); ++a) m[a] = a == attrs.axes[0] ? kNoAxis : static_cast<int>(a);
      return m;
    }
    case OpType::SdpaFwd:
    case OpType::SdpaBwd: {
      // Batch and heads pass through to the (first) result; the other axes are mixed by the op.
      std::vector<int> m(in->ndim(), kNoAxis);
      for (int64_t a = 0; a < std::min<int64_t>(2, in->ndim()); ++a) m[a] = static_cast<int>(a);
      return m;
    }
    case OpType::Matmul: return matmulAxes(e, i);
    case OpType::Linear: return linearAxes(e, i);
    default: break;
  }
  return std::vector<int>(in->ndim(), kNoAxis);
}

int inputAxisFor(const Expr* e, size_t i, int b) {
  std::vector<int> m = inputToOutputAxes(e, i);
  for (size_t a = 0; a < m.size(); ++a)
    if (m[a] == b) return static_cast<int>(a);
  return -1;
}

}  // namespace meshfuse
