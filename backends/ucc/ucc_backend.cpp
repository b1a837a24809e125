#include "backends/ucc/ucc_backend.h"

#include <ucc/api/ucc.h>

#include <cstring>

#include "backends/backend_checks.h"
#include "backends/self_mailbox.h"
#include "backends/ucc/ucc_context.h"
#include "backends/ucc/ucc_memory.h"
#include "backends/ucc/ucc_oob.h"
#include "backends/ucc/ucc_team.h"
#include "backends/ucc/ucc_types.h"
#include "backends/ucc/ucc_work.h"
#include "multidevice/communicator.h"

namespace meshfuse {

using ucc::UccWork;

namespace {

// The world setup creates the process's UCC context over the world (ucc_context.h).
const bool registered = registerBackend(
    CommunicatorBackend::Ucc,
    [](Communicator& c, const std::vector<int64_t>& team) { return std::make_unique<UccBackend>(c, team); },
    [](Communicator& c, std::chrono::milliseconds timeout) { ucc::Context::createForWorld(c, timeout); });

// A tensor an operation takes: defined, contiguous, in memory this UCC build carries.
void checkTensor(const Backend& backend, const std::string& op, const char* name, const Tensor& t) {
  ucc::checkCarries(op, name, t);
  checks::tensor(backend, op, name, t);
}

// A rooted block collective (gather, scatter): `block` on every rank, `whole` (teamSize() blocks)
// only on the root. Returns whether I am the root.
bool checkRooted(const Backend& backend, const std::string& op, int64_t root, const char* block_name,
                 const Tensor& block, const char* whole_name, const Tensor& whole) {
  checks::teamRank(backend, op, "root", root);
  checkTensor(backend, op, block_name, block);
  if (backend.rankInTeam() != root) return false;
  ucc::checkCarries(op, whole_name, whole);
  checks::blocks(backend, op, whole_name, whole, block_name, block);
  return true;
}

bool sameBytes(const Tensor& a, const void* b) { return a.data() == b; }
const char* byteAt(const Tensor& t, size_t offset) { return static_cast<const char*>(t.data()) + offset; }

ucc_coll_args_t argsOf(ucc_coll_type_t type) {
  ucc_coll_args_t args;
  std::memset(&args, 0, sizeof args);
  args.coll_type = type;
  return args;
}

void inPlace(ucc_coll_args_t& args) {
  args.mask |= UCC_COLL_ARGS_FIELD_FLAGS;
  args.flags |= UCC_COLL_ARGS_FLAG_IN_PLACE;
}

// The buffers of one operation in UCC's terms. Tensors are used in place; a widened reduction
// (ucc_types.h: Half on the host) reads Float copies and writes Float results that are rounded
// back into the tensors when the Work finishes.
// How a collective's buffers reach UCC: as they are, as a Float copy (a Half reduction on the host),
// or as ordered integer keys (a floating-point max / min on the host: ucc_types.h says why).
enum class Staging { kDirect, kWidened, kOrderedKeys };

Staging reductionStaging(DataType dtype, ReduceOp op, ucc_memory_type_t memory) {
  if (ucc::reducesOnOrderedKeys(dtype, op, memory)) return Staging::kOrderedKeys;  // before widening: NaN wins
  if (ucc::reducesWidened(dtype, memory)) return Staging::kWidened;
  return Staging::kDirect;
}

ucc_datatype_t stagedType(Staging staging, DataType dtype) {
  if (staging == Staging::kWidened) return UCC_DT_FLOAT32;
  if (staging == Staging::kOrderedKeys) return ucc::datatypeFor(ucc::orderedKeyDtype(dtype));
  return ucc::datatypeFor(dtype);
}

class Buffers {
 public:
  Buffers(UccWork& work, const Tensor& any, Staging staging = Staging::kDirect, ReduceOp op = ReduceOp::Sum)
      : work_(work),
        staging_(staging),
        op_(op),
        type_(stagedType(staging, any.dtype())),
        memory_(ucc::memoryTypeOf(any)) {
    ucc::readyForUcc(any);
  }
  // `info` describes `count` elements the operation reads from `t`.
  void read(ucc_coll_buffer_info_t& info, const Tensor& t, uint64_t count) {
    const Tensor bytes = staging_ == Staging::kWidened       ? t.to(DataType::Float)
                         : staging_ == Staging::kOrderedKeys ? ucc::orderedKeys(t, op_)
                                                             : t;
    work_.buffers.push_back(bytes.storage());
    describe(info, bytes.data(), count);
  }
  // `info` describes `count` elements the operation writes into `t` (and reads, when `copy_in`).
  void write(ucc_coll_buffer_info_t& info, const Tensor& t, uint64_t count, bool copy_in) {
    if (staging_ == Staging::kDirect) {
      work_.buffers.push_back(t.storage());
      describe(info, t.data(), count);
      return;
    }
    if (staging_ == Staging::kOrderedKeys) {
      Tensor keys = copy_in ? ucc::orderedKeys(t, op_) : Tensor::empty(t.shape(), ucc::orderedKeyDtype(t.dtype()));
      work_.keys_back.emplace_back(keys, t);
      describe(info, keys.data(), count);
      return;
    }
    Tensor wide = copy_in ? t.to(DataType::Float) : Tensor::empty(t.shape(), DataType::Float);
    work_.copies_back.emplace_back(wide, t);
    describe(info, wide.data(), count);
  }
  bool staged() const { return staging_ != Staging::kDirect; }

 private:
  void describe(ucc_coll_buffer_info_t& info, void* data, uint64_t count) const {
    info.buffer = data;
    info.count = count;
    info.datatype = type_;
    info.mem_type = memory_;
  }
  UccWork& work_;
  Staging staging_;
  ReduceOp op_;
  ucc_datatype_t type_;
  ucc_memory_type_t memory_;
};

uint64_t count(const Tensor& t) { return static_cast<uint64_t>(t.numel()); }

}  // namespace

UccBackend::UccBackend(Communicator& communicator, const std::vector<int64_t>& team, std::chrono::milliseconds timeout)
    : Backend(CommunicatorBackend::Ucc, team, communicator.rank()),
      team_(std::make_unique<ucc::Team>(communicator, team, rankInTeam(), timeout)),
      self_(std::make_unique<SelfMailbox>()),
      sent_(team.size(), 0),
      received_(team.size(), 0) {}

UccBackend::UccBackend(Communicator& communicator, const std::vector<int64_t>& team)
    : UccBackend(communicator, team, ucc::timeoutFromEnvironment()) {}

UccBackend::~UccBackend() = default;

bool UccBackend::supports(Device device) const { return ucc::carries(device); }

std::unique_ptr<Work> UccBackend::allgather(const Tensor& input, Tensor& output) {
  const std::string op = "ucc allgather";
  checkTensor(*this, op, "input", input);
  checkTensor(*this, op, "output", output);
  checks::blocks(*this, op, "output", output, "input", input);
  if (input.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(OpLabel{"allgather", this, input.dtype(), input.numel()});
  Buffers buffers(*work, input);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_ALLGATHER);
  // The input may already be this rank's block of the output.
  const bool in_place = sameBytes(input, byteAt(output, static_cast<size_t>(rankInTeam()) * input.nbytes()));
  if (in_place)
    inPlace(args);
  else
    buffers.read(args.src.info, input, count(input));
  buffers.write(args.dst.info, output, count(output), in_place);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::allreduce(Tensor& tensor, ReduceOp op) {
  const std::string name = "ucc allreduce(" + toString(op) + ")";
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(OpLabel{"allreduce", this, tensor.dtype(), tensor.numel(), op});
  Buffers buffers(*work, tensor, reductionStaging(tensor.dtype(), op, ucc::memoryTypeOf(tensor)), op);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_ALLREDUCE);
  args.op = ucc::opFor(op, tensor.dtype());
  inPlace(args);
  buffers.write(args.dst.info, tensor, count(tensor), /*copy_in=*/true);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) {
  const std::string name = "ucc reduceScatter(" + toString(op) + ")";
  checkTensor(*this, name, "output", output);
  checkTensor(*this, name, "input", input);
  checks::blocks(*this, name, "input", input, "output", output);
  if (output.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(OpLabel{"reduceScatter", this, input.dtype(), input.numel(), op});
  Buffers buffers(*work, input, reductionStaging(input.dtype(), op, ucc::memoryTypeOf(input)), op);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_REDUCE_SCATTER);
  args.op = ucc::opFor(op, input.dtype());
  buffers.read(args.src.info, input, count(input));  // the whole input; dst: one block
  buffers.write(args.dst.info, output, count(output), false);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) {
  const std::string name = "ucc reduce(" + toString(op) + ")";
  checks::teamRank(*this, name, "root", root);
  checkTensor(*this, name, "input", input);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    checkTensor(*this, name, "output (on the root)", output);
    checks::sameDtype(*this, name, "input", input, "output", output);
    checks::numel(name, "output", output.numel(), input.numel(), "the same as input");
  }
  if (input.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(OpLabel{"reduce", this, input.dtype(), input.numel(), op, "to root", root});
  Buffers buffers(*work, input, reductionStaging(input.dtype(), op, ucc::memoryTypeOf(input)), op);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_REDUCE);
  args.op = ucc::opFor(op, input.dtype());
  args.root = static_cast<uint64_t>(root);
  const bool in_place = is_root && !buffers.staged() && sameBytes(input, output.data());
  if (in_place)
    inPlace(args);
  else
    buffers.read(args.src.info, input, count(input));
  if (is_root) buffers.write(args.dst.info, output, count(output), in_place);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::broadcast(Tensor& tensor, int64_t root) {
  const std::string name = "ucc broadcast";
  checks::teamRank(*this, name, "root", root);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(
      OpLabel{"broadcast", this, tensor.dtype(), tensor.numel(), std::nullopt, "from root", root});
  Buffers buffers(*work, tensor);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_BCAST);
  args.root = static_cast<uint64_t>(root);
  buffers.write(args.src.info, tensor, count(tensor), true);  // UCC's broadcast buffer is src on every rank
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::gather(const Tensor& input, Tensor& output, int64_t root) {
  const bool is_root = checkRooted(*this, "ucc gather", root, "input", input, "output (on the root)", output);
  if (input.numel() == 0) return completedWork();
  auto work =
      std::make_unique<UccWork>(OpLabel{"gather", this, input.dtype(), input.numel(), std::nullopt, "to root", root});
  Buffers buffers(*work, input);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_GATHER);
  args.root = static_cast<uint64_t>(root);
  const bool in_place = is_root && sameBytes(input, byteAt(output, static_cast<size_t>(root) * input.nbytes()));
  if (in_place)
    inPlace(args);
  else
    buffers.read(args.src.info, input, count(input));
  if (is_root) buffers.write(args.dst.info, output, count(output), in_place);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::scatter(const Tensor& input, Tensor& output, int64_t root) {
  const bool is_root = checkRooted(*this, "ucc scatter", root, "output", output, "input (on the root)", input);
  if (output.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(
      OpLabel{"scatter", this, output.dtype(), output.numel(), std::nullopt, "from root", root});
  Buffers buffers(*work, output);
  // UCC's CPU transport (tl/ucp) has scatterv but no scatter: equal blocks, 64-bit counts.
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_SCATTERV);
  args.root = static_cast<uint64_t>(root);
  args.mask |= UCC_COLL_ARGS_FIELD_FLAGS;
  args.flags |= UCC_COLL_ARGS_FLAG_COUNT_64BIT | UCC_COLL_ARGS_FLAG_DISPLACEMENTS_64BIT;
  if (is_root) {
    const size_t n = static_cast<size_t>(teamSize());
    work->counts.assign(2 * n, count(output));
    for (size_t i = 0; i < n; ++i) work->counts[n + i] = i * count(output);
    ucc_coll_buffer_info_t whole;
    buffers.read(whole, input, count(input));
    args.src.info_v.buffer = whole.buffer;
    args.src.info_v.counts = work->counts.data();
    args.src.info_v.displacements = work->counts.data() + n;
    args.src.info_v.datatype = whole.datatype;
    args.src.info_v.mem_type = whole.mem_type;
  }
  buffers.write(args.dst.info, output, count(output), false);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::allToAll(const Tensor& input, Tensor& output) {
  const std::string name = "ucc allToAll";
  ucc::checkCarries(name, "input", input);
  ucc::checkCarries(name, "output", output);
  checks::allToAll(*this, name, input, output);
  if (input.numel() == 0) return completedWork();
  auto work = std::make_unique<UccWork>(OpLabel{"allToAll", this, input.dtype(), input.numel()});
  Buffers buffers(*work, input);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_ALLTOALL);
  buffers.read(args.src.info, input, count(input));  // counts are whole buffers, teamSize() blocks
  buffers.write(args.dst.info, output, count(output), false);
  work->post(team_->handle(), args);
  return work;
}

// UCC's tag of a message is 15 bits: the low bit tells the direction (from the lower team rank or
// not), so a message each way between two ranks never shares one; the rest counts messages.
std::unique_ptr<Work> UccBackend::pointToPoint(const char* op, const Tensor& tensor, int64_t peer, int64_t root) {
  const bool sending = root == rankInTeam();
  uint32_t& sequence = (sending ? sent_ : received_)[static_cast<size_t>(peer)];
  const uint32_t upward = root < (sending ? peer : rankInTeam()) ? 0u : 1u;
  const auto tag = static_cast<ucc_coll_id_t>(((sequence++ % 16384u) << 1) | upward);
  auto work = std::make_unique<UccWork>(OpLabel{op, this, tensor.dtype(), tensor.numel(), std::nullopt,
                                                sending ? "to team rank" : "from team rank", peer});
  Buffers buffers(*work, tensor);
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_BCAST);
  args.mask |= UCC_COLL_ARGS_FIELD_ACTIVE_SET | UCC_COLL_ARGS_FIELD_TAG;
  args.root = static_cast<uint64_t>(root);
  args.tag = tag;
  args.active_set.start = static_cast<uint64_t>(rankInTeam());
  args.active_set.stride = peer - rankInTeam();
  args.active_set.size = 2;
  buffers.write(args.src.info, tensor, count(tensor), sending);
  work->post(team_->handle(), args);
  return work;
}

std::unique_ptr<Work> UccBackend::send(const Tensor& tensor, int64_t dst) {
  const std::string name = "ucc send";
  checks::teamRank(*this, name, "peer", dst);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  if (dst == rankInTeam()) {
    self_->send(tensor,
                OpLabel{"send", this, tensor.dtype(), tensor.numel(), std::nullopt, "to team rank", dst}.toString());
    return completedWork();
  }
  return pointToPoint("send", tensor, dst, rankInTeam());
}

std::unique_ptr<Work> UccBackend::recv(Tensor& tensor, int64_t src) {
  const std::string name = "ucc recv";
  checks::teamRank(*this, name, "peer", src);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  if (src == rankInTeam()) {
    const OpLabel label{"recv", this, tensor.dtype(), tensor.numel(), std::nullopt, "from team rank", src};
    auto work = std::make_unique<UccWork>(label);
    work->from_self = self_->recv(tensor, label.toString());
    return work;
  }
  return pointToPoint("recv", tensor, src, src);
}

std::unique_ptr<Work> UccBackend::barrier() {
  auto work = std::make_unique<UccWork>(OpLabel{"barrier", this});
  ucc_coll_args_t args = argsOf(UCC_COLL_TYPE_BARRIER);
  work->post(team_->handle(), args);
  return work;
}

}  // namespace meshfuse
