// HostIrLower: one instance per lowering. Turns a resharded fusion (multidevice/resharding.h),
// with every TensorView's global shape bound, into this rank's HostIrContainer: compute exprs are
// grouped into segments, resharding sets become Communications (DESIGN.md's table) or local slices.
#pragma once
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "host_ir/fusion_executor.h"
#include "host_ir/host_ir.h"
#include "host_ir/matmul_epilogue.h"

namespace meshfuse {

using GlobalShapes = std::unordered_map<const Val*, std::vector<int64_t>>;

class HostIrLower {
 public:
  explicit HostIrLower(HostIrLowerParams params) : params_(params) {}
  std::unique_ptr<HostIrContainer> lower(const Fusion& resharded, const GlobalShapes& shapes, int64_t rank,
                                         Device device);

 private:
  void findStreamLoops(const Fusion& fusion, const GlobalShapes& shapes);
  void findEpilogues(const Fusion& fusion);
  void lowerMatmulWithEpilogue(const Expr* matmul, const EpilogueFold& fold);
  void findNormalizationSegments(const Fusion& fusion);
  void lowerNormalization(const std::vector<const Expr*>& exprs);
  void launchClosedSegment(Segment seg);
  void recordRandomBlocks(const GlobalShapes& shapes);
  void lowerStreamLoop(const Expr* matmul, const Expr* set, StreamLoop::Kind kind);
  void lowerCompute(const Expr* e);
  bool viewsAheadOfOpenPointwise(const Expr* e) const;
  void lowerResharding(const Expr* e);
  void finishSegments(const Fusion& fusion);
  HostIrLowerParams params_;
  CommunicatorBackend backend_ = CommunicatorBackend::Mpi;
  std::unique_ptr<HostIrContainer> hic_;
  bool lowering_stream_loop_ = false;  // lowerResharding called for a stream loop's communication
  int open_pointwise_ = -1;            // the pointwise segment the next pointwise expr may join
  // Stream-parallel pairs found by findStreamLoops: the expr at which the loop is emitted, the
  // matmul and the resharding set it absorbs.
  struct LoopPlan {
    const Expr* matmul;
    const Expr* set;
    StreamLoop::Kind kind;
    int64_t chunks;
  };
  std::unordered_map<const Expr*, LoopPlan> loop_at_;
  std::unordered_map<const Expr*, bool> absorbed_;
  // Matmuls that end in an epilogue (by the matmul) and the exprs those epilogues absorb.
  std::unordered_map<const Expr*, EpilogueFold> epilogue_at_;
  std::unordered_set<const Expr*> in_epilogue_;
  // Runs of exprs that form one normalization segment, by their first expr; the others are skipped.
  std::unordered_map<const Expr*, std::vector<const Expr*>> normalization_at_;
  std::unordered_map<const Expr*, bool> in_normalization_;
};

// Forward shape inference over `fusion` from the inputs' global shapes; UserError on a mismatch.
GlobalShapes bindShapes(const Fusion& fusion, const GlobalShapes& input_shapes);

}  // namespace meshfuse
