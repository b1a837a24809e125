// Finds the pointwise exprs after a matmul that its GEMM can apply as an epilogue (cuBLASLt's
// GELU_AUX_BIAS and DGELU): the tanh GELU of a linear's result, and the backward's product of a
// matmul's result with the tanh GELU's derivative at a saved input. Folding them into the Matmul
// segment saves the pass that reads the product back and writes the activation (on the GPT-3
// layer, a [2048 x 49152] bf16 tensor in each direction, forward and backward).
#pragma once
#include <functional>
#include <unordered_map>
#include <vector>

#include "runtime/segment.h"

namespace meshfuse {

struct EpilogueFold {
  MatmulEpilogue epilogue;
  // The exprs the epilogue stands for, in definition order: a reshape of the product (GeluTanhGrad
  // only) and the pointwise chain ending in epilogue.result.
  std::vector<const Expr*> exprs;
};

// By matmul/linear expr. `local(e)`: e is live, runs on this rank and posts no communication (the
// lowering leaves out resharding sets and exprs its stream loops absorb). A chain is folded only
// when its intermediate values are read by nothing else and are not fusion outputs, and when
// everything else it reads exists before the matmul (the chain moves up to the matmul).
std::unordered_map<const Expr*, EpilogueFold> findMatmulEpilogues(const Fusion& fusion,
                                                                  const std::function<bool(const Expr*)>& local);

}  // namespace meshfuse
