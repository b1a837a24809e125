#include "backends/mpi/mpi_backend.h"

#include <algorithm>

#include "backends/mpi/mpi_helpers.h"
#include "backends/mpi/mpi_types.h"
#include "backends/mpi/mpi_work.h"
#include "multidevice/communicator.h"

namespace meshfuse {

using mpi::MpiWork;
using mpi::OpLabel;

namespace {

const bool registered = registerBackend(
    CommunicatorBackend::Mpi,
    [](Communicator& c, const std::vector<int64_t>& team) { return std::make_unique<MpiBackend>(c, team); });

// ---- argument checks: every rank throws the same error before any communication. Messages are
// built only on failure (this runs on every call). ----

void checkTensor(const MpiBackend& backend, const char* op, const char* name, const Tensor& t) {
  const std::string where = std::string("mpi ") + op + ": " + name;
  if (!t.defined()) throw std::invalid_argument(where + " is undefined");
  if (!t.isContiguous()) throw std::invalid_argument(where + " " + t.toString() + " is not contiguous");
  if (!backend.supports(t.device()))
    throw std::invalid_argument(where + " is on " + t.device().toString() +
                                ", which this build cannot stage through host memory (built without CUDA)");
}

void checkSameDtype(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string("mpi ") + op + ": " + a_name + " is " + toString(a.dtype()) + " but " +
                                b_name + " is " + toString(b.dtype()) + "; the MPI backend does not convert");
}

void checkSameNumel(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  if (a.numel() != b.numel())
    throw std::invalid_argument(std::string("mpi ") + op + ": " + a_name + " has " + std::to_string(a.numel()) +
                                " elements, expected " + std::to_string(b.numel()) + " (the same as " + b_name + ")");
}

// ---- staging: CPU tensors are used in place, CUDA tensors go through a host copy ----

const void* hostSource(MpiWork& work, const Tensor& t) {
  if (t.device().type == DeviceType::CPU) {
    work.buffers.push_back(t.storage());
    return t.data();
  }
  Tensor host = t.to(Device::cpu());
  work.buffers.push_back(host.storage());
  return host.data();
}

// The host buffer MPI writes `t`'s result into; for a CUDA `t` the result is copied back when the
// Work completes. `copy_in`: the operation also reads `t` (in place).
void* hostDestination(MpiWork& work, const Tensor& t, bool copy_in) {
  if (t.device().type == DeviceType::CPU) {
    work.buffers.push_back(t.storage());
    return t.data();
  }
  Tensor host = copy_in ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype());
  work.copies_back.emplace_back(host, t);
  return host.data();
}

bool sameBytes(const Tensor& a, const void* b) { return a.device().type == DeviceType::CPU && a.data() == b; }

const char* byteAt(const Tensor& t, int64_t bytes) { return static_cast<const char*>(t.data()) + bytes; }

MPI_Request* newRequest(MpiWork& work) { return &work.requests.emplace_back(MPI_REQUEST_NULL); }

// Issues `call(offset_in_elements, count, request)` over chunks of at most `max_count` elements.
template <typename Call>
void issueInChunks(MpiWork& work, int64_t numel, int64_t max_count, const char* name, Call call) {
  for (int64_t offset = 0; offset < numel; offset += max_count)
    mpi::check(call(offset, static_cast<int>(std::min(max_count, numel - offset)), newRequest(work)), name);
}

}  // namespace

MpiBackend::MpiBackend(Communicator& communicator, const std::vector<int64_t>& team, int64_t max_count)
    : Backend(CommunicatorBackend::Mpi, team, communicator.rank()), max_count_(std::min<int64_t>(max_count, INT_MAX)) {
  if (max_count_ < 1) throw std::invalid_argument("MpiBackend: max_count must be positive");
  mpi::check(MPI_Comm_dup(mpi::fromHandle(communicator.mpiCommFor(team)), &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiBackend::~MpiBackend() {
  if (comm_ != MPI_COMM_NULL && !mpi::isFinalized()) MPI_Comm_free(&comm_);
}

bool MpiBackend::supports(Device device) const {
  return device.type == DeviceType::CPU || cudaCopyBytes != nullptr;  // CUDA: staged through host
}

int MpiBackend::blockCount(const char* op, int64_t numel) const {
  if (numel > max_count_)
    throw std::invalid_argument(std::string("mpi ") + op + ": a block of " + std::to_string(numel) +
                                " elements exceeds the " + std::to_string(max_count_) +
                                " one MPI call carries (MPI counts are int); split the tensor into smaller pieces");
  return static_cast<int>(numel);
}

void MpiBackend::checkBlocks(const char* op, const char* whole_name, const Tensor& whole, const char* block_name,
                             const Tensor& block) const {
  checkTensor(*this, op, whole_name, whole);
  checkSameDtype(op, whole_name, whole, block_name, block);
  if (whole.numel() != teamSize() * block.numel())
    throw std::invalid_argument(std::string("mpi ") + op + ": " + whole_name + " has " + std::to_string(whole.numel()) +
                                " elements, expected " + std::to_string(teamSize() * block.numel()) + " (team size " +
                                std::to_string(teamSize()) + " x " + block_name + " " + std::to_string(block.numel()) +
                                ")");
}

void MpiBackend::checkTeamRank(const char* op, const char* role, int64_t rank) const {
  if (rank < 0 || rank >= teamSize())
    throw std::invalid_argument(std::string("mpi ") + op + ": " + role + " " + std::to_string(rank) +
                                " is not a team rank (team " + teamToString(team()) + " has " +
                                std::to_string(teamSize()) + " members)");
}

std::unique_ptr<Work> MpiBackend::allgather(const Tensor& input, Tensor& output) {
  constexpr const char* op = "allgather";
  checkTensor(*this, op, "input", input);
  checkBlocks(op, "output", output, "input", input);
  if (input.numel() == 0) return completedWork();
  const int count = blockCount(op, input.numel());
  const MPI_Datatype type = mpi::datatypeFor(input.dtype());
  auto work = std::make_unique<MpiWork>(OpLabel{op, this, input.dtype(), input.numel()}, false);
  // The input may already be this rank's block of the output.
  const bool in_place = sameBytes(input, byteAt(output, rankInTeam() * static_cast<int64_t>(input.nbytes())));
  const void* in = in_place ? MPI_IN_PLACE : hostSource(*work, input);
  void* out = hostDestination(*work, output, in_place);
  mpi::check(MPI_Iallgather(in, count, type, out, count, type, comm_, newRequest(*work)), "MPI_Iallgather");
  return work;
}

std::unique_ptr<Work> MpiBackend::allreduce(Tensor& tensor, ReduceOp op) {
  constexpr const char* name = "allreduce";
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const MPI_Datatype type = mpi::datatypeFor(tensor.dtype());
  const MPI_Op mpi_op = mpi::opFor(op, tensor.dtype());
  auto work = std::make_unique<MpiWork>(OpLabel{name, this, tensor.dtype(), tensor.numel(), op}, false);
  char* buffer = static_cast<char*>(hostDestination(*work, tensor, /*copy_in=*/true));
  const size_t item = tensor.itemsize();
  issueInChunks(*work, tensor.numel(), max_count_, "MPI_Iallreduce", [&](int64_t offset, int count, MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, buffer + offset * item, count, type, mpi_op, comm_, r);
  });
  return work;
}

std::unique_ptr<Work> MpiBackend::reduceScatter(const Tensor& input, Tensor& output, ReduceOp op) {
  constexpr const char* name = "reduceScatter";
  checkTensor(*this, name, "output", output);
  checkBlocks(name, "input", input, "output", output);
  if (output.numel() == 0) return completedWork();
  const int count = blockCount(name, output.numel());
  const MPI_Datatype type = mpi::datatypeFor(input.dtype());
  auto work = std::make_unique<MpiWork>(OpLabel{name, this, input.dtype(), input.numel(), op}, false);
  const void* in = hostSource(*work, input);
  void* out = hostDestination(*work, output, false);
  mpi::check(MPI_Ireduce_scatter_block(in, out, count, type, mpi::opFor(op, input.dtype()), comm_, newRequest(*work)),
             "MPI_Ireduce_scatter_block");
  return work;
}

std::unique_ptr<Work> MpiBackend::reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp op) {
  constexpr const char* name = "reduce";
  checkTeamRank(name, "root", root);
  checkTensor(*this, name, "input", input);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    checkTensor(*this, name, "output (on the root)", output);
    checkSameDtype(name, "input", input, "output", output);
    checkSameNumel(name, "output", output, "input", input);
  }
  if (input.numel() == 0) return completedWork();
  const MPI_Datatype type = mpi::datatypeFor(input.dtype());
  const MPI_Op mpi_op = mpi::opFor(op, input.dtype());
  auto work = std::make_unique<MpiWork>(OpLabel{name, this, input.dtype(), input.numel(), op, "to root", root}, false);
  const bool in_place = is_root && sameBytes(input, output.data());
  const char* in = in_place ? nullptr : static_cast<const char*>(hostSource(*work, input));
  char* out = is_root ? static_cast<char*>(hostDestination(*work, output, in_place)) : nullptr;
  const size_t item = input.itemsize();
  issueInChunks(*work, input.numel(), max_count_, "MPI_Ireduce", [&](int64_t offset, int count, MPI_Request* r) {
    const void* send = in_place ? MPI_IN_PLACE : in + offset * item;
    return MPI_Ireduce(send, out ? out + offset * item : nullptr, count, type, mpi_op, static_cast<int>(root), comm_,
                       r);
  });
  return work;
}

std::unique_ptr<Work> MpiBackend::broadcast(Tensor& tensor, int64_t root) {
  constexpr const char* name = "broadcast";
  checkTeamRank(name, "root", root);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const MPI_Datatype type = mpi::datatypeFor(tensor.dtype());
  auto work = std::make_unique<MpiWork>(
      OpLabel{name, this, tensor.dtype(), tensor.numel(), std::nullopt, "from root", root}, false);
  // The root only sends: its tensor is not written, so it needs no copy back.
  char* buffer = rankInTeam() == root ? const_cast<char*>(static_cast<const char*>(hostSource(*work, tensor)))
                                      : static_cast<char*>(hostDestination(*work, tensor, false));
  const size_t item = tensor.itemsize();
  issueInChunks(*work, tensor.numel(), max_count_, "MPI_Ibcast", [&](int64_t offset, int count, MPI_Request* r) {
    return MPI_Ibcast(buffer + offset * item, count, type, static_cast<int>(root), comm_, r);
  });
  return work;
}

std::unique_ptr<Work> MpiBackend::gather(const Tensor& input, Tensor& output, int64_t root) {
  constexpr const char* name = "gather";
  checkTeamRank(name, "root", root);
  checkTensor(*this, name, "input", input);
  const bool is_root = rankInTeam() == root;
  if (is_root) checkBlocks(name, "output (on the root)", output, "input", input);
  if (input.numel() == 0) return completedWork();
  const int count = blockCount(name, input.numel());
  const MPI_Datatype type = mpi::datatypeFor(input.dtype());
  auto work = std::make_unique<MpiWork>(
      OpLabel{name, this, input.dtype(), input.numel(), std::nullopt, "to root", root}, false);
  const bool in_place = is_root && sameBytes(input, byteAt(output, root * static_cast<int64_t>(input.nbytes())));
  const void* in = in_place ? MPI_IN_PLACE : hostSource(*work, input);
  void* out = is_root ? hostDestination(*work, output, in_place) : nullptr;
  mpi::check(MPI_Igather(in, count, type, out, count, type, static_cast<int>(root), comm_, newRequest(*work)),
             "MPI_Igather");
  return work;
}

std::unique_ptr<Work> MpiBackend::scatter(const Tensor& input, Tensor& output, int64_t root) {
  constexpr const char* name = "scatter";
  checkTeamRank(name, "root", root);
  checkTensor(*this, name, "output", output);
  const bool is_root = rankInTeam() == root;
  if (is_root) checkBlocks(name, "input (on the root)", input, "output", output);
  if (output.numel() == 0) return completedWork();
  const int count = blockCount(name, output.numel());
  const MPI_Datatype type = mpi::datatypeFor(output.dtype());
  auto work = std::make_unique<MpiWork>(
      OpLabel{name, this, output.dtype(), output.numel(), std::nullopt, "from root", root}, false);
  const void* in = is_root ? hostSource(*work, input) : nullptr;
  void* out = hostDestination(*work, output, false);
  mpi::check(MPI_Iscatter(in, count, type, out, count, type, static_cast<int>(root), comm_, newRequest(*work)),
             "MPI_Iscatter");
  return work;
}

std::unique_ptr<Work> MpiBackend::allToAll(const Tensor& input, Tensor& output) {
  constexpr const char* name = "allToAll";
  checkTensor(*this, name, "input", input);
  checkTensor(*this, name, "output", output);
  checkSameDtype(name, "input", input, "output", output);
  checkSameNumel(name, "output", output, "input", input);
  if (input.numel() % teamSize() != 0)
    throw std::invalid_argument(std::string("mpi ") + name + ": input has " + std::to_string(input.numel()) +
                                " elements, not divisible by the team size " + std::to_string(teamSize()));
  if (input.numel() == 0) return completedWork();
  const int count = blockCount(name, input.numel() / teamSize());
  const MPI_Datatype type = mpi::datatypeFor(input.dtype());
  auto work = std::make_unique<MpiWork>(OpLabel{name, this, input.dtype(), input.numel()}, false);
  const void* in = hostSource(*work, input);
  void* out = hostDestination(*work, output, false);
  mpi::check(MPI_Ialltoall(in, count, type, out, count, type, comm_, newRequest(*work)), "MPI_Ialltoall");
  return work;
}

// Point-to-point messages of the backend all use one tag: MPI keeps messages between a pair of
// ranks on one communicator in order, so chunks and successive sends match their receives.
constexpr int kPointToPointTag = 7;

std::unique_ptr<Work> MpiBackend::send(const Tensor& tensor, int64_t dst) {
  constexpr const char* name = "send";
  checkTeamRank(name, "peer", dst);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const MPI_Datatype type = mpi::datatypeFor(tensor.dtype());
  auto work = std::make_unique<MpiWork>(
      OpLabel{name, this, tensor.dtype(), tensor.numel(), std::nullopt, "to team rank", dst}, false);
  const char* buffer = static_cast<const char*>(hostSource(*work, tensor));
  const size_t item = tensor.itemsize();
  issueInChunks(*work, tensor.numel(), max_count_, "MPI_Isend", [&](int64_t offset, int count, MPI_Request* r) {
    return MPI_Isend(buffer + offset * item, count, type, static_cast<int>(dst), kPointToPointTag, comm_, r);
  });
  return work;
}

std::unique_ptr<Work> MpiBackend::recv(Tensor& tensor, int64_t src) {
  constexpr const char* name = "recv";
  checkTeamRank(name, "peer", src);
  checkTensor(*this, name, "tensor", tensor);
  if (tensor.numel() == 0) return completedWork();
  const MPI_Datatype type = mpi::datatypeFor(tensor.dtype());
  auto work = std::make_unique<MpiWork>(
      OpLabel{name, this, tensor.dtype(), tensor.numel(), std::nullopt, "from team rank", src}, true);
  char* buffer = static_cast<char*>(hostDestination(*work, tensor, false));
  const size_t item = tensor.itemsize();
  issueInChunks(*work, tensor.numel(), max_count_, "MPI_Irecv", [&](int64_t offset, int count, MPI_Request* r) {
    return MPI_Irecv(buffer + offset * item, count, type, static_cast<int>(src), kPointToPointTag, comm_, r);
  });
  return work;
}

std::unique_ptr<Work> MpiBackend::barrier() {
  auto work = std::make_unique<MpiWork>(OpLabel{"barrier", this}, false);
  mpi::check(MPI_Ibarrier(comm_, newRequest(*work)), "MPI_Ibarrier");
  return work;
}

}  // namespace meshfuse
