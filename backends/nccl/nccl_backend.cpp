#include "backends/nccl/nccl_backend.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "multidevice/communicator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/event_work.h"
#include "runtime/cuda/streams.h"

namespace meshfuse {

struct NcclBackend::State {
  ncclComm_t comm = nullptr;
  bool aborted = false;
  std::string description;  // "nccl backend, team [0, 1]"
};

namespace {

const bool registered = registerBackend(
    CommunicatorBackend::Nccl,
    [](Communicator& c, const std::vector<int64_t>& team) { return std::make_unique<NcclBackend>(c, team); });

void ncclCheck(ncclResult_t r, const char* call, const std::string& where) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw std::runtime_error(where + ": " + call + " failed: " + ncclGetErrorString(r) + " (" +
                             ncclGetLastError(nullptr) + ")");
}
#define NCCL_CALL(call) ncclCheck((call), #call, state_->description)

ncclDataType_t ncclTypeOf(DataType d) {
  switch (d) {
    case DataType::Float: return ncclFloat32;
    case DataType::Double: return ncclFloat64;
    case DataType::Half: return ncclFloat16;
    case DataType::BFloat16: return ncclBfloat16;
    case DataType::Int: return ncclInt64;
    case DataType::Int32: return ncclInt32;
    case DataType::Bool: return ncclUint8;
  }
  throw std::invalid_argument("nccl backend: unknown dtype");
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw std::invalid_argument("nccl backend: unknown reduce op");
}

void checkNumel(const std::string& op, const char* name, int64_t actual, int64_t expected, const std::string& why) {
  if (actual != expected)
    throw std::invalid_argument(op + ": " + name + " has " + std::to_string(actual) + " elements, expected " +
                                std::to_string(expected) + " (" + why + ")");
}

void checkSameDtype(const std::string& op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(op + ": input is " + toString(a.dtype()) + " but output is " + toString(b.dtype()));
}

char* blockPtr(const Tensor& t, int64_t block, int64_t block_numel) {
  return static_cast<char*>(t.data()) + block * block_numel * static_cast<int64_t>(t.itemsize());
}

}  // namespace

NcclBackend::NcclBackend(Communicator& communicator, const std::vector<int64_t>& team)
    : Backend(CommunicatorBackend::Nccl, team, communicator.rank()), state_(std::make_shared<State>()) {
  state_->description = "nccl backend, team " + teamToString(team);
  std::string why;
  const int devices = cuda::deviceCount(&why);
  if (devices == 0) throw std::invalid_argument(state_->description + ": no CUDA device (" + why + ")");
  device_ = static_cast<int>(communicator.localRank() % devices);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rankInTeam() == 0) NCCL_CALL(ncclGetUniqueId(&id));
  // One GPU per member: NCCL refuses two ranks of one communicator on one GPU, late and on some
  // ranks only. Each member checks the members on its own node (it knows that node's GPU count)
  // and says so in the id exchange, so every member throws the same error before NCCL starts.
  const NodeTopology& nodes = communicator.nodes();
  std::vector<int64_t> my_node_members;
  for (int64_t r : team)
    if (nodes.nodeOf(r) == communicator.nodeId()) my_node_members.push_back(r);
  const bool shared = nodes.membersShareAGpu(my_node_members, devices);
  std::vector<std::string> ids = communicator.allgatherBytes(
      team, std::string(reinterpret_cast<const char*>(&id), sizeof id) + (shared ? 'S' : '-'),
      cuda::bootstrapTimeout());
  std::vector<int64_t> crowded;  // the members on nodes where members share a GPU
  for (size_t i = 0; i < team.size(); ++i)
    if (ids[i].back() == 'S')
      for (int64_t r : team)
        if (nodes.nodeOf(r) == nodes.nodeOf(team[i]) && std::find(crowded.begin(), crowded.end(), r) == crowded.end())
          crowded.push_back(r);
  if (!crowded.empty())
    throw std::invalid_argument(state_->description + ": members would share a GPU (" + nodes.describe(crowded) +
                                "; each rank uses GPU local rank % GPUs of its node), but NCCL needs one GPU per "
                                "member: run fewer ranks per node, or use the cuda or mpi backend");
  std::memcpy(&id, ids.at(0).data(), sizeof id);
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclCommInitRank(&state_->comm, static_cast<int>(teamSize()), id, static_cast<int>(rankInTeam())));
  MESHFUSE_CUDA_CHECK(cudaMalloc(&barrier_buffer_, sizeof(int)));
  MESHFUSE_CUDA_CHECK(cudaMemset(barrier_buffer_, 0, sizeof(int)));
}

// Never throws: backends may be destroyed at process exit, after the CUDA runtime has shut down
// ("driver shutting down"); then the communicator and the buffer are gone with the process anyway.
NcclBackend::~NcclBackend() {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (previous != device_) cudaSetDevice(device_);
  if (barrier_buffer_) cudaFree(barrier_buffer_);
  if (state_->comm && !state_->aborted) ncclCommDestroy(state_->comm);
  if (previous != device_) cudaSetDevice(previous);
}

void NcclBackend::check(const std::string& op, const char* name, const Tensor& t) const {
  if (state_->aborted)
    throw std::runtime_error(op + ": the communicator of " + state_->description + " was aborted after a timeout");
  cuda::checkDeviceTensor(op, name, t, device_, "nccl");
}

void NcclBackend::checkRoot(const std::string& op, int64_t root) const {
  if (root < 0 || root >= teamSize())
    throw std::invalid_argument(op + ": root " + std::to_string(root) + " is outside team " + teamToString(team()));
}

std::unique_ptr<Work> NcclBackend::finish(const std::string& op) {
  std::shared_ptr<State> state = state_;
  cuda::EventWork::Hooks hooks;
  hooks.async_error = [state]() -> std::string {
    if (state->aborted) return "the communicator was aborted";
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(state->comm, &r) != ncclSuccess) return "ncclCommGetAsyncError failed";
    return (r == ncclSuccess || r == ncclInProgress) ? std::string() : ncclGetErrorString(r);
  };
  hooks.on_timeout = [state] {
    if (!state->aborted) ncclCommAbort(state->comm);
    state->aborted = true;
  };
  return std::make_unique<cuda::EventWork>(device_, cuda::currentStream(device_), op + " on " + state_->description,
                                           std::move(hooks));
}

#define STREAM cuda::currentStream(device_)

std::unique_ptr<Work> NcclBackend::allgather(const Tensor& input, Tensor& output) {
  const std::string op = "allgather";
  check(op, "input", input);
  check(op, "output", output);
  checkSameDtype(op, input, output);
  checkNumel(op, "output", output.numel(), teamSize() * input.numel(), "team size x input");
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclAllGather(input.data(), output.data(), static_cast<size_t>(input.numel()), ncclTypeOf(input.dtype()),
                          state_->comm, STREAM));
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::allreduce(Tensor& tensor, ReduceOp rop) {
  const std::string op = "allreduce(" + toString(rop) + ")";
  check(op, "tensor", tensor);
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclAllReduce(tensor.data(), tensor.data(), static_cast<size_t>(tensor.numel()), ncclTypeOf(tensor.dtype()),
                          ncclOpOf(rop), state_->comm, STREAM));
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::reduceScatter(const Tensor& input, Tensor& output, ReduceOp rop) {
  const std::string op = "reduce_scatter(" + toString(rop) + ")";
  check(op, "input", input);
  check(op, "output", output);
  checkSameDtype(op, input, output);
  checkNumel(op, "input", input.numel(), teamSize() * output.numel(), "team size x output");
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclReduceScatter(input.data(), output.data(), static_cast<size_t>(output.numel()),
                              ncclTypeOf(input.dtype()), ncclOpOf(rop), state_->comm, STREAM));
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::reduce(const Tensor& input, Tensor& output, int64_t root, ReduceOp rop) {
  const std::string op = "reduce(" + toString(rop) + ")";
  check(op, "input", input);
  checkRoot(op, root);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    check(op, "output", output);
    checkSameDtype(op, input, output);
    checkNumel(op, "output", output.numel(), input.numel(), "same as input");
  }
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclReduce(input.data(), is_root ? output.data() : nullptr, static_cast<size_t>(input.numel()),
                       ncclTypeOf(input.dtype()), ncclOpOf(rop), static_cast<int>(root), state_->comm, STREAM));
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::broadcast(Tensor& tensor, int64_t root) {
  const std::string op = "broadcast";
  check(op, "tensor", tensor);
  checkRoot(op, root);
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclBroadcast(tensor.data(), tensor.data(), static_cast<size_t>(tensor.numel()), ncclTypeOf(tensor.dtype()),
                          static_cast<int>(root), state_->comm, STREAM));
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::gather(const Tensor& input, Tensor& output, int64_t root) {
  const std::string op = "gather";
  check(op, "input", input);
  checkRoot(op, root);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    check(op, "output", output);
    checkSameDtype(op, input, output);
    checkNumel(op, "output", output.numel(), teamSize() * input.numel(), "team size x input");
  }
  const size_t count = static_cast<size_t>(input.numel());
  const ncclDataType_t type = ncclTypeOf(input.dtype());
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclGroupStart());
  if (is_root)
    for (int64_t r = 0; r < teamSize(); ++r)
      NCCL_CALL(ncclRecv(blockPtr(output, r, input.numel()), count, type, static_cast<int>(r), state_->comm, STREAM));
  NCCL_CALL(ncclSend(input.data(), count, type, static_cast<int>(root), state_->comm, STREAM));
  NCCL_CALL(ncclGroupEnd());
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::scatter(const Tensor& input, Tensor& output, int64_t root) {
  const std::string op = "scatter";
  check(op, "output", output);
  checkRoot(op, root);
  const bool is_root = rankInTeam() == root;
  if (is_root) {
    check(op, "input", input);
    checkSameDtype(op, input, output);
    checkNumel(op, "input", input.numel(), teamSize() * output.numel(), "team size x output");
  }
  const size_t count = static_cast<size_t>(output.numel());
  const ncclDataType_t type = ncclTypeOf(output.dtype());
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclGroupStart());
  if (is_root)
    for (int64_t r = 0; r < teamSize(); ++r)
      NCCL_CALL(ncclSend(blockPtr(input, r, output.numel()), count, type, static_cast<int>(r), state_->comm, STREAM));
  NCCL_CALL(ncclRecv(output.data(), count, type, static_cast<int>(root), state_->comm, STREAM));
  NCCL_CALL(ncclGroupEnd());
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::allToAll(const Tensor& input, Tensor& output) {
  const std::string op = "all_to_all";
  check(op, "input", input);
  check(op, "output", output);
  checkSameDtype(op, input, output);
  checkNumel(op, "output", output.numel(), input.numel(), "same as input");
  if (input.numel() % teamSize() != 0)
    throw std::invalid_argument(op + ": input " + input.toString() + " does not split into " +
                                std::to_string(teamSize()) + " blocks");
  const int64_t block = input.numel() / teamSize();
  const ncclDataType_t type = ncclTypeOf(input.dtype());
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclGroupStart());
  for (int64_t r = 0; r < teamSize(); ++r) {
    NCCL_CALL(ncclSend(blockPtr(input, r, block), static_cast<size_t>(block), type, static_cast<int>(r), state_->comm,
                       STREAM));
    NCCL_CALL(ncclRecv(blockPtr(output, r, block), static_cast<size_t>(block), type, static_cast<int>(r), state_->comm,
                       STREAM));
  }
  NCCL_CALL(ncclGroupEnd());
  return finish(op);
}

std::unique_ptr<Work> NcclBackend::send(const Tensor& tensor, int64_t dst) {
  const std::string op = "send";
  check(op, "tensor", tensor);
  checkRoot(op, dst);
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclSend(tensor.data(), static_cast<size_t>(tensor.numel()), ncclTypeOf(tensor.dtype()),
                     static_cast<int>(dst), state_->comm, STREAM));
  return finish(op + " to " + std::to_string(dst));
}

std::unique_ptr<Work> NcclBackend::recv(Tensor& tensor, int64_t src) {
  const std::string op = "recv";
  check(op, "tensor", tensor);
  checkRoot(op, src);
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclRecv(tensor.data(), static_cast<size_t>(tensor.numel()), ncclTypeOf(tensor.dtype()),
                     static_cast<int>(src), state_->comm, STREAM));
  return finish(op + " from " + std::to_string(src));
}

std::unique_ptr<Work> NcclBackend::barrier() {
  if (state_->aborted) throw std::runtime_error("barrier: the communicator of " + state_->description + " was aborted");
  cuda::DeviceGuard guard(device_);
  NCCL_CALL(ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclInt32, ncclSum, state_->comm, STREAM));
  return finish("barrier");
}

}  // namespace meshfuse
