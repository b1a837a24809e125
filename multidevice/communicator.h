// The Communicator: one per process, bootstrapped by MPI (mpirun, srun with PMIx, or a singleton
// world of size 1 when started without a launcher). It knows the world and hands out Backend
// objects per (backend type, team), creating each lazily, collectively over the team's members.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "multidevice/node_topology.h"

namespace meshfuse {

// What `auto` means for a team's tensors on `device_type`: NCCL when it is built and no two members
// of the team share a GPU (NCCL refuses two ranks of one communicator on one GPU; see
// NodeTopology::membersShareAGpu), else MPI, which carries every communication (CUDA tensors
// staged through the host).
CommunicatorBackend chooseAutoBackend(DeviceType device_type, bool nccl_available, bool members_share_a_gpu);

class Communicator;
// Builds a backend for `team` (called on every member of the team, at the same point).
using BackendFactory = std::function<std::unique_ptr<Backend>(Communicator&, const std::vector<int64_t>& team)>;

// What a backend may need done once per process, collectively over the whole world, before its
// first team (UCC: its one context, whose address exchange spans the world). `timeout` bounds it.
using BackendWorldSetup = std::function<void(Communicator&, std::chrono::milliseconds timeout)>;

// Backends register themselves from their own .cpp file (static initialization), so adding one
// needs no edit here. Returns true so it can initialize a static.
bool registerBackend(CommunicatorBackend type, BackendFactory factory, BackendWorldSetup world_setup = nullptr);

class Communicator {
 public:
  static Communicator& instance();
  // Whether instance() has run in this process (asking does not start MPI): the Python front end
  // aborts the job on an uncaught exception only where a world exists to abort.
  static bool exists();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  // Node awareness (MPI's shared-memory split): this rank's place on its node, the node's id
  // (0 .. nodeCount()-1, in order of the nodes' lowest ranks) and the whole world's table.
  int64_t localRank() const { return nodes_.localRankOf(rank_); }
  int64_t localSize() const { return nodes_.localSizeOf(rank_); }
  int64_t nodeId() const { return nodes_.nodeOf(rank_); }
  int64_t nodeCount() const { return nodes_.nodeCount(); }
  const NodeTopology& nodes() const { return nodes_; }
  void barrier();

  // The backends compiled in and usable here (MPI always; Gloo, NCCL, CUDA when built).
  std::vector<CommunicatorBackend> availableBackends() const;
  bool isAvailable(CommunicatorBackend type) const;
  // "" when `type` is available; else why, for an error message: "not available in this build", with
  // the loader's message when the backend's plugin did not load (a wheel moved away from its UCC).
  std::string whyUnavailable(CommunicatorBackend type) const;
  // Resolves `auto` for a team's tensors on `device` (chooseAutoBackend with the team's places on
  // their nodes, every node assumed to have as many GPUs as this one: the ranks' check that they
  // lowered the same program catches nodes that disagree). Without a team: the world's.
  CommunicatorBackend resolve(CommunicatorBackend requested, Device device, const std::vector<int64_t>& team) const;
  CommunicatorBackend resolve(CommunicatorBackend requested, Device device) const;
  // The cached backend for (type, team); the first call must be made by every member of the team.
  // Throws std::invalid_argument naming the available backends when `type` is not built.
  Backend& backend(CommunicatorBackend type, const std::vector<int64_t>& team);
  // Collective over the world: runs `type`'s world setup (registerBackend) unless it has run in
  // this process. The executor calls it for a new program's backend once the ranks agree on the
  // program, so that a backend's first team may be any team.
  void prepare(CommunicatorBackend type, std::chrono::milliseconds timeout);

  // Bootstrap helpers over the world (MPI), used by backends to exchange ids and by the
  // executor's pre-flight check. Each has a deadline: a rank that never arrives is an error.
  // Every member of `team` passes its `bytes` (sizes may differ); returns all contributions, in team order.
  std::vector<std::string> allgatherBytes(const std::vector<int64_t>& team, const std::string& bytes,
                                          std::chrono::milliseconds timeout);
  // The MPI communicator (MPI_Comm, as a handle) for a team, created on first use (collective over the team).
  void* mpiCommFor(const std::vector<int64_t>& team);

  // Ends every process of the job (the last resort when a rank cannot make progress).
  [[noreturn]] void abort(int code, const std::string& why);
  // After a communication timeout a half-done collective never completes, and MPI_Finalize would
  // wait for the missing rank forever: once marked, exit skips the MPI cleanup (the process ends
  // with its own exit code, and mpirun then ends the job).
  void markBroken() { broken_ = true; }
  bool broken() const { return broken_; }

 private:
  Communicator();
  ~Communicator();
  // The process that joined the world. A fork of it (a data loader's worker) shares its MPI state
  // but is no rank: instance() refuses it, and its exit leaves the world alone.
  bool inForkedChild() const;
  std::string forkedChildError() const;
  int64_t owner_pid_ = 0;
  int64_t rank_ = 0, size_ = 1;
  NodeTopology nodes_;
  bool finalize_mpi_ = false;
  std::atomic<bool> broken_{false};
  std::mutex mutex_;
  std::map<std::pair<CommunicatorBackend, std::vector<int64_t>>, std::unique_ptr<Backend>> backends_;
  std::map<std::vector<int64_t>, void*> mpi_comms_;
  std::set<CommunicatorBackend> prepared_;  // guarded by mutex_
};

}  // namespace meshfuse
