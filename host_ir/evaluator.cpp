#include "host_ir/evaluator.h"

#include <functional>
#include <memory>
#include <optional>

#include "host_ir/comm_debug.h"
#include "host_ir/comm_layout.h"
#include "host_ir/stream_loop.h"
#include "multidevice/communicator.h"
#include "multidevice/debug_log.h"
#include "runtime/host_span.h"

namespace meshfuse {

namespace {

// A posted communication: its Work and what to do with the received data once it is complete.
struct InFlight {
  std::unique_ptr<Work> work;
  std::function<void()> finish;
  double posted_us = 0;
};

class CommunicationRunner {
 public:
  CommunicationRunner(const HostIrContainer& hic, ValueMap& values) : hic_(hic), values_(values) {}

  InFlight post(const Communication& c) {
    Backend& backend = Communicator::instance().backend(c.backend, c.team);
    const int64_t n = backend.teamSize();
    const auto& out_shape = hic_.local_shapes.at(c.out);
    const Device device = hic_.device;
    auto input = [&]() { return values_.tensor(c.in).contiguous(); };
    auto store = [this, &c](Tensor t) { values_.tensors[c.out] = std::move(t); };
    InFlight f;
    switch (c.type) {
      case Communication::Type::Allgather: {
        Tensor in = input();
        auto buffer = std::make_shared<Tensor>(Tensor::empty(prepend(n, in.shape()), in.dtype(), device));
        f.work = backend.allgather(in, *buffer);
        int axis = c.gathered_axis;
        f.finish = [=, this]() { values_.tensors[c.out] = unblockAlong(*buffer, axis, n, out_shape); };
        break;
      }
      case Communication::Type::Allreduce: {
        Tensor t = inPlaceCopy(c);
        f.work = backend.allreduce(t, c.op);
        f.finish = [=]() { store(t); };
        break;
      }
      case Communication::Type::ReduceScatter: {
        Tensor blocks = blocksAlong(values_.tensor(c.in), c.scattered_axis, n);
        Tensor out = Tensor::empty(out_shape, blocks.dtype(), device);
        f.work = backend.reduceScatter(blocks, out, c.op);
        f.finish = [=]() { store(out); };
        break;
      }
      case Communication::Type::Reduce: {
        Tensor in = input();
        bool root = backend.rankInTeam() == c.root;
        Tensor out = root ? Tensor::empty(out_shape, in.dtype(), device) : Tensor();
        f.work = backend.reduce(in, out, c.root, c.op);
        f.finish = [=]() {
          if (root) store(out);
        };
        break;
      }
      case Communication::Type::Gather: {
        Tensor in = input();
        bool root = backend.rankInTeam() == c.root;
        auto buffer =
            std::make_shared<Tensor>(root ? Tensor::empty(prepend(n, in.shape()), in.dtype(), device) : Tensor());
        f.work = backend.gather(in, *buffer, c.root);
        int axis = c.gathered_axis;
        f.finish = [=, this]() {
          if (root) values_.tensors[c.out] = unblockAlong(*buffer, axis, n, out_shape);
        };
        break;
      }
      case Communication::Type::Broadcast: {
        bool root = backend.rankInTeam() == c.root;
        Tensor t = root ? input() : Tensor::empty(out_shape, c.out->dtype(), device);
        f.work = backend.broadcast(t, c.root);
        bool keep = c.out->deviceMesh()->has(hic_.rank);
        f.finish = [=]() {
          if (keep) store(t);
        };
        break;
      }
      case Communication::Type::Scatter: {
        bool root = backend.rankInTeam() == c.root;
        Tensor blocks = root ? blocksAlong(values_.tensor(c.in), c.scattered_axis, n) : Tensor();
        Tensor out = Tensor::empty(out_shape, c.out->dtype(), device);
        f.work = backend.scatter(blocks, out, c.root);
        f.finish = [=]() { store(out); };
        break;
      }
      case Communication::Type::AllToAll: {
        Tensor blocks = blocksAlong(values_.tensor(c.in), c.scattered_axis, n);
        auto received = std::make_shared<Tensor>(Tensor::empty(blocks.shape(), blocks.dtype(), device));
        f.work = backend.allToAll(blocks, *received);
        // Block i holds team rank i's chunk of the gathered axis, already split along the scattered one.
        int axis = c.gathered_axis;
        f.finish = [=, this]() { values_.tensors[c.out] = unblockAlong(*received, axis, n, out_shape); };
        break;
      }
      case Communication::Type::SendRecv: {
        auto index_of = [&](int64_t world) { return world == c.team[0] ? 0 : 1; };
        if (c.send_to >= 0) {
          Tensor in = input();
          f.work = backend.send(in, index_of(c.send_to));
          f.finish = [in]() {};  // keeps the send buffer alive until the send completes
        } else {
          Tensor out = Tensor::empty(out_shape, c.out->dtype(), device);
          f.work = backend.recv(out, index_of(c.recv_from));
          f.finish = [=]() { store(out); };
        }
        break;
      }
    }
    return f;
  }

 private:
  static std::vector<int64_t> prepend(int64_t n, std::vector<int64_t> shape) {
    shape.insert(shape.begin(), n);
    return shape;
  }

  // Allreduce works in place: reuse the producer's buffer when nothing else reads it.
  Tensor inPlaceCopy(const Communication& c) {
    const Tensor& in = values_.tensor(c.in);
    bool sole_use = c.in->uses().size() == 1 && !c.in->fusion()->isInput(c.in) && !c.in->fusion()->isOutput(c.in);
    if (sole_use && in.isContiguous()) return in;
    return in.clone();
  }

  const HostIrContainer& hic_;
  ValueMap& values_;
};

}  // namespace

namespace {
// Tracing the host: the executors' own spans inside each segment's (runtime/host_span.h) join the
// trace, category "host detail".
class TracerSpans final : public host_span::Recorder {
 public:
  explicit TracerSpans(Tracer& tracer) : tracer_(tracer) {}
  double nowUs() const override { return tracer_.nowUs(); }
  void record(const char* name, double begin_us, double end_us) override {
    tracer_.add(name, "host detail", 0, begin_us, end_us);
  }

 private:
  Tracer& tracer_;
};
}  // namespace

void HostIrEvaluator::run(ValueMap& values) {
  std::optional<TracerSpans> spans;
  if (tracer_ && params_.trace_host) spans.emplace(*tracer_);
  host_span::RecorderGuard span_recorder(spans ? &*spans : nullptr);
  CommunicationRunner runner(hic_, values);
  std::vector<InFlight> in_flight(hic_.communications.size());
  auto now = [this]() { return tracer_ ? tracer_->nowUs() : 0.0; };
  for (const Instruction& ins : hic_.program) {
    switch (ins.kind) {
      case Instruction::Kind::LaunchSegment: {
        double begin = now();
        const Segment& seg = hic_.segments[ins.index];
        executor_.run(seg, values, hic_.local_shapes);
        // Device time, not enqueue time, in the trace; or, tracing the host, the enqueue time alone.
        if (tracer_ && !params_.trace_host) executor_.synchronize();
        if (tracer_)
          tracer_->add(toString(seg.kind) + " " + seg.outputs.front()->name(), params_.trace_host ? "host" : "compute",
                       0, begin, now());
        break;
      }
      case Instruction::Kind::StreamForLoop: {
        const double begin = now();
        runStreamLoop(hic_, hic_.loops[ins.index], values, executor_, params_, tracer_);
        // Tracing the host: a span around the loop's host-timed chunk events.
        if (tracer_ && params_.trace_host)
          tracer_->add("stream loop " + std::to_string(ins.index), "host", 0, begin, now());
        break;
      }
      case Instruction::Kind::PostCommunication:
        if (debug::enabled(debug::Level::Info))
          debug::info(describePostedCommunication(hic_, hic_.communications[ins.index]));
        in_flight[ins.index] = runner.post(hic_.communications[ins.index]);
        in_flight[ins.index].posted_us = now();
        break;
      case Instruction::Kind::Wait: {
        InFlight& f = in_flight[ins.index];
        try {
          f.work->wait(params_.timeout);
        } catch (const CommunicationTimeout& e) {
          throw CommunicationTimeout(std::string(e.what()) + " [in " + hic_.communications[ins.index].toString() + "]");
        }
        f.finish();
        if (tracer_) {
          const Communication& c = hic_.communications[ins.index];
          tracer_->add(toString(c.type) + " " + c.out->name(), "communication", 1, f.posted_us, now());
        }
        f = InFlight{};
        break;
      }
      case Instruction::Kind::LocalSlice: {
        const Tensor& in = values.tensor(ins.in);
        int64_t chunk = in.size(ins.axis) / ins.parts;
        values.tensors[ins.out] = in.slice(ins.axis, ins.block * chunk, chunk);
        break;
      }
      case Instruction::Kind::LocalCopy: values.tensors[ins.out] = values.tensor(ins.in); break;
    }
  }
}

}  // namespace meshfuse
