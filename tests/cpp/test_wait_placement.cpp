// Where a host program waits for its communications (host_ir/wait_placement.h), on hand-built
// programs: the wait goes before the first instruction that needs the result, views of the result
// are held back with it (a chain of them in order), work that needs none of it runs in between,
// and posts keep their order.
#include <gtest/gtest.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "host_ir/wait_placement.h"

namespace meshfuse {
namespace {

// A program under construction: values are named by letter, each instruction by a short token in
// the order placeWaits leaves them ("post0", "wait0", "view:c", "matmul:y", "slice:s").
class ProgramBuilder {
 public:
  TensorView* value() { return fusion_.newTensor(DataType::Float, {4, 4}); }

  void launch(Segment::Kind kind, std::vector<TensorView*> inputs, TensorView* output) {
    Segment seg;
    seg.kind = kind;
    seg.inputs.assign(inputs.begin(), inputs.end());
    seg.outputs = {output};
    hic_.segments.push_back(seg);
    hic_.program.push_back(Instruction{Instruction::Kind::LaunchSegment, static_cast<int>(hic_.segments.size()) - 1});
    names_[output] = (kind == Segment::Kind::View     ? "view:"
                      : kind == Segment::Kind::Matmul ? "matmul:"
                                                      : "norm:") +
                     std::to_string(names_.size());
  }
  void post(TensorView* in, TensorView* out) {
    Communication c;
    c.type = Communication::Type::Allreduce;
    c.in = in;
    c.out = out;
    hic_.communications.push_back(c);
    hic_.program.push_back(
        Instruction{Instruction::Kind::PostCommunication, static_cast<int>(hic_.communications.size()) - 1});
  }
  void slice(TensorView* in, TensorView* out) {
    Instruction ins{Instruction::Kind::LocalSlice};
    ins.in = in;
    ins.out = out;
    hic_.program.push_back(ins);
    names_[out] = "slice:" + std::to_string(names_.size());
  }

  // The placed program, one token an instruction.
  std::vector<std::string> placed() {
    placeWaits(hic_);
    std::vector<std::string> out;
    for (const Instruction& ins : hic_.program) {
      switch (ins.kind) {
        case Instruction::Kind::PostCommunication: out.push_back("post" + std::to_string(ins.index)); break;
        case Instruction::Kind::Wait: out.push_back("wait" + std::to_string(ins.index)); break;
        case Instruction::Kind::LaunchSegment: out.push_back(names_.at(hic_.segments[ins.index].outputs[0])); break;
        default: out.push_back(names_.at(ins.out)); break;
      }
    }
    return out;
  }
  const std::string& nameOf(TensorView* tv) const { return names_.at(tv); }

 private:
  Fusion fusion_;
  HostIrContainer hic_;
  std::unordered_map<const TensorView*, std::string> names_;
};

using Tokens = std::vector<std::string>;

TEST(WaitPlacement, TheWaitGoesPastWorkThatDoesNotNeedTheResult) {
  // The tensor-parallel backward: an input-gradient GEMM's allreduce, a reshape of its result, the
  // weight-gradient GEMM (independent), then the normalization backward that reads the reshape.
  ProgramBuilder p;
  TensorView *partial = p.value(), *sum = p.value(), *reshaped = p.value(), *a = p.value(), *grad_w = p.value(),
             *norm = p.value();
  p.post(partial, sum);
  p.launch(Segment::Kind::View, {sum}, reshaped);
  p.launch(Segment::Kind::Matmul, {a}, grad_w);
  p.launch(Segment::Kind::Normalization, {reshaped, grad_w}, norm);
  EXPECT_EQ(p.placed(), (Tokens{"post0", p.nameOf(grad_w), "wait0", p.nameOf(reshaped), p.nameOf(norm)}));
}

TEST(WaitPlacement, AChainOfViewsIsHeldBackInOrder) {
  ProgramBuilder p;
  TensorView *in = p.value(), *sum = p.value(), *v1 = p.value(), *v2 = p.value(), *w = p.value(), *x = p.value(),
             *y = p.value();
  p.post(in, sum);
  p.launch(Segment::Kind::View, {sum}, v1);
  p.launch(Segment::Kind::View, {v1}, v2);
  p.launch(Segment::Kind::View, {x}, w);  // a view of something else: not held
  p.launch(Segment::Kind::Matmul, {v2}, y);
  EXPECT_EQ(p.placed(), (Tokens{"post0", p.nameOf(w), "wait0", p.nameOf(v1), p.nameOf(v2), p.nameOf(y)}));
}

TEST(WaitPlacement, OnlyTheCommunicationsAReaderNeedsAreWaitedFor) {
  ProgramBuilder p;
  TensorView *in0 = p.value(), *out0 = p.value(), *in1 = p.value(), *out1 = p.value(), *v0 = p.value(), *v1 = p.value(),
             *y = p.value();
  p.post(in0, out0);
  p.post(in1, out1);
  p.launch(Segment::Kind::View, {out0}, v0);
  p.launch(Segment::Kind::View, {out1}, v1);
  p.launch(Segment::Kind::Matmul, {v1}, y);  // needs the second only
  // The first and its view wait to the end, where what was posted is waited for in posting order.
  EXPECT_EQ(p.placed(), (Tokens{"post0", "post1", "wait1", p.nameOf(v1), p.nameOf(y), "wait0", p.nameOf(v0)}));
}

TEST(WaitPlacement, APostThatReadsAHeldViewReleasesIt) {
  ProgramBuilder p;
  TensorView *in = p.value(), *sum = p.value(), *v = p.value(), *gathered = p.value(), *x = p.value(), *y = p.value();
  p.post(in, sum);
  p.launch(Segment::Kind::View, {sum}, v);
  p.launch(Segment::Kind::Matmul, {x}, y);
  p.post(v, gathered);
  EXPECT_EQ(p.placed(), (Tokens{"post0", p.nameOf(y), "wait0", p.nameOf(v), "post1", "wait1"}));
}

TEST(WaitPlacement, ALocalSliceOfTheResultIsHeldBackLikeAView) {
  ProgramBuilder p;
  TensorView *in = p.value(), *out = p.value(), *s = p.value(), *x = p.value(), *y = p.value(), *z = p.value();
  p.post(in, out);
  p.slice(out, s);
  p.launch(Segment::Kind::Matmul, {x}, y);
  p.launch(Segment::Kind::Normalization, {s}, z);
  EXPECT_EQ(p.placed(), (Tokens{"post0", p.nameOf(y), "wait0", p.nameOf(s), p.nameOf(z)}));
}

TEST(WaitPlacement, WorkThatReadsTheResultIsNotMovedPastWhatFollowsIt) {
  // Only views are held: a GEMM that reads the result waits for it where it stands, and the
  // independent GEMM after it stays after it.
  ProgramBuilder p;
  TensorView *in = p.value(), *out = p.value(), *y = p.value(), *x = p.value(), *z = p.value();
  p.post(in, out);
  p.launch(Segment::Kind::Matmul, {out}, y);
  p.launch(Segment::Kind::Matmul, {x}, z);
  EXPECT_EQ(p.placed(), (Tokens{"post0", "wait0", p.nameOf(y), p.nameOf(z)}));
}

}  // namespace
}  // namespace meshfuse
