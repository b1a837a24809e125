#include "host_ir/stream_loop.h"

#include <algorithm>

#include "multidevice/communicator.h"

namespace meshfuse {

namespace {
std::vector<int64_t> withLeading(std::vector<int64_t> rest, std::initializer_list<int64_t> leading) {
  rest.insert(rest.begin(), leading);
  return rest;
}
std::vector<int64_t> tail(const std::vector<int64_t>& shape) { return {shape.begin() + 1, shape.end()}; }

// Chunk i of a [d * s * r, ...] row space viewed as [d, s, r, ...]: the rows {j*s*r + i*r + t}.
Tensor chunkRows(const Tensor& t, int64_t d, int64_t s, int64_t r, int64_t i) {
  return t.view(withLeading(tail(t.shape()), {d, s, r})).slice(1, i, 1);
}

struct Lanes {
  Tracer* tracer;
  int64_t streams;
  void record(const std::string& name, const char* cat, int64_t chunk, double begin, bool comm) const {
    if (!tracer) return;
    tracer->add(name + " [chunk " + std::to_string(chunk) + "]", cat, comm ? 1 + chunk % streams : 0, begin,
                tracer->nowUs());
  }
  double now() const { return tracer ? tracer->nowUs() : 0; }
};
}  // namespace

void runStreamLoop(const HostIrContainer& hic, const StreamLoop& loop, ValueMap& values, SegmentExecutor& executor,
                   const HostIrEvaluatorParams& params, Tracer* tracer) {
  const Communication& c = hic.communications[loop.communication];
  Backend& backend = Communicator::instance().backend(c.backend, c.team);
  const Segment& seg = hic.segments[loop.segment];
  const Expr* mm = seg.exprs.front();
  const int64_t d = backend.teamSize(), s = loop.chunks;
  const int64_t depth = std::max<int64_t>(1, std::min(params.number_of_streams, s));
  const Lanes lanes{tracer, depth};
  const std::string comm_name = toString(c.type);
  const std::string mm_name = toString(mm->op());

  if (loop.kind == StreamLoop::Kind::AllgatherThenMatmul) {
    TensorView* gathered = c.out;  // the matmul's first operand
    TensorView* y = mm->out();
    Tensor x_local = values.tensor(c.in).contiguous();  // [rows, ...]
    const int64_t r = x_local.size(0) / s;
    const std::vector<int64_t> y_shape = hic.local_shapes.at(y);
    Tensor y_out = Tensor::empty(y_shape, y->dtype(), hic.device);
    std::vector<Tensor> buffers(s);
    std::vector<std::unique_ptr<Work>> works(s);
    std::vector<double> posted(s);
    auto post = [&](int64_t i) {
      Tensor chunk = x_local.slice(0, i * r, r);
      buffers[i] = Tensor::empty(withLeading(chunk.shape(), {d}), chunk.dtype(), hic.device);
      posted[i] = lanes.now();
      works[i] = backend.allgather(chunk, buffers[i]);
    };
    for (int64_t i = 0; i < depth; ++i) post(i);
    ShapeMap shapes = hic.local_shapes;
    shapes[gathered] = withLeading(tail(x_local.shape()), {d * r});
    shapes[y] = withLeading(tail(y_shape), {d * r});
    for (int64_t i = 0; i < s; ++i) {
      works[i]->wait(params.timeout);
      lanes.record(comm_name, "communication", i, posted[i], true);
      if (i + depth < s) post(i + depth);
      ValueMap chunk_values = values;
      chunk_values.tensors[gathered] = buffers[i].view(shapes[gathered]);
      double begin = lanes.now();
      executor.run(seg, chunk_values, shapes);
      // Chunk i holds rows i of every device's block: write them back to their places in y.
      Tensor out_i = chunk_values.tensor(y).contiguous();
      Tensor dst = chunkRows(y_out, d, s, r, i);
      dst.copyFrom(out_i.view(dst.shape()));
      lanes.record(mm_name, "compute", i, begin, false);
      buffers[i] = Tensor();
    }
    values.tensors[y] = y_out;
    return;
  }

  // MatmulThenReduceScatter: compute chunk i's partial rows, reduce-scatter them, go on.
  TensorView* partial = mm->out();
  TensorView* y = c.out;
  TensorView* lhs = mm->inputTv(0);
  Tensor lhs_full = values.tensor(lhs).contiguous();  // [d * s * r, ...]
  const std::vector<int64_t> y_shape = hic.local_shapes.at(y);
  const int64_t r = y_shape[0] / s;
  Tensor y_out = Tensor::empty(y_shape, y->dtype(), hic.device);
  std::vector<Tensor> partials(s);
  std::vector<std::unique_ptr<Work>> works(s);
  std::vector<double> posted(s);
  ShapeMap shapes = hic.local_shapes;
  shapes[lhs] = withLeading(tail(lhs_full.shape()), {d * r});
  shapes[partial] = withLeading(tail(hic.local_shapes.at(partial)), {d * r});
  auto finish = [&](int64_t i) {
    works[i]->wait(params.timeout);
    lanes.record(comm_name, "communication", i, posted[i], true);
    partials[i] = Tensor();
  };
  for (int64_t i = 0; i < s; ++i) {
    double begin = lanes.now();
    ValueMap chunk_values = values;
    chunk_values.tensors[lhs] = chunkRows(lhs_full, d, s, r, i).contiguous().view(shapes[lhs]);
    executor.run(seg, chunk_values, shapes);
    partials[i] = chunk_values.tensor(partial).contiguous();  // block j = the rows device j keeps
    lanes.record(mm_name, "compute", i, begin, false);
    Tensor out_slice = y_out.slice(0, i * r, r);
    posted[i] = lanes.now();
    works[i] = backend.reduceScatter(partials[i], out_slice, c.op);
    if (i >= depth) finish(i - depth);
  }
  for (int64_t i = std::max<int64_t>(0, s - depth); i < s; ++i) finish(i);
  values.tensors[y] = y_out;
}

}  // namespace meshfuse
