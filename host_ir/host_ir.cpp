#include "host_ir/host_ir.h"

#include <sstream>

#include "runtime/tensor.h"

namespace meshfuse {

std::string toString(Communication::Type t) {
  switch (t) {
    case Communication::Type::Allgather: return "Allgather";
    case Communication::Type::Allreduce: return "Allreduce";
    case Communication::Type::ReduceScatter: return "ReduceScatter";
    case Communication::Type::Reduce: return "Reduce";
    case Communication::Type::Gather: return "Gather";
    case Communication::Type::Broadcast: return "Broadcast";
    case Communication::Type::Scatter: return "Scatter";
    case Communication::Type::AllToAll: return "AllToAll";
    case Communication::Type::SendRecv: return "SendRecv";
  }
  return "?";
}

std::string Communication::toString() const {
  std::ostringstream os;
  os << meshfuse::toString(type) << "(" << out->name() << " <- " << in->name() << ", team=" << shapeToString(team);
  if (root >= 0) os << ", root=" << team[root];
  if (type == Type::Allreduce || type == Type::ReduceScatter || type == Type::Reduce)
    os << ", op=" << meshfuse::toString(op);
  if (gathered_axis >= 0) os << ", gathered_axis=" << gathered_axis;
  if (scattered_axis >= 0) os << ", scattered_axis=" << scattered_axis;
  if (send_to >= 0) os << ", send_to=" << send_to;
  if (recv_from >= 0) os << ", recv_from=" << recv_from;
  os << ", backend=" << meshfuse::toString(backend) << ")";
  return os.str();
}

std::string StreamLoop::toString(const HostIrContainer& hic, int64_t streams) const {
  std::ostringstream os;
  const Communication& c = hic.communications[communication];
  os << "ForLoop (i in 0.." << chunks << ", ParallelType::stream over " << streams << " streams) {\n";
  if (kind == Kind::AllgatherThenMatmul) {
    os << "    PostOnStream(i) " << c.toString() << "[chunk i]\n";
    os << "    Wait(i)\n";
    os << "    LaunchSegment(i) " << hic.segments[segment].toString() << "[chunk i]\n";
  } else {
    os << "    LaunchSegment(i) " << hic.segments[segment].toString() << "[chunk i]\n";
    os << "    Wait(i - streams)\n";
    os << "    PostOnStream(i) " << c.toString() << "[chunk i]\n";
  }
  os << "  }";
  return os.str();
}

std::string HostIrContainer::toString() const {
  std::ostringstream os;
  os << "HostIrContainer (rank " << rank << ", " << device.toString() << ") {\n";
  for (const Instruction& ins : program) {
    switch (ins.kind) {
      case Instruction::Kind::LaunchSegment: os << "  LaunchSegment " << segments[ins.index].toString(); break;
      case Instruction::Kind::PostCommunication: os << "  PostOnStream " << communications[ins.index].toString(); break;
      case Instruction::Kind::Wait:
        os << "  Wait " << meshfuse::toString(communications[ins.index].type) << "("
           << communications[ins.index].out->name() << ")";
        break;
      case Instruction::Kind::LocalSlice:
        os << "  LocalSlice " << ins.out->name() << " = " << ins.in->name() << " block " << ins.block << "/"
           << ins.parts << " along axis " << ins.axis;
        break;
      case Instruction::Kind::LocalCopy: os << "  LocalCopy " << ins.out->name() << " = " << ins.in->name(); break;
      case Instruction::Kind::StreamForLoop: os << "  " << loops[ins.index].toString(*this, number_of_streams); break;
    }
    if (ins.out || ins.kind == Instruction::Kind::LaunchSegment) {
      const TensorView* shown =
          ins.out ? ins.out : (segments[ins.index].outputs.empty() ? nullptr : segments[ins.index].outputs[0]);
      if (shown && local_shapes.count(shown)) os << "  # local " << shapeToString(local_shapes.at(shown));
    }
    os << "\n";
  }
  os << "}\n";
  return os.str();
}

void removeEmptySegments(HostIrContainer& hic) {
  std::vector<int> renumbered(hic.segments.size(), -1);
  std::vector<Segment> kept;
  for (size_t i = 0; i < hic.segments.size(); ++i) {
    if (hic.segments[i].exprs.empty()) continue;
    renumbered[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(hic.segments[i]));
  }
  hic.segments = std::move(kept);
  std::vector<Instruction> program;
  for (Instruction ins : hic.program) {
    if (ins.kind == Instruction::Kind::LaunchSegment) {
      if (renumbered[static_cast<size_t>(ins.index)] < 0) continue;
      ins.index = renumbered[static_cast<size_t>(ins.index)];
    }
    program.push_back(ins);
  }
  hic.program = std::move(program);
  for (StreamLoop& loop : hic.loops) loop.segment = renumbered[static_cast<size_t>(loop.segment)];
}

}  // namespace meshfuse
