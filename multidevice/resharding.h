// Sharding propagation and resharding insertion: rewrites a user's fusion into one where every
// compute expr is local (its inputs are sharded consistently with its output on one mesh) and
// every movement of data is a `set` between two shardings (or meshes) that changes one thing:
// those sets are the resharding exprs that HostIrLower turns into communications.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "multidevice/sharding.h"

namespace meshfuse {

struct ReshardedFusion {
  std::unique_ptr<Fusion> fusion;
  std::vector<Val*> from_original;  // original val id -> val of `fusion` (inputs/outputs at least)
};

// Whether any TensorView of `fusion` has a device mesh.
bool isMultiDevice(const Fusion& fusion);

// The global extents of a fusion's tensors once execute's inputs bind its symbolic (-1) extents
// (host_ir/lower.h's bindShapes computes them; the same type as its GlobalShapes).
using BoundShapes = std::unordered_map<const Val*, std::vector<int64_t>>;

// Propagates shardings to unannotated tensors and inserts resharding sets. Throws UserError for
// shardings that cannot be reconciled, naming both tensors and their shardings. `bound` gives the
// extents behind symbolic ones (a -1 bound to 1 broadcasts); tensors it lacks use their definition.
// What the executing device can compute that resharding may rely on.
struct ReshardingOptions {
  // A Half matmul or linear whose contraction is sharded computes its Partial product in float32,
  // reduced across ranks in float32 and rounded to Half once (a rank's Half partial past 65504 was
  // inf, and the sum inf or NaN). The CPU's matmul writes any output dtype; the CUDA one (cuBLASLt,
  // runtime/cuda/matmul.cpp) takes one dtype for inputs and output, so there the partials stay Half.
  bool float_half_products = false;
};

ReshardedFusion insertResharding(const Fusion& fusion, const BoundShapes& bound = {},
                                 const ReshardingOptions& options = {});

// A set whose input and output differ in mesh or sharding.
bool isResharding(const Expr* e);

}  // namespace meshfuse
