#include "host_ir/stream_loop.h"

#include <algorithm>
#include <cstdlib>

#include "multidevice/communicator.h"
#include "multidevice/debug_log.h"
#include "runtime/stream_set.h"

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
  // Spans measured on the device: [begin, end) in the tracer's microseconds.
  void recordSpan(const std::string& name, const char* cat, int64_t chunk, double begin, double end, bool comm) const {
    if (!tracer) return;
    tracer->add(name + " [chunk " + std::to_string(chunk) + "]", cat, comm ? 1 + chunk % streams : 0, begin, end);
  }
};

int overlapSmMargin(const HostIrEvaluatorParams& params) {
  if (params.overlap_sm_margin >= 0) return static_cast<int>(params.overlap_sm_margin);
  const char* env = std::getenv("MESHFUSE_OVERLAP_SM_MARGIN");
  return env ? std::max(0, std::atoi(env)) : 0;
}

// MESHFUSE_DEBUG=INFO logs every communication as it is posted; a loop's are its chunks, with the
// bytes the chunk's post sends and receives (a slice of the whole tensors').
void logChunkPost(const Communication& c, int64_t chunk, int64_t chunks, const Tensor& in, const Tensor& out) {
  if (debug::enabled(debug::Level::Info))
    debug::info("post chunk " + std::to_string(chunk) + " of " + std::to_string(chunks) + ": " + c.toString() +
                " in_bytes=" + std::to_string(in.nbytes()) + " out_bytes=" + std::to_string(out.nbytes()));
}

// Device marks of one chunk: before its first step, between its two steps, after the second (the
// steps are communication then compute for an allgather loop, compute then communication for a
// reduce-scatter loop).
struct ChunkMarks {
  int start = -1, middle = -1, end = -1;
};

// Waits for every communication (their errors and deadlines), then writes the device-timed spans.
void finishAsync(StreamSet& streams, std::vector<std::unique_ptr<Work>>& works, const std::vector<ChunkMarks>& marks,
                 double created_us, const Lanes& lanes, const std::string& comm_name, const std::string& mm_name,
                 bool comm_first, std::chrono::milliseconds timeout) {
  streams.join();
  for (auto& w : works) w->wait(timeout);
  if (!lanes.tracer) return;
  std::vector<double> t = streams.markTimesUs(created_us);
  for (size_t i = 0; i < marks.size(); ++i) {
    const ChunkMarks& m = marks[i];
    const auto chunk = static_cast<int64_t>(i);
    if (comm_first) {
      lanes.recordSpan(comm_name, "communication", chunk, t[m.start], t[m.middle], true);
      lanes.recordSpan(mm_name, "compute", chunk, t[m.middle], t[m.end], false);
    } else {
      lanes.recordSpan(mm_name, "compute", chunk, t[m.start], t[m.middle], false);
      lanes.recordSpan(comm_name, "communication", chunk, t[m.middle], t[m.end], true);
    }
  }
}
}  // namespace

void runStreamLoop(const HostIrContainer& hic, const StreamLoop& loop, ValueMap& values, SegmentExecutor& executor,
                   const HostIrEvaluatorParams& params, Tracer* tracer) {
  const Communication& c = hic.communications[loop.communication];
  Backend& backend = Communicator::instance().backend(c.backend, c.team);
  const Segment& seg = hic.segments[loop.segment];
  const Expr* mm = seg.exprs.front();
  const int64_t d = backend.teamSize(), s = loop.chunks;
  const int64_t depth = std::max<int64_t>(1, std::min(params.number_of_streams, s));
  // Host-timed chunk events (the host path, and trace_host); the device path's events are device
  // time, measured by events it synchronizes on, which a trace of the host's time must not do.
  const Lanes lanes{tracer, depth};
  const Lanes device_lanes{params.trace_host ? nullptr : tracer, depth};
  const std::string comm_name = toString(c.type);
  const std::string mm_name = toString(mm->op());
  const int sm_margin = overlapSmMargin(params);

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
      logChunkPost(c, i, s, chunk, buffers[i]);
      works[i] = backend.allgather(chunk, buffers[i]);
    };
    ShapeMap shapes = hic.local_shapes;
    shapes[gathered] = withLeading(tail(x_local.shape()), {d * r});
    shapes[y] = withLeading(tail(y_shape), {d * r});
    auto compute = [&](int64_t i) {
      ValueMap chunk_values = values;
      chunk_values.tensors[gathered] = buffers[i].view(shapes[gathered]);
      executor.run(seg, chunk_values, shapes);
      // Chunk i holds rows i of every device's block: write them back to their places in y.
      Tensor out_i = chunk_values.tensor(y).contiguous();
      Tensor dst = chunkRows(y_out, d, s, r, i);
      dst.copyFrom(out_i.view(dst.shape()));
      buffers[i] = Tensor();
    };
    const double created_us = lanes.now();
    if (auto streams = backend.ordersOnCurrentStream()
                           ? makeStreamSet(hic.device, depth, device_lanes.tracer != nullptr, sm_margin)
                           : nullptr) {
      // On the device: chunk i's allgather, then its matmul, queued on stream i % depth.
      std::vector<ChunkMarks> marks(s);
      for (int64_t i = 0; i < s; ++i) {
        streams->enter(i);
        marks[i].start = streams->mark();
        post(i);
        marks[i].middle = streams->mark();
        compute(i);
        marks[i].end = streams->mark();
      }
      finishAsync(*streams, works, marks, created_us, device_lanes, comm_name, mm_name, true, params.timeout);
      values.tensors[y] = y_out;
      return;
    }
    // From the host: up to `depth` allgathers in flight while the host computes the oldest chunk.
    for (int64_t i = 0; i < depth; ++i) post(i);
    for (int64_t i = 0; i < s; ++i) {
      works[i]->wait(params.timeout);
      lanes.record(comm_name, "communication", i, posted[i], true);
      if (i + depth < s) post(i + depth);
      double begin = lanes.now();
      compute(i);
      lanes.record(mm_name, "compute", i, begin, false);
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
  auto compute = [&](int64_t i) {
    ValueMap chunk_values = values;
    chunk_values.tensors[lhs] = chunkRows(lhs_full, d, s, r, i).contiguous().view(shapes[lhs]);
    executor.run(seg, chunk_values, shapes);
    partials[i] = chunk_values.tensor(partial).contiguous();  // block j = the rows device j keeps
  };
  auto post = [&](int64_t i) {
    Tensor out_slice = y_out.slice(0, i * r, r);
    posted[i] = lanes.now();
    logChunkPost(c, i, s, partials[i], out_slice);
    works[i] = backend.reduceScatter(partials[i], out_slice, c.op);
  };
  const double created_us = lanes.now();
  if (auto streams = backend.ordersOnCurrentStream()
                         ? makeStreamSet(hic.device, depth, device_lanes.tracer != nullptr, sm_margin)
                         : nullptr) {
    // On the device: chunk i's matmul, then its reduce-scatter, queued on stream i % depth.
    std::vector<ChunkMarks> marks(s);
    for (int64_t i = 0; i < s; ++i) {
      streams->enter(i);
      marks[i].start = streams->mark();
      compute(i);
      marks[i].middle = streams->mark();
      post(i);
      marks[i].end = streams->mark();
      partials[i] = Tensor();  // freed in chunk i's stream order, after its reduce-scatter
    }
    finishAsync(*streams, works, marks, created_us, device_lanes, comm_name, mm_name, false, params.timeout);
    values.tensors[y] = y_out;
    return;
  }
  auto finish = [&](int64_t i) {
    works[i]->wait(params.timeout);
    lanes.record(comm_name, "communication", i, posted[i], true);
    partials[i] = Tensor();
  };
  // Chunk i's matmul runs while the `depth` chunks before it are in flight; the oldest is waited for
  // before chunk i is posted in its place (on its lane), so at most `depth` are ever in flight.
  for (int64_t i = 0; i < s; ++i) {
    double begin = lanes.now();
    compute(i);
    lanes.record(mm_name, "compute", i, begin, false);
    if (i >= depth) finish(i - depth);
    post(i);
  }
  for (int64_t i = std::max<int64_t>(0, s - depth); i < s; ++i) finish(i);
  values.tensors[y] = y_out;
}

}  // namespace meshfuse
