// View segments: permute, broadcast_in_dim and slice never copy (they restride the input);
// reshape is a view of a contiguous input and a copy of any other; cat copies unless its parts lie end
// to end in one storage (view_ops.h); stride_order copies.
#include <stdexcept>

#include "ops/shape_inference.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/view_ops.h"

namespace meshfuse::cpu {

namespace {

void runOneView(const Segment& seg, const Expr& e, ValueMap& values, const ShapeMap& shapes) {
  const Tensor& x = inputTensor(values, shapes, e.input(0));
  const std::vector<int64_t>& out_shape = shapeOf(shapes, e.out());
  const std::string what = toString(e.op()) + "(" + e.input(0)->name() + ")";
  Tensor result;
  switch (e.op()) {
    case OpType::Permute: result = x.permute(normalizeAxes(e.attrs().axes, x.dim(), what)); break;
    case OpType::BroadcastInDim:
      result = broadcastInDimView(x, normalizeAxes(e.attrs().axes, static_cast<int64_t>(out_shape.size()), what),
                                  out_shape, what);
      break;
    case OpType::Reshape:
      if (numelOf(out_shape) != x.numel())
        throw std::invalid_argument(what + ": cannot reshape " + shapeToString(x.shape()) + " into " +
                                    shapeToString(out_shape));
      result = x.contiguous().view(out_shape);
      break;
    case OpType::Slice: result = sliceView(x, e.attrs().axes, e.attrs().strides, out_shape); break;
    case OpType::StrideOrder: result = strideOrdered(x, e.attrs().axes); break;
    case OpType::Cat: {
      std::vector<Tensor> parts;
      for (const Val* v : e.inputs()) parts.push_back(inputTensor(values, shapes, v));
      result = concatenate(parts, e.attrs().axes.at(0), out_shape);
      break;
    }
    default: throw std::logic_error("CPU view: " + toString(e.op()) + " in " + seg.toString());
  }
  if (result.shape() != out_shape)
    throw std::logic_error("CPU view: " + what + " gives shape " + shapeToString(result.shape()) + ", expected " +
                           shapeToString(out_shape));
  values.tensors[e.out()] = std::move(result);
}

}  // namespace

// A view segment holds one view or a run of them (host_ir/view_merging.h): each binds its result,
// and the results only later views of the run read are dropped afterwards.
void runView(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
  for (const Expr* e : seg.exprs) runOneView(seg, *e, values, shapes);
  if (seg.exprs.size() > 1) dropInternalValues(seg, values);
}

}  // namespace meshfuse::cpu
