// Sharding propagation and resharding insertion: rewrites a user's fusion into one where every
// compute expr is local (its inputs are sharded consistently with its output on one mesh) and
// every movement of data is a `set` between two shardings (or meshes) that changes one thing:
// those sets are the resharding exprs that HostIrLower turns into communications.
#pragma once
#include <memory>
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

// Propagates shardings to unannotated tensors and inserts resharding sets. Throws UserError for
// shardings that cannot be reconciled, naming both tensors and their shardings.
ReshardedFusion insertResharding(const Fusion& fusion);

// A set whose input and output differ in mesh or sharding.
bool isResharding(const Expr* e);

}  // namespace meshfuse
