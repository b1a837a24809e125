// The sharding of a TensorView per mesh dimension: Shard(axis), Replicate, or Partial, read off
// its loop domain, plus the arithmetic that turns global extents into a rank's local extents.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace meshfuse {

constexpr int kMeshDims = 3;  // mesh_x, mesh_y, mesh_z

struct Sharding {
  std::array<int, kMeshDims> axis{-1, -1, -1};  // sharded logical axis along mesh_x/y/z, -1 = none
  std::array<bool, kMeshDims> partial{false, false, false};
  bool operator==(const Sharding&) const = default;
  bool isReplicated(int dim) const { return axis[dim] < 0 && !partial[dim]; }
  bool isPartial() const { return partial[0] || partial[1] || partial[2]; }  // along any mesh dim
  std::string toString(int dim) const;                                       // "Shard(1)", "Replicate", "Partial"
  std::string toString() const;                                              // over all dims, e.g. "{mesh_x: Shard(0)}"
};

Sharding shardingOf(const TensorView* tv);
// Sets tv's mesh and a loop domain that realizes `s` (outer splits parallelized on mesh dims).
void applySharding(TensorView* tv, const DeviceMesh& mesh, const Sharding& s);

// Throws UserError when `tv` is parallelized on a mesh dimension but has no device mesh.
void checkHasDeviceMesh(const TensorView* tv);
// The error for logical `axis` (of `extent`) parallelized whole on `p` where the mesh has another
// number of devices along p: a whole axis puts one element on each device, so its extent must be
// that number; blocks come from outer_split(axis, devices) first.
std::string wholeAxisOnMeshError(const TensorView* tv, int64_t axis, int64_t extent, ParallelType p);
// Checks that every sharded axis of `tv` (with global `shape`) splits into as many parts as the
// mesh has devices along that dimension, evenly. Throws UserError naming tensor, axis, extent, mesh.
void checkShardable(const TensorView* tv, const std::vector<int64_t>& shape);
// The extents this device holds (global extents divided along sharded axes). Partial tensors hold
// the full extent.
std::vector<int64_t> localShape(const TensorView* tv, const std::vector<int64_t>& global_shape);
// The inverse, used to recover global extents from an input's local shard.
std::vector<int64_t> globalShape(const TensorView* tv, const std::vector<int64_t>& local_shape);

}  // namespace meshfuse
