// The per-rank host program: compute segments to launch, communications to post and wait for, and
// local slices, in order. HostIrLower builds it; HostIrEvaluator runs it; toString() prints it.
#pragma once
#include <string>
#include <vector>

#include "backends/backend.h"
#include "ir/ir.h"
#include "runtime/segment.h"

namespace meshfuse {

struct Communication {
  enum class Type : uint8_t {
    Allgather,
    Allreduce,
    ReduceScatter,
    Reduce,
    Gather,
    Broadcast,
    Scatter,
    AllToAll,
    SendRecv
  };
  Type type = Type::Allgather;
  std::vector<int64_t> team;  // world ranks, in team order
  int64_t root = -1;          // team index of the root (Reduce, Gather, Broadcast, Scatter)
  ReduceOp op = ReduceOp::Sum;
  CommunicatorBackend backend = CommunicatorBackend::Mpi;
  TensorView* in = nullptr;
  TensorView* out = nullptr;
  int gathered_axis = -1;   // Allgather, Gather, AllToAll: the axis whose blocks arrive from the team
  int scattered_axis = -1;  // ReduceScatter, Scatter, AllToAll: the axis whose blocks go to the team
  // SendRecv: this rank's peer (world rank) and role.
  int64_t send_to = -1;
  int64_t recv_from = -1;
  std::string toString() const;
};
std::string toString(Communication::Type t);

// A host loop over `chunks` pieces of a matmul and the communication that feeds it or drains it,
// pipelined so that chunk i's communication overlaps a neighbouring chunk's matmul
// (ParallelType::stream). The communication template describes the whole tensors.
struct StreamLoop {
  enum class Kind : uint8_t { AllgatherThenMatmul, MatmulThenReduceScatter };
  Kind kind = Kind::AllgatherThenMatmul;
  int64_t chunks = 1;
  int communication = -1;
  int segment = -1;  // the matmul/linear segment (one expr)
  std::string toString(const struct HostIrContainer& hic, int64_t streams) const;
};

struct Instruction {
  enum class Kind : uint8_t { LaunchSegment, PostCommunication, Wait, LocalSlice, LocalCopy, StreamForLoop };
  Kind kind = Kind::LaunchSegment;
  int index = -1;  // segment, communication or stream-loop index
  // LocalSlice: out = block `block` of `parts` of in along `axis`; LocalCopy: out = in.
  TensorView* in = nullptr;
  TensorView* out = nullptr;
  int axis = -1;
  int64_t parts = 1;
  int64_t block = 0;
};

class HostIrContainer {
 public:
  int64_t rank = 0;
  Device device;
  std::vector<Segment> segments;
  std::vector<Communication> communications;
  std::vector<StreamLoop> loops;
  std::vector<Instruction> program;
  int64_t number_of_streams = 1;
  ShapeMap local_shapes;
  std::string toString() const;
};

// Drops the segments left without exprs, renumbering the instructions and stream loops that name
// segments (passes that move exprs between segments end with it).
void removeEmptySegments(HostIrContainer& hic);

}  // namespace meshfuse
