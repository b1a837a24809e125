#include "backends/gloo/gloo_backend.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/scatter.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstdlib>
#include <cstring>

#include "backends/backend_checks.h"
#include "backends/gloo/gloo_reduce.h"
#include "backends/gloo/gloo_rendezvous.h"
#include "backends/gloo/gloo_work.h"
#include "backends/self_mailbox.h"
#include "multidevice/communicator.h"
#include "multidevice/timeout_env.h"

namespace meshfuse {

using gloo_backend::GlooWork;
using gloo_backend::Staging;

namespace {

const bool registered = registerBackend(
    CommunicatorBackend::Gloo,
    [](Communicator& c, const std::vector<int64_t>& team) { return std::make_unique<GlooBackend>(c, team); });

// Gloo types its buffers only by element size (its templates take sizeof(T)); every meshfuse
// dtype travels as the unsigned integer of its size, and the reduce function knows the real type.
template <typename F>
void withElementType(size_t itemsize, F&& f) {
  switch (itemsize) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  throw std::invalid_argument("gloo backend: no element type of " + std::to_string(itemsize) + " bytes");
}

uint8_t* bytes(char* p) { return reinterpret_cast<uint8_t*>(p); }

bool sameBytes(const Tensor& a, const void* b) { return a.device().type == DeviceType::CPU && a.data() == b; }

const char* byteAt(const Tensor& t, size_t offset) { return static_cast<const char*>(t.data()) + offset; }

// dst = src, element for element, whatever their shapes (a team of one: collectives are copies).
// cppcheck-suppress constParameter ; dst is written (through a view of its storage)
void copyFlat(Tensor& dst, const Tensor& src) {
  if (sameBytes(dst, src.data()) && dst.device() == src.device()) return;
  dst.view({dst.numel()}).copyFrom(src.view({src.numel()}));
}

template <typename Options>
void configure(Options& opts, uint32_t tag, std::chrono::milliseconds timeout) {
  opts.setTag(tag);
  opts.setTimeout(timeout);
}

// Sends and receives use one slot outside every collective's (a prefix no collective uses):
// Gloo matches messages between a pair of ranks on one slot in posting order, like MPI tags.
const uint64_t kPointToPointSlot = ::gloo::Slot::build(0x7f, 0);

// What a send or receive in flight holds; members are released in reverse order, the buffer
// (which refers to the context) first.
struct PointToPoint {
  std::shared_ptr<::gloo::Context> context;
  Tensor host;                // the bytes Gloo reads or writes
  Tensor device_destination;  // a CUDA tensor a receive is copied back into, else undefined
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
};

}  // namespace

std::chrono::milliseconds GlooBackend::defaultOperationTimeout() {
  return timeoutFromEnvironmentOr(std::chrono::seconds(300));
}

GlooBackend::GlooBackend(Communicator& communicator, const std::vector<int64_t>& team,
                         std::chrono::milliseconds operation_timeout)
    : Backend(CommunicatorBackend::Gloo, team, communicator.rank()),
      timeout_(operation_timeout),
      self_(std::make_unique<SelfMailbox>()),
      scratch_(std::make_shared<gloo_backend::ScratchBuffer>()) {
  if (timeout_.count() <= 0) throw std::invalid_argument("GlooBackend: the operation timeout must be positive");
  if (!alone()) context_ = gloo_backend::connectTeam(communicator, team, static_cast<int>(rankInTeam()), timeout_);
  queue_ = std::make_unique<gloo_backend::OpQueue>();
}

GlooBackend::~GlooBackend() = default;

bool GlooBackend::supports(Device device) const {
  return device.type == DeviceType::CPU || cudaCopyBytes != nullptr;  // CUDA: staged through host
}

std::string GlooBackend::describe(const std::string& op, const Tensor* tensor) const {
  return "gloo " + op + (tensor ? " (" + tensor->toString() + ")" : "") + " on team " + teamToString(team()) +
         " at team rank " + std::to_string(rankInTeam()) + " (world rank " +
         std::to_string(team()[static_cast<size_t>(rankInTeam())]) + ")";
}

std::unique_ptr<Work> GlooBackend::post(const std::string& what, std::shared_ptr<Staging> staging,
                                        std::function<void(uint32_t)> run) {
  const uint32_t tag = next_tag_++;
  auto done = queue_->post([staging = std::move(staging), run = std::move(run), tag] {
    run(tag);
    staging->finish();
  });
  return std::make_unique<GlooWork>(what, std::move(done));
}

std::unique_ptr<Work> GlooBackend::allgather(const Tensor& input, Tensor& output) {
  const std::string op = "gloo allgather";
  checks::tensor(*this, op, "input", input);
  checks::blocks(*this, op, "output", output, "input", input);
  if (input.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  const size_t block = input.nbytes(), total = output.nbytes();
  // The input may already be this rank's block of the output: then Gloo gets no input.
  const bool in_place = sameBytes(input, byteAt(output, static_cast<size_t>(rankInTeam()) * block));
  auto staging = std::make_shared<Staging>();
  char* in = in_place ? nullptr : staging->source(input);
  char* out = staging->destination(output, in_place);
  return post(describe("allgather", &input), staging, [=, ctx = context_, timeout = timeout_](uint32_t tag) {
    ::gloo::AllgatherOptions opts(ctx);
    if (in) opts.setInput<uint8_t>(bytes(in), block);
    opts.setOutput<uint8_t>(bytes(out), total);
    configure(opts, tag, timeout);
    ::gloo::allgather(opts);
  });
}

std::unique_ptr<Work> GlooBackend::allreduce(Tensor& tensor, ReduceOp op) {
  const std::string name = "gloo allreduce(" + toString(op) + ")";
  checks::tensor(*this, name, "tensor", tensor);
  const auto fn = gloo_backend::reduceFunctionFor(tensor.dtype(), op);
  if (tensor.numel() == 0 || alone()) return completedWork();
  auto staging = std::make_shared<Staging>();
  char* buffer = staging->destination(tensor, /*copy_in=*/true);
  const size_t numel = static_cast<size_t>(tensor.numel()), item = tensor.itemsize();
  return post(describe("allreduce(" + toString(op) + ")", &tensor), staging,
              [=, ctx = context_, timeout = timeout_](uint32_t tag) {
                ::gloo::AllreduceOptions opts(ctx);
                withElementType(item, [&](auto zero) {
                  using T = decltype(zero);
                  opts.setOutput<T>(reinterpret_cast<T*>(buffer), numel);  // in place
                });
                opts.setReduceFunction(fn);
                configure(opts, tag, timeout);
                ::gloo::allreduce(opts);
              });
}

// This Gloo snapshot has no reduce-scatter on unbound buffers (only the legacy
// ReduceScatterHalvingDoubling, on bound buffers of Gloo's own types), so this is an allreduce of
// the input into scratch followed by a copy of this rank's block: correct for every dtype and op,
// at twice the bytes on the wire of a ring reduce-scatter.
std::unique_ptr<Work> GlooBackend::reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) {
  const std::string name = "gloo reduceScatter(" + toString(op) + ")";
  checks::tensor(*this, name, "output", output);
  checks::blocks(*this, name, "input", input, "output", output);
  const auto fn = gloo_backend::reduceFunctionFor(input.dtype(), op);
  if (output.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  auto staging = std::make_shared<Staging>();
  char* in = staging->source(input);
  char* out = staging->destination(output, false);
  const size_t numel = static_cast<size_t>(input.numel()), item = input.itemsize(), block = output.nbytes();
  const size_t mine = static_cast<size_t>(rankInTeam()) * block;
  return post(describe("reduceScatter(" + toString(op) + ")", &input), staging,
              [=, ctx = context_, timeout = timeout_, scratch = scratch_](uint32_t tag) {
                char* reduced = scratch->get(numel * item);
                ::gloo::AllreduceOptions opts(ctx);
                withElementType(item, [&](auto zero) {
                  using T = decltype(zero);
                  opts.setInput<T>(reinterpret_cast<T*>(in), numel);
                  opts.setOutput<T>(reinterpret_cast<T*>(reduced), numel);
                });
                opts.setReduceFunction(fn);
                configure(opts, tag, timeout);
                ::gloo::allreduce(opts);
                std::memcpy(out, reduced + mine, block);
              });
}

std::unique_ptr<Work> GlooBackend::reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) {
  const std::string name = "gloo reduce(" + toString(op) + ")";
  checks::teamRank(*this, name, "root", root);
  checks::tensor(*this, name, "input", input);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    checks::tensor(*this, name, "output (on the root)", output);
    checks::sameDtype(*this, name, "input", input, "output", output);
    checks::numel(name, "output", output.numel(), input.numel(), "the same as input");
  }
  const auto fn = gloo_backend::reduceFunctionFor(input.dtype(), op);
  if (input.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  auto staging = std::make_shared<Staging>();
  const bool in_place = is_root && sameBytes(input, output.data());
  char* in = in_place ? nullptr : staging->source(input);
  // Gloo's ring reduce uses the output as scratch on every rank, not only on the root.
  char* out = is_root ? staging->destination(output, in_place) : nullptr;  // nullptr: the worker's scratch
  const size_t numel = static_cast<size_t>(input.numel()), item = input.itemsize();
  return post(describe("reduce(" + toString(op) + ") to root " + std::to_string(root), &input), staging,
              [=, ctx = context_, timeout = timeout_, scratch = scratch_](uint32_t tag) {
                char* target = out ? out : scratch->get(numel * item);
                ::gloo::ReduceOptions opts(ctx);
                withElementType(item, [&](auto zero) {
                  using T = decltype(zero);
                  if (in) opts.setInput<T>(reinterpret_cast<T*>(in), numel);
                  opts.setOutput<T>(reinterpret_cast<T*>(target), numel);
                });
                opts.setRoot(static_cast<int>(root));
                opts.setReduceFunction(fn);
                configure(opts, tag, timeout);
                ::gloo::reduce(opts);
              });
}

std::unique_ptr<Work> GlooBackend::broadcast(Tensor& tensor, int64_t root) {
  const std::string name = "gloo broadcast";
  checks::teamRank(*this, name, "root", root);
  checks::tensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0 || alone()) return completedWork();
  auto staging = std::make_shared<Staging>();
  // The root only sends from its tensor (Gloo leaves an output without input alone on the root).
  char* buffer = rankInTeam() == root ? staging->source(tensor) : staging->destination(tensor, false);
  const size_t total = tensor.nbytes();
  return post(describe("broadcast from root " + std::to_string(root), &tensor), staging,
              [=, ctx = context_, timeout = timeout_](uint32_t tag) {
                ::gloo::BroadcastOptions opts(ctx);
                opts.setOutput<uint8_t>(bytes(buffer), total);
                opts.setRoot(static_cast<int>(root));
                configure(opts, tag, timeout);
                ::gloo::broadcast(opts);
              });
}

std::unique_ptr<Work> GlooBackend::gather(const Tensor& input, Tensor& output, int64_t root) {
  const std::string name = "gloo gather";
  checks::teamRank(*this, name, "root", root);
  checks::tensor(*this, name, "input", input);
  const bool is_root = rankInTeam() == root;
  if (is_root) checks::blocks(*this, name, "output (on the root)", output, "input", input);
  if (input.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  const size_t block = input.nbytes();
  auto staging = std::make_shared<Staging>();
  // Gloo copies the root's input into its block of the output; when they are the same bytes,
  // give it a copy (memcpy onto itself is undefined).
  const bool aliased = is_root && sameBytes(input, byteAt(output, static_cast<size_t>(root) * block));
  char* in = staging->source(aliased ? input.clone() : input);
  char* out = is_root ? staging->destination(output, false) : nullptr;
  const size_t total = static_cast<size_t>(teamSize()) * block;
  return post(describe("gather to root " + std::to_string(root), &input), staging,
              [=, ctx = context_, timeout = timeout_](uint32_t tag) {
                ::gloo::GatherOptions opts(ctx);
                opts.setInput<uint8_t>(bytes(in), block);
                if (out) opts.setOutput<uint8_t>(bytes(out), total);
                opts.setRoot(static_cast<int>(root));
                configure(opts, tag, timeout);
                ::gloo::gather(opts);
              });
}

std::unique_ptr<Work> GlooBackend::scatter(const Tensor& input, Tensor& output, int64_t root) {
  const std::string name = "gloo scatter";
  checks::teamRank(*this, name, "root", root);
  checks::tensor(*this, name, "output", output);
  const bool is_root = rankInTeam() == root;
  if (is_root) checks::blocks(*this, name, "input (on the root)", input, "output", output);
  if (output.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  const size_t block = output.nbytes();
  auto staging = std::make_shared<Staging>();
  char* in = is_root ? staging->source(input) : nullptr;
  char* out = staging->destination(output, false);
  const size_t n = static_cast<size_t>(teamSize());
  return post(describe("scatter from root " + std::to_string(root), &output), staging,
              [=, ctx = context_, timeout = timeout_](uint32_t tag) {
                ::gloo::ScatterOptions opts(ctx);
                if (in) {
                  std::vector<uint8_t*> blocks(n);
                  for (size_t i = 0; i < n; ++i) blocks[i] = bytes(in + i * block);
                  opts.setInputs<uint8_t>(blocks, block);
                }
                opts.setOutput<uint8_t>(bytes(out), block);
                opts.setRoot(static_cast<int>(root));
                configure(opts, tag, timeout);
                ::gloo::scatter(opts);
              });
}

std::unique_ptr<Work> GlooBackend::allToAll(const Tensor& input, Tensor& output) {
  checks::allToAll(*this, "gloo allToAll", input, output);
  if (input.numel() == 0) return completedWork();
  if (alone()) {
    copyFlat(output, input);
    return completedWork();
  }
  auto staging = std::make_shared<Staging>();
  char* in = staging->source(input);
  char* out = staging->destination(output, false);
  const size_t total = input.nbytes();
  return post(describe("allToAll", &input), staging, [=, ctx = context_, timeout = timeout_](uint32_t tag) {
    ::gloo::AlltoallOptions opts(ctx);
    opts.setInput<uint8_t>(bytes(in), total);
    opts.setOutput<uint8_t>(bytes(out), total);
    configure(opts, tag, timeout);
    ::gloo::alltoall(opts);
  });
}

std::unique_ptr<Work> GlooBackend::send(const Tensor& tensor, int64_t dst) {
  const std::string name = "gloo send";
  checks::teamRank(*this, name, "peer", dst);
  checks::tensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const std::string what = describe("send to team rank " + std::to_string(dst), &tensor);
  if (dst == rankInTeam()) {
    self_->send(tensor, what);
    return completedWork();
  }
  auto p2p = std::make_shared<PointToPoint>();
  p2p->context = context_;
  p2p->host = tensor.to(Device::cpu());  // itself for a CPU tensor
  p2p->buffer = context_->createUnboundBuffer(p2p->host.data(), p2p->host.nbytes());
  p2p->buffer->send(static_cast<int>(dst), kPointToPointSlot);
  return std::make_unique<GlooWork>(
      what, gloo_backend::runDetached([p2p, timeout = timeout_] { p2p->buffer->waitSend(timeout); }));
}

std::unique_ptr<Work> GlooBackend::recv(Tensor& tensor, int64_t src) {
  const std::string name = "gloo recv";
  checks::teamRank(*this, name, "peer", src);
  checks::tensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const std::string what = describe("recv from team rank " + std::to_string(src), &tensor);
  if (src == rankInTeam()) return std::make_unique<GlooWork>(what, self_->recv(tensor, what));
  auto p2p = std::make_shared<PointToPoint>();
  p2p->context = context_;
  const bool on_host = tensor.device().type == DeviceType::CPU;
  p2p->host = on_host ? tensor : Tensor::empty(tensor.shape(), tensor.dtype());
  if (!on_host) p2p->device_destination = tensor;
  p2p->buffer = context_->createUnboundBuffer(p2p->host.data(), p2p->host.nbytes());
  p2p->buffer->recv(static_cast<int>(src), kPointToPointSlot);
  return std::make_unique<GlooWork>(what, gloo_backend::runDetached([p2p, timeout = timeout_] {
                                      p2p->buffer->waitRecv(timeout);
                                      const Tensor& d = p2p->device_destination;
                                      if (d.defined())
                                        cudaCopyBytes(d.data(), d.device(), p2p->host.data(), Device::cpu(),
                                                      p2p->host.nbytes());
                                    }));
}

std::unique_ptr<Work> GlooBackend::barrier() {
  if (alone()) return completedWork();
  return post(describe("barrier", nullptr), std::make_shared<Staging>(),
              [ctx = context_, timeout = timeout_](uint32_t tag) {
                ::gloo::BarrierOptions opts(ctx);
                configure(opts, tag, timeout);
                ::gloo::barrier(opts);
              });
}

}  // namespace meshfuse
