#include "backends/cuda_ipc/cuda_ipc_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "multidevice/communicator.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/event_work.h"
#include "runtime/cuda/streams.h"

namespace meshfuse {

namespace {

const bool registered = registerBackend(
    CommunicatorBackend::Cuda,
    [](Communicator& c, const std::vector<int64_t>& team) { return std::make_unique<CudaIpcBackend>(c, team); });

constexpr size_t kMinStaging = 1u << 20;

// What a rank publishes before each operation's reads: its staging buffer's generation and handle.
struct Publication {
  uint64_t generation;
  uint64_t capacity;
  cudaIpcMemHandle_t handle;
};

template <typename T>
std::string asBytes(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
T fromBytes(const std::string& s) {
  if (s.size() != sizeof(T)) throw std::logic_error("cuda backend: a peer sent a message of the wrong size");
  T v;
  std::memcpy(&v, s.data(), sizeof v);
  return v;
}

[[noreturn]] void notSupported(const std::string& op) {
  throw std::invalid_argument(op +
                              " is not supported by the cuda backend (it has allgather, broadcast, send/recv and "
                              "barrier); use the nccl backend");
}

}  // namespace

struct CudaIpcBackend::Impl {
  struct Peer {
    int64_t world_rank = 0;
    cudaEvent_t ready = nullptr, read = nullptr;  // opened from the peer's handles (null for myself)
    uint64_t generation = 0;
    char* staging = nullptr;  // mapped peer staging (own staging for myself)
  };

  Communicator& comm;
  int device;
  std::string description;
  int64_t me;
  std::vector<Peer> peers;  // by team rank
  char* staging = nullptr;
  size_t capacity = 0;
  uint64_t generation = 0;
  cudaIpcMemHandle_t handle{};
  cudaEvent_t ready = nullptr, read = nullptr;  // interprocess
  cudaEvent_t staging_free = nullptr;           // local: peers are done with our staging

  Impl(Communicator& c, int dev, const std::vector<int64_t>& team, int64_t my_rank, std::string what)
      : comm(c), device(dev), description(std::move(what)), me(my_rank), peers(team.size()) {
    cuda::DeviceGuard guard(device);
    const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
    MESHFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&ready, flags));
    MESHFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&read, flags));
    MESHFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&staging_free, cudaEventDisableTiming));
    MESHFUSE_CUDA_CHECK(cudaEventRecord(staging_free, cuda::currentStream(device)));
    struct Hello {
      int32_t device;
      cudaIpcEventHandle_t ready, read;
    } hello{};
    hello.device = device;
    MESHFUSE_CUDA_CHECK(cudaIpcGetEventHandle(&hello.ready, ready));
    MESHFUSE_CUDA_CHECK(cudaIpcGetEventHandle(&hello.read, read));
    std::vector<std::string> all = comm.allgatherBytes(team, asBytes(hello), cuda::bootstrapTimeout());
    for (size_t r = 0; r < team.size(); ++r) {
      Hello h = fromBytes<Hello>(all[r]);
      peers[r].world_rank = team[r];
      if (static_cast<int64_t>(r) == me) continue;
      MESHFUSE_CUDA_CHECK(cudaIpcOpenEventHandle(&peers[r].ready, h.ready));
      MESHFUSE_CUDA_CHECK(cudaIpcOpenEventHandle(&peers[r].read, h.read));
    }
  }

  ~Impl() {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaDeviceSynchronize();
    for (size_t r = 0; r < peers.size(); ++r) {
      if (static_cast<int64_t>(r) == me) continue;
      if (peers[r].staging) cudaIpcCloseMemHandle(peers[r].staging);
      if (peers[r].ready) cudaEventDestroy(peers[r].ready);
      if (peers[r].read) cudaEventDestroy(peers[r].read);
    }
    if (staging) cudaFree(staging);
    for (cudaEvent_t e : {ready, read, staging_free})
      if (e) cudaEventDestroy(e);
    if (previous >= 0) cudaSetDevice(previous);
  }

  // Grows the staging buffer to `bytes` once the peers have finished reading the old one.
  void reserve(size_t bytes) {
    if (bytes <= capacity && staging != nullptr) return;  // the first operation always publishes a buffer
    MESHFUSE_CUDA_CHECK(cudaEventSynchronize(staging_free));
    if (staging) MESHFUSE_CUDA_CHECK(cudaFree(staging));
    size_t grown = std::max({bytes, 2 * capacity, kMinStaging});
    grown = (grown + kMinStaging - 1) / kMinStaging * kMinStaging;
    void* p = nullptr;
    MESHFUSE_CUDA_CHECK(cudaMalloc(&p, grown));
    staging = static_cast<char*>(p);
    capacity = grown;
    MESHFUSE_CUDA_CHECK(cudaIpcGetMemHandle(&handle, staging));
    ++generation;
  }

  // One operation among the team ranks `group` (ascending). `contribute` copies this rank's data
  // into its staging (or is empty); `read(peer_staging, peer)` copies out of a peer's staging.
  void run(const std::vector<int64_t>& group, size_t contribution_bytes,
           const std::function<void(char*, cudaStream_t)>& contribute, const std::vector<int64_t>& sources,
           const std::function<void(const char*, int64_t, cudaStream_t)>& read_from) {
    cuda::DeviceGuard guard(device);
    cudaStream_t stream = cuda::currentStream(device);
    std::vector<int64_t> world;
    for (int64_t r : group) world.push_back(peers[r].world_rank);
    reserve(contribution_bytes);
    if (contribute) {
      MESHFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, staging_free, 0));
      contribute(staging, stream);
    }
    MESHFUSE_CUDA_CHECK(cudaEventRecord(ready, stream));

    Publication mine{generation, capacity, handle};
    std::vector<std::string> pubs = comm.allgatherBytes(world, asBytes(mine), cuda::bootstrapTimeout());
    for (size_t i = 0; i < group.size(); ++i) {
      const int64_t r = group[i];
      if (r == me) continue;
      Publication p = fromBytes<Publication>(pubs[i]);
      Peer& peer = peers[r];
      if (p.generation != peer.generation) {
        if (peer.staging) MESHFUSE_CUDA_CHECK(cudaIpcCloseMemHandle(peer.staging));
        peer.staging = nullptr;
        if (p.generation > 0) {
          void* mapped = nullptr;
          MESHFUSE_CUDA_CHECK(cudaIpcOpenMemHandle(&mapped, p.handle, cudaIpcMemLazyEnablePeerAccess));
          peer.staging = static_cast<char*>(mapped);
        }
        peer.generation = p.generation;
      }
    }
    for (int64_t r : sources) {
      if (r == me) {
        read_from(staging, r, stream);
        continue;
      }
      if (!peers[r].staging)
        throw std::logic_error(description + ": team rank " + std::to_string(r) + " published no staging buffer");
      MESHFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, peers[r].ready, 0));
      read_from(peers[r].staging, r, stream);
    }
    MESHFUSE_CUDA_CHECK(cudaEventRecord(read, stream));

    comm.allgatherBytes(world, std::string(1, '\0'), cuda::bootstrapTimeout());  // every read is recorded
    for (int64_t r : group)
      if (r != me) MESHFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, peers[r].read, 0));
    MESHFUSE_CUDA_CHECK(cudaEventRecord(staging_free, stream));
  }
};

CudaIpcBackend::CudaIpcBackend(Communicator& communicator, const std::vector<int64_t>& team)
    : Backend(CommunicatorBackend::Cuda, team, communicator.rank()) {
  const std::string what = "cuda backend, team " + teamToString(team);
  // CUDA IPC maps peers' device memory, which only works within one node. Every member sees the
  // same node table, so every member throws this same error before any exchange.
  const NodeTopology& nodes = communicator.nodes();
  if (const auto spanned = nodes.nodesOf(team); spanned.size() > 1)
    throw std::invalid_argument(what + " spans " + std::to_string(spanned.size()) + " nodes (" + nodes.describe(team) +
                                "), but CUDA IPC reaches only the GPUs of one node: use the nccl backend (or "
                                "ucc, mpi) for a team across nodes");
  std::string why;
  const int devices = cuda::deviceCount(&why);
  if (devices == 0) throw std::invalid_argument(what + ": no CUDA device (" + why + ")");
  device_ = static_cast<int>(communicator.localRank() % devices);
  impl_ = std::make_unique<Impl>(communicator, device_, team, rankInTeam(), what);
}

CudaIpcBackend::~CudaIpcBackend() = default;

size_t CudaIpcBackend::stagingBytes() const { return impl_->capacity; }

void CudaIpcBackend::check(const std::string& op, const char* name, const Tensor& t) const {
  cuda::checkDeviceTensor(op, name, t, device_, "cuda");
}

namespace {
std::vector<int64_t> everyone(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// A copy between device buffers (a peer's mapped staging, on the same or another GPU). On one GPU
// a plain device-to-device cudaMemcpyAsync may run as a kernel on the multiprocessors, where it
// waits behind a matmul that fills them: the copy the stream loop wants hidden then serializes.
// cudaMemcpyBatchAsync with PreferOverlapWithCompute asks for the copy engines instead (a hint;
// it needs a stream other than the legacy default one, so that stream keeps the plain copy).
// MESHFUSE_CUDA_IPC_PLAIN_COPY=1 keeps the plain copy everywhere (for A/B measurements).
void copyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  static const bool plain = std::getenv("MESHFUSE_CUDA_IPC_PLAIN_COPY") != nullptr;
  if (bytes == 0) return;
  if (stream != nullptr && !plain) {
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attrs_index = 0;
    void* dsts[] = {dst};
    const void* srcs[] = {src};
    size_t sizes[] = {bytes};
    if (cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attrs, &attrs_index, 1, stream) == cudaSuccess) return;
    cudaGetLastError();  // not supported here: the plain copy below
  }
  MESHFUSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}
}  // namespace

std::unique_ptr<Work> CudaIpcBackend::allgather(const Tensor& input, Tensor& output) {
  const std::string op = "allgather";
  check(op, "input", input);
  check(op, "output", output);
  if (input.dtype() != output.dtype())
    throw std::invalid_argument(op + ": input is " + toString(input.dtype()) + " but output is " +
                                toString(output.dtype()));
  if (output.numel() != teamSize() * input.numel())
    throw std::invalid_argument(op + ": output has " + std::to_string(output.numel()) + " elements, expected " +
                                std::to_string(teamSize() * input.numel()) + " (team size x input)");
  const size_t bytes = input.nbytes();
  const char* src = static_cast<const char*>(input.data());
  char* out = static_cast<char*>(output.data());
  impl_->run(
      everyone(teamSize()), bytes, [&](char* staging, cudaStream_t s) { copyAsync(staging, src, bytes, s); },
      everyone(teamSize()),
      [&](const char* staging, int64_t r, cudaStream_t s) {
        copyAsync(out + r * static_cast<int64_t>(bytes), r == rankInTeam() ? src : staging, bytes, s);
      });
  return std::make_unique<cuda::EventWork>(device_, cuda::currentStream(device_), op + " on " + impl_->description);
}

std::unique_ptr<Work> CudaIpcBackend::broadcast(Tensor& tensor, int64_t root) {
  const std::string op = "broadcast";
  check(op, "tensor", tensor);
  if (root < 0 || root >= teamSize())
    throw std::invalid_argument(op + ": root " + std::to_string(root) + " is outside team " + teamToString(team()));
  const bool is_root = rankInTeam() == root;
  const size_t bytes = tensor.nbytes();
  char* data = static_cast<char*>(tensor.data());
  impl_->run(everyone(teamSize()), is_root ? bytes : 0,
             is_root ? std::function<void(char*, cudaStream_t)>(
                           [&](char* staging, cudaStream_t s) { copyAsync(staging, data, bytes, s); })
                     : nullptr,
             is_root ? std::vector<int64_t>{} : std::vector<int64_t>{root},
             [&](const char* staging, int64_t, cudaStream_t s) { copyAsync(data, staging, bytes, s); });
  return std::make_unique<cuda::EventWork>(device_, cuda::currentStream(device_), op + " on " + impl_->description);
}

std::unique_ptr<Work> CudaIpcBackend::send(const Tensor& tensor, int64_t dst) {
  const std::string op = "send to " + std::to_string(dst);
  check(op, "tensor", tensor);
  if (dst < 0 || dst >= teamSize() || dst == rankInTeam())
    throw std::invalid_argument(op + ": destination must be another rank of team " + teamToString(team()));
  const size_t bytes = tensor.nbytes();
  const char* data = static_cast<const char*>(tensor.data());
  std::vector<int64_t> pair = {std::min(dst, rankInTeam()), std::max(dst, rankInTeam())};
  impl_->run(
      pair, bytes, [&](char* staging, cudaStream_t s) { copyAsync(staging, data, bytes, s); }, {}, nullptr);
  return std::make_unique<cuda::EventWork>(device_, cuda::currentStream(device_), op + " on " + impl_->description);
}

std::unique_ptr<Work> CudaIpcBackend::recv(Tensor& tensor, int64_t src) {
  const std::string op = "recv from " + std::to_string(src);
  check(op, "tensor", tensor);
  if (src < 0 || src >= teamSize() || src == rankInTeam())
    throw std::invalid_argument(op + ": source must be another rank of team " + teamToString(team()));
  const size_t bytes = tensor.nbytes();
  char* data = static_cast<char*>(tensor.data());
  std::vector<int64_t> pair = {std::min(src, rankInTeam()), std::max(src, rankInTeam())};
  impl_->run(pair, 0, nullptr, {src},
             [&](const char* staging, int64_t, cudaStream_t s) { copyAsync(data, staging, bytes, s); });
  return std::make_unique<cuda::EventWork>(device_, cuda::currentStream(device_), op + " on " + impl_->description);
}

std::unique_ptr<Work> CudaIpcBackend::barrier() {
  std::vector<int64_t> world(team().begin(), team().end());
  impl_->comm.allgatherBytes(world, std::string(1, '\0'), cuda::bootstrapTimeout());
  return completedWork();
}

std::unique_ptr<Work> CudaIpcBackend::allreduce(Tensor&, ReduceOp) { notSupported("allreduce"); }
std::unique_ptr<Work> CudaIpcBackend::reduceScatter(const Tensor&, Tensor&, ReduceOp) {
  notSupported("reduce_scatter");
}
std::unique_ptr<Work> CudaIpcBackend::reduce(const Tensor&, Tensor&, int64_t, ReduceOp) { notSupported("reduce"); }
std::unique_ptr<Work> CudaIpcBackend::gather(const Tensor&, Tensor&, int64_t) { notSupported("gather"); }
std::unique_ptr<Work> CudaIpcBackend::scatter(const Tensor&, Tensor&, int64_t) { notSupported("scatter"); }
std::unique_ptr<Work> CudaIpcBackend::allToAll(const Tensor&, Tensor&) { notSupported("all_to_all"); }

}  // namespace meshfuse
