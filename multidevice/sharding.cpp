#include "multidevice/sharding.h"

#include "runtime/tensor.h"

namespace meshfuse {

std::string Sharding::toString(int dim) const {
  if (partial[dim]) return "Partial";
  if (axis[dim] >= 0) return "Shard(" + std::to_string(axis[dim]) + ")";
  return "Replicate";
}

std::string Sharding::toString() const {
  std::string s = "{";
  for (int d = 0; d < kMeshDims; ++d) {
    if (isReplicated(d)) continue;
    if (s.size() > 1) s += ", ";
    s += meshfuse::toString(meshParallelType(d)) + ": " + toString(d);
  }
  return s == "{" ? "Replicate" : s + "}";
}

Sharding shardingOf(const TensorView* tv) {
  Sharding s;
  for (int d = 0; d < kMeshDims; ++d) {
    ParallelType p = meshParallelType(d);
    s.axis[d] = tv->shardedAxis(p);
    s.partial[d] = tv->isPartial(p);
  }
  return s;
}

void applySharding(TensorView* tv, const DeviceMesh& mesh, const Sharding& s) {
  tv->setDeviceMesh(mesh);
  std::vector<LoopAxis> loop;
  for (int a = 0; a < tv->ndim(); ++a) {
    int dim = -1;
    for (int d = 0; d < kMeshDims; ++d)
      if (s.axis[d] == a) dim = d;
    if (dim < 0) {
      loop.push_back(LoopAxis{a});
      continue;
    }
    ParallelType p = meshParallelType(dim);
    int64_t parts = mesh.size(p);
    loop.push_back(LoopAxis{a, LoopAxis::Part::Outer, parts, true, p});
    loop.push_back(LoopAxis{a, LoopAxis::Part::Inner, parts, true});
  }
  tv->setLoop(loop);
  for (int d = 0; d < kMeshDims; ++d) tv->setPartial(meshParallelType(d), s.partial[d]);
}

void checkHasDeviceMesh(const TensorView* tv) {
  if (tv->isSharded() && !tv->hasDeviceMesh())
    throw UserError(tv->name() + " is parallelized on a mesh dimension but has no device mesh (call set_device_mesh)");
}

std::string wholeAxisOnMeshError(const TensorView* tv, int64_t axis, int64_t extent, ParallelType p) {
  const DeviceMesh& mesh = *tv->deviceMesh();
  const std::string a = std::to_string(axis), devices = std::to_string(mesh.size(p));
  return tv->name() + " axis " + a + " (extent " + std::to_string(extent) + ") is parallelized whole on " +
         toString(p) + ", which puts one element on each device: its extent must be the " + devices + " devices of " +
         mesh.toString() + " along " + toString(p) + "; to shard it in blocks, outer_split(" + a + ", " + devices +
         ") it first";
}

void checkShardable(const TensorView* tv, const std::vector<int64_t>& shape) {
  if (!tv->isSharded()) return;
  checkHasDeviceMesh(tv);
  const DeviceMesh& mesh = *tv->deviceMesh();
  for (int d = 0; d < kMeshDims; ++d) {
    ParallelType p = meshParallelType(d);
    int axis = tv->shardedAxis(p);
    if (axis < 0) continue;
    int64_t extent = shape[axis];
    int64_t devices = mesh.size(p);
    if (d >= mesh.rank())
      throw UserError(tv->name() + " axis " + std::to_string(axis) + " is parallelized on " + toString(p) + " but " +
                      mesh.toString() + " has " + std::to_string(mesh.rank()) + " dimension(s)");
    for (const LoopAxis& la : tv->loop()) {
      if (la.parallel != p) continue;
      // A whole axis puts one element on each device (partsAlong gives its extent).
      if (la.part == LoopAxis::Part::Whole && extent != devices)
        throw UserError(wholeAxisOnMeshError(tv, axis, extent, p));
      if (la.part != LoopAxis::Part::Whole && extent % la.factor != 0)
        throw UserError(tv->name() + " axis " + std::to_string(axis) + " of extent " + std::to_string(extent) +
                        " does not split evenly by " + std::to_string(la.factor));
    }
    int64_t parts = tv->partsAlong(p, extent);
    if (parts != devices)
      throw UserError(tv->name() + " axis " + std::to_string(axis) + " (extent " + std::to_string(extent) +
                      ") is split into " + std::to_string(parts) + " parts along " + toString(p) + " but " +
                      mesh.toString() + " has " + std::to_string(devices) + " devices there");
    if (extent % devices != 0)
      throw UserError(tv->name() + " axis " + std::to_string(axis) + " of extent " + std::to_string(extent) +
                      " does not shard evenly over the " + std::to_string(devices) + " devices of " + mesh.toString());
  }
}

std::vector<int64_t> localShape(const TensorView* tv, const std::vector<int64_t>& global_shape) {
  std::vector<int64_t> local = global_shape;
  if (!tv->hasDeviceMesh()) return local;
  for (int d = 0; d < kMeshDims; ++d) {
    ParallelType p = meshParallelType(d);
    int axis = tv->shardedAxis(p);
    if (axis >= 0) local[axis] /= tv->deviceMesh()->size(p);
  }
  return local;
}

std::vector<int64_t> globalShape(const TensorView* tv, const std::vector<int64_t>& local_shape) {
  std::vector<int64_t> global = local_shape;
  if (!tv->hasDeviceMesh()) return global;
  for (int d = 0; d < kMeshDims; ++d) {
    ParallelType p = meshParallelType(d);
    int axis = tv->shardedAxis(p);
    if (axis >= 0 && axis < static_cast<int>(global.size())) global[axis] *= tv->deviceMesh()->size(p);
  }
  return global;
}

}  // namespace meshfuse
