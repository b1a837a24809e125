// The merging of adjacent view segments (host_ir/view_merging.h) on a hand-built program: a run of
// views becomes one segment whose outputs are the values read outside it, a wait between two views
// keeps them apart, and the segments the program names are renumbered.
#include <gtest/gtest.h>

#include <algorithm>

#include "host_ir/view_merging.h"
#include "ops/ops.h"

namespace meshfuse {
namespace {

Segment segmentOf(Segment::Kind kind, std::vector<const Expr*> exprs) {
  Segment seg;
  seg.kind = kind;
  seg.exprs = std::move(exprs);
  seg.inputs = inputsOf(seg.exprs);
  for (const Expr* e : seg.exprs) seg.outputs.push_back(e->out());
  return seg;
}

bool has(const std::vector<TensorView*>& values, const TensorView* v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

TEST(ViewMerging, ARunOfViewsIsOneSegmentAndAWaitKeepsViewsApart) {
  Fusion f;
  TensorView* x = f.newTensor(DataType::Float, {4, 6});
  f.addInput(x);
  TensorView* a = ops::permute(x, {1, 0});  // read only by b: not an output once merged
  TensorView* b = ops::reshape(a, {24});    // read by the communication and the pointwise op
  TensorView* c = ops::set(b);              // a communication's result
  TensorView* d = ops::permute(ops::reshape(c, {6, 4}), {1, 0});
  TensorView* e = ops::binary(OpType::Add, d, ops::reshape(b, {4, 6}));
  f.addOutput(e);
  const auto expr = [](const TensorView* tv) { return static_cast<const Expr*>(tv->definition()); };
  const TensorView* c_reshaped = static_cast<const TensorView*>(expr(d)->input(0));
  const TensorView* b_reshaped = static_cast<const TensorView*>(expr(e)->input(1));

  HostIrContainer hic;
  hic.segments = {
      segmentOf(Segment::Kind::View, {expr(a)}),          segmentOf(Segment::Kind::View, {expr(b)}),
      segmentOf(Segment::Kind::View, {expr(b_reshaped)}), segmentOf(Segment::Kind::View, {expr(c_reshaped)}),
      segmentOf(Segment::Kind::View, {expr(d)}),          segmentOf(Segment::Kind::Pointwise, {expr(e)})};
  Communication comm;
  comm.type = Communication::Type::Allreduce;
  comm.in = b;
  comm.out = c;
  hic.communications = {comm};
  using K = Instruction::Kind;
  hic.program = {{K::LaunchSegment, 0}, {K::LaunchSegment, 1}, {K::PostCommunication, 0}, {K::LaunchSegment, 2},
                 {K::Wait, 0},          {K::LaunchSegment, 3}, {K::LaunchSegment, 4},     {K::LaunchSegment, 5}};

  mergeAdjacentViews(f, hic);

  ASSERT_EQ(hic.segments.size(), 4u) << hic.toString();
  ASSERT_EQ(hic.program.size(), 6u) << hic.toString();
  const std::vector<K> kinds{K::LaunchSegment, K::PostCommunication, K::LaunchSegment,
                             K::Wait,          K::LaunchSegment,     K::LaunchSegment};
  for (size_t i = 0; i < kinds.size(); ++i) EXPECT_EQ(hic.program[i].kind, kinds[i]) << i << "\n" << hic.toString();
  // Views 0 and 1 merged: a is used inside only; b leaves for the communication and a later view.
  const Segment& first = hic.segments[hic.program[0].index];
  EXPECT_EQ(first.exprs.size(), 2u);
  EXPECT_FALSE(has(first.outputs, a));
  EXPECT_TRUE(has(first.outputs, b));
  EXPECT_EQ(first.inputs, std::vector<Val*>{x});
  // The view after the post stays alone (the post sits between), the two after the wait merge.
  EXPECT_EQ(hic.segments[hic.program[2].index].exprs.size(), 1u);
  const Segment& after_wait = hic.segments[hic.program[4].index];
  EXPECT_EQ(after_wait.exprs.size(), 2u);
  EXPECT_EQ(after_wait.outputs, std::vector<TensorView*>{d});
  EXPECT_EQ(hic.segments[hic.program[5].index].kind, Segment::Kind::Pointwise);
  for (const Instruction& ins : hic.program)
    if (ins.kind == K::LaunchSegment) EXPECT_LT(ins.index, static_cast<int>(hic.segments.size()));
}

}  // namespace
}  // namespace meshfuse
