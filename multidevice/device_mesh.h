// DeviceMesh: an N-D (1 to 3) arrangement of device ids (= world ranks). mesh_x is the fastest
// varying (last) mesh dimension, mesh_y the one before, mesh_z the one before that: a [2, 4] mesh
// has mesh_y of size 2 and mesh_x of size 4, as threadIdx.x varies fastest in CUDA.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace meshfuse {

enum class ParallelType : uint8_t { Serial, MeshX, MeshY, MeshZ, Stream };
std::string toString(ParallelType p);
inline bool isMeshParallel(ParallelType p) {
  return p == ParallelType::MeshX || p == ParallelType::MeshY || p == ParallelType::MeshZ;
}
// MeshX -> 0, MeshY -> 1, MeshZ -> 2 (counted from the last mesh dimension).
int meshAxisIndex(ParallelType p);
ParallelType meshParallelType(int index);

class DeviceMesh {
 public:
  DeviceMesh() = default;
  explicit DeviceMesh(const std::vector<int64_t>& devices);  // 1-D
  DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape);

  const std::vector<int64_t>& devices() const { return devices_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  bool empty() const { return devices_.empty(); }
  bool has(int64_t device) const;
  int64_t indexOf(int64_t device) const;  // -1 when absent
  // The extent of the mesh dimension a parallel type uses (1 when the mesh has fewer dimensions).
  int64_t size(ParallelType p) const;
  // The coordinate of `device` along p's dimension.
  int64_t coordinate(int64_t device, ParallelType p) const;
  // The devices that differ from `device` only along p's dimension, in coordinate order: the team
  // of a communication along p.
  std::vector<int64_t> team(int64_t device, ParallelType p) const;
  // The devices that differ from `device` only along the dimensions of `ps`, in mesh order: the
  // team of one allreduce that resolves a value Partial along several mesh dimensions at once.
  std::vector<int64_t> team(int64_t device, const std::vector<ParallelType>& ps) const;
  int64_t maxDevice() const;

  bool operator==(const DeviceMesh& other) const = default;
  std::string toString() const;

 private:
  int64_t dimOf(ParallelType p) const;  // index into shape_, -1 when the mesh has no such dim
  std::vector<int64_t> devices_;
  std::vector<int64_t> shape_;
};

}  // namespace meshfuse
