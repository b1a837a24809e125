#include "multidevice/device_mesh.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <stdexcept>

#include "ir/user_error.h"
#include "runtime/tensor.h"

namespace meshfuse {

std::string toString(ParallelType p) {
  switch (p) {
    case ParallelType::Serial: return "serial";
    case ParallelType::MeshX: return "mesh_x";
    case ParallelType::MeshY: return "mesh_y";
    case ParallelType::MeshZ: return "mesh_z";
    case ParallelType::Stream: return "stream";
  }
  return "?";
}

int meshAxisIndex(ParallelType p) {
  switch (p) {
    case ParallelType::MeshX: return 0;
    case ParallelType::MeshY: return 1;
    case ParallelType::MeshZ: return 2;
    default: throw UserError(toString(p) + " is not a mesh parallel type");
  }
}

ParallelType meshParallelType(int index) {
  static const ParallelType types[] = {ParallelType::MeshX, ParallelType::MeshY, ParallelType::MeshZ};
  return types[index];
}

DeviceMesh::DeviceMesh(const std::vector<int64_t>& devices)
    : DeviceMesh(devices, {static_cast<int64_t>(devices.size())}) {}

DeviceMesh::DeviceMesh(std::vector<int64_t> devices, std::vector<int64_t> shape)
    : devices_(std::move(devices)), shape_(std::move(shape)) {
  if (devices_.empty()) throw UserError("DeviceMesh: no devices");
  if (shape_.empty() || shape_.size() > 3)
    throw UserError("DeviceMesh: 1 to 3 dimensions, got " + std::to_string(shape_.size()));
  if (numelOf(shape_) != size())
    throw UserError("DeviceMesh: shape " + shapeToString(shape_) + " does not hold " + std::to_string(size()) +
                    " devices");
  std::set<int64_t> unique(devices_.begin(), devices_.end());
  if (unique.size() != devices_.size()) throw UserError("DeviceMesh: a device appears twice in " + toString());
  for (int64_t d : devices_)
    if (d < 0) throw UserError("DeviceMesh: negative device id " + std::to_string(d));
}

bool DeviceMesh::has(int64_t device) const { return indexOf(device) >= 0; }

int64_t DeviceMesh::indexOf(int64_t device) const {
  auto it = std::find(devices_.begin(), devices_.end(), device);
  return it == devices_.end() ? -1 : it - devices_.begin();
}

int64_t DeviceMesh::dimOf(ParallelType p) const {
  int64_t from_last = meshAxisIndex(p);
  return from_last < rank() ? rank() - 1 - from_last : -1;
}

int64_t DeviceMesh::size(ParallelType p) const {
  int64_t d = dimOf(p);
  return d < 0 ? 1 : shape_[d];
}

int64_t DeviceMesh::coordinate(int64_t device, ParallelType p) const {
  int64_t index = indexOf(device);
  if (index < 0) throw UserError("device " + std::to_string(device) + " is not in " + toString());
  int64_t d = dimOf(p);
  if (d < 0) return 0;
  int64_t stride = 1;
  for (int64_t i = rank() - 1; i > d; --i) stride *= shape_[i];
  return (index / stride) % shape_[d];
}

std::vector<int64_t> DeviceMesh::team(int64_t device, ParallelType p) const {
  int64_t index = indexOf(device);
  if (index < 0) throw UserError("device " + std::to_string(device) + " is not in " + toString());
  int64_t d = dimOf(p);
  if (d < 0) return {device};
  int64_t stride = 1;
  for (int64_t i = rank() - 1; i > d; --i) stride *= shape_[i];
  int64_t base = index - ((index / stride) % shape_[d]) * stride;
  std::vector<int64_t> team;
  for (int64_t c = 0; c < shape_[d]; ++c) team.push_back(devices_[base + c * stride]);
  return team;
}

std::vector<int64_t> DeviceMesh::team(int64_t device, const std::vector<ParallelType>& ps) const {
  if (indexOf(device) < 0) throw UserError("device " + std::to_string(device) + " is not in " + toString());
  auto spanned = [&](ParallelType p) { return std::find(ps.begin(), ps.end(), p) != ps.end(); };
  std::vector<int64_t> team;
  for (int64_t other : devices_) {
    bool same_elsewhere = true;
    for (ParallelType p : {ParallelType::MeshX, ParallelType::MeshY, ParallelType::MeshZ})
      same_elsewhere = same_elsewhere && (spanned(p) || coordinate(other, p) == coordinate(device, p));
    if (same_elsewhere) team.push_back(other);
  }
  return team;
}

int64_t DeviceMesh::maxDevice() const { return *std::max_element(devices_.begin(), devices_.end()); }

std::string DeviceMesh::toString() const {
  std::ostringstream os;
  os << "DeviceMesh{";
  for (size_t i = 0; i < devices_.size(); ++i) os << (i ? " " : "") << devices_[i];
  os << "}";
  if (shape_.size() > 1) os << shapeToString(shape_);
  return os.str();
}

}  // namespace meshfuse
