#include "ops/shape_inference.h"

#include <algorithm>
#include <set>

#include "ops/attention.h"
#include "runtime/tensor.h"

namespace meshfuse {

namespace {
std::string axisDesc(const Val* v, int64_t axis, int64_t extent) {
  return v->name() + " axis " + std::to_string(axis) + " (extent " + std::to_string(extent) + ")";
}

std::vector<int64_t> broadcastShapes(OpType op, const std::vector<Val*>& inputs,
                                     const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  std::vector<int> from(rank, -1);  // which input decided each output extent, for messages
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    size_t offset = rank - s.size();
    for (size_t d = 0; d < s.size(); ++d) {
      int64_t a = out[offset + d], b = s[d];
      int64_t r;
      if (a == b || b == 1)
        r = a;
      else if (a == 1)
        r = b;
      else if (a == -1)
        r = b;
      else if (b == -1)
        r = a;
      else {
        const Val* other = inputs[from[offset + d]];
        size_t other_axis = offset + d - (rank - shapes[from[offset + d]].size());
        throw UserError(toString(op) + ": " + axisDesc(other, other_axis, a) + " does not broadcast with " +
                        axisDesc(inputs[i], d, b));
      }
      if (r != out[offset + d] || from[offset + d] < 0) from[offset + d] = static_cast<int>(i);
      out[offset + d] = r;
    }
  }
  return out;
}

// Checks that two contraction extents agree (when both are known).
void checkContraction(OpType op, const Val* a, int64_t a_axis, int64_t ka, const Val* b, int64_t b_axis, int64_t kb) {
  if (ka >= 0 && kb >= 0 && ka != kb)
    throw UserError(toString(op) + ": contraction extents differ: " + axisDesc(a, a_axis, ka) + " vs " +
                    axisDesc(b, b_axis, kb));
}

std::vector<int64_t> matmulShape(const std::vector<Val*>& in, const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<int64_t> a = shapes[0], b = shapes[1];
  if (a.empty() || b.empty()) throw UserError("matmul: operands must have rank >= 1");
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  int64_t ka = a.back(), kb = b[b.size() - 2];
  checkContraction(OpType::Matmul, in[0], static_cast<int64_t>(shapes[0].size()) - 1, ka, in[1],
                   b_vec ? 0 : static_cast<int64_t>(shapes[1].size()) - 2, kb);
  std::vector<int64_t> batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  std::vector<int64_t> out = broadcastShapes(OpType::Matmul, in, {batch_a, batch_b});
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b.back());
  return out;
}

std::vector<int64_t> linearShape(const std::vector<Val*>& in, const std::vector<std::vector<int64_t>>& shapes) {
  const auto& x = shapes[0];
  const auto& w = shapes[1];
  if (x.empty()) throw UserError("linear: input " + in[0]->name() + " must have rank >= 1");
  if (w.size() != 1 && w.size() != 2)
    throw UserError("linear: weight " + in[1]->name() + " must have rank 1 or 2, got " + std::to_string(w.size()));
  checkContraction(OpType::Linear, in[0], static_cast<int64_t>(x.size()) - 1, x.back(), in[1],
                   static_cast<int64_t>(w.size()) - 1, w.back());
  std::vector<int64_t> out(x.begin(), x.end() - 1);
  if (w.size() == 2) out.push_back(w[0]);
  if (in.size() > 2) {
    const auto& bias = shapes[2];
    int64_t n = w.size() == 2 ? w[0] : 1;
    if (bias.size() > 1 || (bias.size() == 1 && bias[0] >= 0 && n >= 0 && bias[0] != n))
      throw UserError("linear: bias " + in[2]->name() + " has shape " + shapeToString(bias) + ", expected [" +
                      std::to_string(n) + "]");
  }
  return out;
}
std::vector<int64_t> sliceShape(const Val* x, const std::vector<int64_t>& s, const ExprAttributes& attrs) {
  const std::string what = "slice(" + x->name() + ")";
  const size_t rank = s.size();
  if (attrs.axes.size() != rank || attrs.shape.size() != rank || attrs.strides.size() != rank)
    throw UserError(what + ": start_indices, end_indices and strides need " + std::to_string(rank) +
                    " entries each (one per axis), got " + std::to_string(attrs.axes.size()) + ", " +
                    std::to_string(attrs.shape.size()) + " and " + std::to_string(attrs.strides.size()));
  std::vector<int64_t> out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t start = attrs.axes[d], end = attrs.shape[d], step = attrs.strides[d];
    if (step < 1)
      throw UserError(what + ": axis " + std::to_string(d) + " has step " + std::to_string(step) + ", must be >= 1");
    if (start < 0 || end < start || (s[d] >= 0 && end > s[d]))
      throw UserError(what + ": axis " + std::to_string(d) + " slice [" + std::to_string(start) + ", " +
                      std::to_string(end) + ") is out of range for extent " + std::to_string(s[d]));
    out[d] = (end - start + step - 1) / step;
  }
  return out;
}

std::vector<int64_t> catShape(const std::vector<Val*>& in, const std::vector<std::vector<int64_t>>& shapes,
                              const ExprAttributes& attrs) {
  const std::vector<int64_t>& first = shapes[0];
  const int64_t rank = static_cast<int64_t>(first.size());
  if (rank == 0) throw UserError("cat: " + in[0]->name() + " is a 0-dimensional tensor");
  const int64_t dim = normalizeAxes(attrs.axes, rank, "cat")[0];
  std::vector<int64_t> out = first;
  for (size_t i = 1; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    if (static_cast<int64_t>(s.size()) != rank)
      throw UserError("cat: " + in[i]->name() + " has rank " + std::to_string(s.size()) + ", " + in[0]->name() +
                      " has rank " + std::to_string(rank));
    for (int64_t d = 0; d < rank; ++d) {
      if (d == dim) continue;
      if (s[d] >= 0 && first[d] >= 0 && s[d] != first[d])
        throw UserError("cat along axis " + std::to_string(dim) + ": " + axisDesc(in[i], d, s[d]) + " differs from " +
                        axisDesc(in[0], d, first[d]));
    }
    out[dim] = (out[dim] < 0 || s[dim] < 0) ? -1 : out[dim] + s[dim];
  }
  for (Val* v : in)
    if (v->dtype() != in[0]->dtype())
      throw UserError("cat: " + v->name() + " is " + toString(v->dtype()) + ", " + in[0]->name() + " is " +
                      toString(in[0]->dtype()) + " (cast them to one dtype first)");
  return out;
}
}  // namespace

std::vector<int64_t> normalizeAxes(const std::vector<int64_t>& axes, int64_t rank, const std::string& what) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t a : axes) {
    int64_t n = a < 0 ? a + rank : a;
    if (n < 0 || n >= rank)
      throw UserError(what + ": axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    if (!seen.insert(n).second) throw UserError(what + ": axis " + std::to_string(a) + " appears twice");
    out.push_back(n);
  }
  return out;
}

std::vector<int64_t> inferShape(OpType op, const ExprAttributes& attrs, const std::vector<Val*>& inputs,
                                const std::vector<std::vector<int64_t>>& shapes) {
  if (isUnary(op) || op == OpType::Cast || op == OpType::Set) return shapes[0];
  if (isBinary(op) || isTernary(op)) return broadcastShapes(op, inputs, shapes);
  if (isCreation(op)) return attrs.shape;
  const std::string what = toString(op) + "(" + inputs[0]->name() + ")";
  switch (op) {
    case OpType::Sum:
    case OpType::ReduceMax:
    case OpType::Mean: {
      const auto& s = shapes[0];
      std::vector<int64_t> axes = normalizeAxes(attrs.axes, static_cast<int64_t>(s.size()), what);
      std::vector<int64_t> out;
      for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
        bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
        if (!reduced)
          out.push_back(s[d]);
        else if (attrs.keepdim)
          out.push_back(1);
      }
      return out;
    }
    case OpType::BroadcastInDim: {
      const auto& s = shapes[0];
      const auto& out = attrs.shape;
      if (attrs.axes.size() != s.size())
        throw UserError(what + ": broadcast_dims has " + std::to_string(attrs.axes.size()) + " entries for rank " +
                        std::to_string(s.size()));
      std::vector<int64_t> dims = normalizeAxes(attrs.axes, static_cast<int64_t>(out.size()), what);
      std::vector<int64_t> result = out;
      for (size_t i = 0; i < s.size(); ++i) {
        int64_t target = out[dims[i]];
        if (i > 0 && dims[i] <= dims[i - 1]) throw UserError(what + ": broadcast_dims must increase");
        if (target == -1)
          result[dims[i]] = s[i];
        else if (s[i] != 1 && s[i] != -1 && s[i] != target)
          throw UserError(what + ": " + axisDesc(inputs[0], static_cast<int64_t>(i), s[i]) +
                          " cannot broadcast to extent " + std::to_string(target));
      }
      return result;
    }
    case OpType::Reshape: {
      const auto& s = shapes[0];
      std::vector<int64_t> out = attrs.shape;
      int64_t known = 1, inferred = -1;
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] == -1) {
          if (inferred >= 0) throw UserError(what + ": at most one -1 in the new shape");
          inferred = static_cast<int64_t>(i);
        } else if (out[i] < 0) {
          throw UserError(what + ": bad extent " + std::to_string(out[i]));
        } else {
          known *= out[i];
        }
      }
      bool input_known = std::all_of(s.begin(), s.end(), [](int64_t e) { return e >= 0; });
      if (!input_known) return out;
      int64_t n = numelOf(s);
      if (inferred >= 0) {
        if (known == 0 || n % known != 0)
          throw UserError(what + ": cannot reshape " + shapeToString(s) + " into " + shapeToString(attrs.shape));
        out[inferred] = n / known;
      } else if (known != n) {
        throw UserError(what + ": cannot reshape " + shapeToString(s) + " (" + std::to_string(n) + " elements) into " +
                        shapeToString(out));
      }
      return out;
    }
    case OpType::Permute: {
      const auto& s = shapes[0];
      if (attrs.axes.size() != s.size())
        throw UserError(what + ": permutation has " + std::to_string(attrs.axes.size()) + " entries for rank " +
                        std::to_string(s.size()));
      std::vector<int64_t> dims = normalizeAxes(attrs.axes, static_cast<int64_t>(s.size()), what);
      std::vector<int64_t> out;
      for (int64_t d : dims) out.push_back(s[d]);
      return out;
    }
    case OpType::Slice: return sliceShape(inputs[0], shapes[0], attrs);
    case OpType::Cat: return catShape(inputs, shapes, attrs);
    case OpType::StrideOrder: {
      if (attrs.axes.size() != shapes[0].size())
        throw UserError(what + ": stride_order has " + std::to_string(attrs.axes.size()) + " entries for rank " +
                        std::to_string(shapes[0].size()));
      normalizeAxes(attrs.axes, static_cast<int64_t>(shapes[0].size()), what);
      return shapes[0];
    }
    case OpType::Matmul: return matmulShape(inputs, shapes);
    case OpType::Linear: return linearShape(inputs, shapes);
    default: break;
  }
  throw UserError("inferShape: unhandled op " + toString(op));
}

std::vector<std::vector<int64_t>> inferShapes(const Expr* e, const std::vector<std::vector<int64_t>>& shapes) {
  if (isAttention(e->op())) return ops::attentionShapes(e->op(), e->inputs(), shapes);
  return {inferShape(e->op(), e->attrs(), e->inputs(), shapes)};
}

}  // namespace meshfuse
