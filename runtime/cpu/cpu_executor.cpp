// makeCpuExecutor(): dispatches a Segment to the kernel of its kind.
#include <algorithm>
#include <stdexcept>

#include "runtime/cpu/cpu_kernels.h"

namespace meshfuse {

namespace cpu {

const std::vector<int64_t>& shapeOf(const ShapeMap& shapes, const TensorView* tv) {
  auto it = shapes.find(tv);
  if (it == shapes.end()) throw std::logic_error("CPU executor: no local shape bound for " + tv->name());
  return it->second;
}

const Tensor& inputTensor(const ValueMap& values, const ShapeMap& shapes, const Val* v) {
  const Tensor& t = values.tensor(v);
  if (t.device().type != DeviceType::CPU)
    throw std::invalid_argument("CPU executor: input " + v->name() + " is on " + t.device().toString() +
                                ", expected cpu");
  auto it = shapes.find(v);
  if (it != shapes.end() && it->second != t.shape())
    throw std::invalid_argument("CPU executor: input " + v->name() + " has shape " + shapeToString(t.shape()) +
                                ", expected " + shapeToString(it->second));
  if (t.dtype() != v->dtype())
    throw std::invalid_argument("CPU executor: input " + v->name() + " has dtype " + toString(t.dtype()) +
                                ", expected " + toString(v->dtype()));
  return t;
}

Tensor& allocateOutput(ValueMap& values, const ShapeMap& shapes, const TensorView* tv) {
  Tensor& slot = values.tensors[tv];
  slot = Tensor::empty(shapeOf(shapes, tv), tv->dtype());
  return slot;
}

const Expr& soleExpr(const Segment& seg) {
  if (seg.exprs.size() != 1)
    throw std::logic_error("CPU executor: a " + toString(seg.kind) + " segment holds one expr, got " +
                           std::to_string(seg.exprs.size()) + ": " + seg.toString());
  return *seg.exprs.front();
}

void dropInternalValues(const Segment& seg, ValueMap& values) {
  for (const Expr* e : seg.exprs)
    for (const Val* v : e->outputs())
      if (std::find(seg.outputs.begin(), seg.outputs.end(), v) == seg.outputs.end()) values.tensors.erase(v);
}

}  // namespace cpu

namespace {

class CpuExecutor final : public SegmentExecutor {
 public:
  void run(const Segment& seg, ValueMap& values, const ShapeMap& shapes) override {
    if (seg.kind == Segment::Kind::Matmul && seg.exprs.size() > 1) {
      runMatmulAndEpilogue(seg, values, shapes);
      return;
    }
    switch (seg.kind) {
      case Segment::Kind::Pointwise: cpu::runPointwise(seg, values, shapes); return;
      case Segment::Kind::Reduction: cpu::runReduction(seg, values, shapes); return;
      case Segment::Kind::Normalization: cpu::runNormalization(seg, values, shapes); return;
      case Segment::Kind::Matmul: cpu::runMatmul(seg, values, shapes); return;
      case Segment::Kind::View: cpu::runView(seg, values, shapes); return;
      case Segment::Kind::Attention: cpu::runAttention(seg, values, shapes); return;
    }
    throw std::logic_error("CPU executor: unknown segment kind");
  }
  Device device() const override { return Device::cpu(); }

 private:
  // A GEMM epilogue (runtime/segment.h) on the CPU is its exprs after the matmul: BLAS has no
  // epilogue, and the pointwise kernel reads the product while it is still in the cache where the
  // rows are few. Values the parts pass between them are dropped afterwards.
  void runMatmulAndEpilogue(const Segment& seg, ValueMap& values, const ShapeMap& shapes) {
    for (const Segment& part : splitIntoParts(seg)) run(part, values, shapes);
    cpu::dropInternalValues(seg, values);
  }
};

}  // namespace

std::unique_ptr<SegmentExecutor> makeCpuExecutor() { return std::make_unique<CpuExecutor>(); }

}  // namespace meshfuse
