#include "host_ir/wait_placement.h"

#include <algorithm>

namespace meshfuse {

namespace {

// The values an instruction reads and the ones it produces (a Wait: none; its communication's
// result is accounted to the communication).
class Dataflow {
 public:
  explicit Dataflow(const HostIrContainer& hic) : hic_(hic) {}

  bool reads(const Instruction& ins, const TensorView* tv) const {
    switch (ins.kind) {
      case Instruction::Kind::LaunchSegment: return contains(hic_.segments[ins.index].inputs, tv);
      case Instruction::Kind::PostCommunication: return hic_.communications[ins.index].in == tv;
      case Instruction::Kind::LocalSlice:
      case Instruction::Kind::LocalCopy: return ins.in == tv;
      case Instruction::Kind::StreamForLoop: {
        const StreamLoop& loop = hic_.loops[ins.index];
        return hic_.communications[loop.communication].in == tv || contains(hic_.segments[loop.segment].inputs, tv);
      }
      case Instruction::Kind::Wait: return false;
    }
    return false;
  }

  // Whether `reader` reads anything `producer` produces.
  bool readsResultOf(const Instruction& reader, const Instruction& producer) const {
    if (producer.kind == Instruction::Kind::LaunchSegment)
      return std::any_of(hic_.segments[producer.index].outputs.begin(), hic_.segments[producer.index].outputs.end(),
                         [&](const TensorView* tv) { return reads(reader, tv); });
    return producer.out != nullptr && reads(reader, producer.out);
  }

  // A view of a value: its result is the value's storage seen another way (or, for a cat, a
  // copy), so running it later moves no work past anything that needs it.
  bool isView(const Instruction& ins) const {
    return (ins.kind == Instruction::Kind::LaunchSegment && hic_.segments[ins.index].kind == Segment::Kind::View) ||
           ins.kind == Instruction::Kind::LocalSlice;
  }

 private:
  template <typename Values>
  static bool contains(const Values& values, const TensorView* tv) {
    return std::find(values.begin(), values.end(), tv) != values.end();
  }
  const HostIrContainer& hic_;
};

class WaitPlacer {
 public:
  explicit WaitPlacer(const HostIrContainer& hic) : hic_(hic), flow_(hic) {}

  std::vector<Instruction> place() {
    for (const Instruction& ins : hic_.program) {
      std::vector<int> comms = pendingReadBy(ins);
      std::vector<bool> needed = heldBackNeededBy(ins);
      const bool waits_on_something = !comms.empty() || std::find(needed.begin(), needed.end(), true) != needed.end();
      if (waits_on_something && flow_.isView(ins)) {
        held_.push_back({ins, std::move(comms)});
        continue;
      }
      release(needed);
      for (int c : comms) waitFor(c);
      program_.push_back(ins);
      if (ins.kind == Instruction::Kind::PostCommunication) pending_.push_back(ins.index);
    }
    for (int c : std::vector<int>(pending_)) waitFor(c);
    release(std::vector<bool>(held_.size(), true));
    return std::move(program_);
  }

 private:
  // A view held back, with the posted communications whose results it reads directly.
  struct Held {
    Instruction ins;
    std::vector<int> comms;
  };

  std::vector<int> pendingReadBy(const Instruction& ins) const {
    std::vector<int> comms;
    for (int c : pending_)
      if (flow_.reads(ins, hic_.communications[c].out)) comms.push_back(c);
    return comms;
  }

  // Which held-back views `ins` needs, with the held-back views those read in turn.
  std::vector<bool> heldBackNeededBy(const Instruction& ins) const {
    std::vector<bool> needed(held_.size(), false);
    for (size_t h = held_.size(); h-- > 0;) {
      needed[h] = flow_.readsResultOf(ins, held_[h].ins);
      for (size_t later = h + 1; !needed[h] && later < held_.size(); ++later)
        needed[h] = needed[later] && flow_.readsResultOf(held_[later].ins, held_[h].ins);
    }
    return needed;
  }

  // Emits the held-back views marked in `which`, in their order, each after the waits it needs.
  void release(const std::vector<bool>& which) {
    std::vector<Held> kept;
    for (size_t h = 0; h < held_.size(); ++h) {
      if (!which[h]) {
        kept.push_back(std::move(held_[h]));
        continue;
      }
      for (int c : held_[h].comms) waitFor(c);
      program_.push_back(held_[h].ins);
    }
    held_ = std::move(kept);
  }

  void waitFor(int communication) {
    auto it = std::find(pending_.begin(), pending_.end(), communication);
    if (it == pending_.end()) return;  // already waited for
    program_.push_back(Instruction{Instruction::Kind::Wait, communication});
    pending_.erase(it);
  }

  const HostIrContainer& hic_;
  Dataflow flow_;
  std::vector<Instruction> program_;
  std::vector<int> pending_;  // communications posted and not yet waited for
  std::vector<Held> held_;
};

}  // namespace

void placeWaits(HostIrContainer& hic) { hic.program = WaitPlacer(hic).place(); }

}  // namespace meshfuse
