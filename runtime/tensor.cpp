#include "runtime/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "runtime/cpu/strided_space.h"
#include "runtime/element.h"
#include "runtime/host_span.h"

namespace meshfuse {

std::string Device::toString() const { return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index); }

namespace {
std::atomic<int64_t> g_cpu_bytes{0};

// Freed blocks of 1 MiB or more are kept (up to 256 MiB in all, oldest dropped first) and handed
// out again for the same size: a program executed again gets its outputs without the page faults of
// fresh memory from the OS (first-touching a 64 MiB output costs about as much as writing it).
// Live bytes (cpuBytesInUse) count only blocks in use.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kMinCached = size_t{1} << 20, kMaxCachedBytes = size_t{256} << 20;

  void* allocate(size_t bytes) override {
    host_span::Scope span("host allocate");
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = rounded >= kMinCached ? takeCached(rounded) : nullptr;
    if (p == nullptr) p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    g_cpu_bytes += static_cast<int64_t>(bytes);
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    host_span::Scope span("host free");
    g_cpu_bytes -= static_cast<int64_t>(bytes);
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    if (rounded < kMinCached || rounded > kMaxCachedBytes) return std::free(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    while (cached_bytes_ + rounded > kMaxCachedBytes) {
      std::free(cache_.front().second);
      cached_bytes_ -= cache_.front().first;
      cache_.erase(cache_.begin());
    }
    cache_.emplace_back(rounded, ptr);
    cached_bytes_ += rounded;
  }
  Device device() const override { return Device::cpu(); }

 private:
  void* takeCached(size_t rounded) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = cache_.rbegin(); it != cache_.rend(); ++it) {
      if (it->first != rounded) continue;
      void* p = it->second;
      cached_bytes_ -= rounded;
      cache_.erase(std::next(it).base());
      return p;
    }
    return nullptr;
  }

  std::mutex mutex_;
  std::vector<std::pair<size_t, void*>> cache_;  // (rounded size, block), oldest first
  size_t cached_bytes_ = 0;
};
}  // namespace

Allocator* cpuAllocator() {
  // Never destroyed: tensors that outlive static destruction (a backend's scratch buffers,
  // released by the Communicator's atexit cleanup) still free through it (UBSan caught the call
  // on a destroyed allocator at exit).
  static Allocator* allocator = new CpuAllocator();
  return allocator;
}

int64_t cpuBytesInUse() { return g_cpu_bytes.load(); }

// Defined weakly here so that a build without CUDA links; runtime/cuda/ provides the real one.
Allocator* cudaAllocator(int device_index) __attribute__((weak));

Allocator* allocatorFor(Device device) {
  if (device.type == DeviceType::CPU) return cpuAllocator();
  if (cudaAllocator == nullptr)
    throw std::runtime_error("meshfuse was built without CUDA: no allocator for " + device.toString());
  return cudaAllocator(device.index);
}

Storage::Storage(void* data, size_t bytes, Device device, std::function<void(void*)> release)
    : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) release_(data_);
}

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  return strides;
}

int64_t numelOf(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

std::string shapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t byte_offset, DataType dtype, std::vector<int64_t> shape,
               std::vector<int64_t> strides)
    : storage_(std::move(storage)),
      byte_offset_(byte_offset),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)) {
  if (shape_.size() != strides_.size()) throw std::invalid_argument("Tensor: shape and strides differ in rank");
}

Tensor Tensor::empty(const std::vector<int64_t>& shape, DataType dtype, Device device) {
  for (int64_t e : shape)
    if (e < 0) throw std::invalid_argument("Tensor::empty: negative extent in " + shapeToString(shape));
  Allocator* allocator = allocatorFor(device);
  size_t bytes = static_cast<size_t>(numelOf(shape)) * dataTypeSize(dtype);
  void* p = allocator->allocate(bytes);
  auto owned =
      std::make_shared<Storage>(p, bytes, device, [allocator, bytes](void* q) { allocator->deallocate(q, bytes); });
  return Tensor(std::move(owned), 0, dtype, shape, contiguousStrides(shape));
}

Tensor Tensor::zeros(const std::vector<int64_t>& shape, DataType dtype, Device device) {
  if (device.type != DeviceType::CPU) return zeros(shape, dtype).to(device);  // zeros are rare off the host
  Tensor t = empty(shape, dtype, device);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::fromBlob(void* data, DataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                        Device device, std::function<void(void*)> release) {
  // Size of the span the view can touch, for Storage::bytes().
  int64_t span = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 0) span += (shape[i] - 1) * std::abs(strides[i]);
  auto borrowed =
      std::make_shared<Storage>(data, static_cast<size_t>(span) * dataTypeSize(dtype), device, std::move(release));
  return Tensor(std::move(borrowed), 0, dtype, std::move(shape), std::move(strides));
}

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

bool Tensor::isContiguous() const {
  if (numel() == 0) return true;  // no element to be out of place (a symbolic extent bound to 0)
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;  // any stride is fine for an extent of one
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  if (static_cast<int64_t>(dims.size()) != dim()) throw std::invalid_argument("permute: wrong number of dims");
  std::vector<int64_t> permuted_shape(dims.size()), permuted_strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i];
    if (d < 0 || d >= dim() || seen[d]) throw std::invalid_argument("permute: dims are not a permutation");
    seen[d] = true;
    permuted_shape[i] = shape_[d];
    permuted_strides[i] = strides_[d];
  }
  return Tensor(storage_, byte_offset_, dtype_, std::move(permuted_shape), std::move(permuted_strides));
}

Tensor Tensor::slice(int64_t axis, int64_t start, int64_t length) const {
  if (axis < 0 || axis >= dim() || start < 0 || length < 0 || start + length > shape_[axis])
    throw std::out_of_range("slice out of range");
  std::vector<int64_t> sliced_shape = shape_;
  sliced_shape[axis] = length;
  int64_t offset = byte_offset_ + start * strides_[axis] * static_cast<int64_t>(itemsize());
  return Tensor(storage_, offset, dtype_, std::move(sliced_shape), strides_);
}

Tensor Tensor::expand(const std::vector<int64_t>& shape) const {
  if (shape.size() != shape_.size()) throw std::invalid_argument("expand: rank differs");
  std::vector<int64_t> expanded_strides = strides_;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape_[i] == shape[i]) continue;
    if (shape_[i] != 1)
      throw std::invalid_argument("expand: extent " + std::to_string(shape_[i]) + " cannot broadcast");
    expanded_strides[i] = 0;
  }
  return Tensor(storage_, byte_offset_, dtype_, shape, std::move(expanded_strides));
}

Tensor Tensor::view(const std::vector<int64_t>& shape) const {
  if (!isContiguous()) throw std::invalid_argument("view: tensor is not contiguous");
  if (numelOf(shape) != numel()) throw std::invalid_argument("view: element count differs");
  return Tensor(storage_, byte_offset_, dtype_, shape, contiguousStrides(shape));
}

Tensor Tensor::contiguous() const {
  if (isContiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copyFrom(*this);
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  if (cudaCopyBytes == nullptr)
    throw std::runtime_error("meshfuse was built without CUDA: cannot move a tensor to " + target.toString());
  Tensor src = contiguous();
  if (src.device().type != DeviceType::CPU && !src.isContiguous())
    throw std::runtime_error("Tensor::to(device): non-contiguous device tensors are not supported");
  Tensor out = empty(shape_, dtype_, target);
  cudaCopyBytes(out.data(), target, src.data(), src.device(), src.nbytes());
  return out;
}

Tensor Tensor::to(DataType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device());
  out.copyFrom(*this);
  return out;
}

namespace {
// Calls f(dst_offset, src_offset) in elements for every logical index, innermost axis fastest.
template <typename F>
void forEachIndex(const std::vector<int64_t>& shape, const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                  F f) {
  const size_t n = shape.size();
  if (numelOf(shape) == 0) return;
  if (n == 0) {
    f(0, 0);
    return;
  }
  std::vector<int64_t> idx(n, 0);
  int64_t oa = 0, ob = 0;
  const int64_t inner = shape[n - 1], sa = a[n - 1], sb = b[n - 1];
  while (true) {
    for (int64_t i = 0; i < inner; ++i) f(oa + i * sa, ob + i * sb);
    int64_t d = static_cast<int64_t>(n) - 2;
    for (; d >= 0; --d) {
      oa += a[d];
      ob += b[d];
      if (++idx[d] < shape[d]) break;
      oa -= a[d] * shape[d];
      ob -= b[d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}
// n elements of sizeof(E) bytes from s (every sstride elements) to d (every dstride elements);
// each memcpy of a constant size compiles to one load and one store.
template <typename E>
void copyRun(char* d, int64_t dstride, const char* s, int64_t sstride, int64_t n) {
  constexpr auto kSize = static_cast<int64_t>(sizeof(E));
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * dstride * kSize, s + i * sstride * kSize, sizeof(E));
}

// A strided copy between tensors of one dtype: the axes are coalesced first (a permuted or sliced
// tensor is mostly runs of contiguous rows, copied with memcpy), then copied row by row.
void copySameType(char* d, const std::vector<int64_t>& dst_strides, const char* s,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& shape, int64_t size) {
  cpu::StridedSpace space{shape, {dst_strides, src_strides}};
  space.coalesce();
  if (space.rank() == 0) {
    std::memcpy(d, s, static_cast<size_t>(size));
    return;
  }
  const int64_t last = space.rank() - 1, n = space.shape[last];
  const int64_t ds = space.strides[0][last], ss = space.strides[1][last];
  const std::vector<int64_t> outer_shape(space.shape.begin(), space.shape.end() - 1);
  std::vector<int64_t> dst_outer(space.strides[0].begin(), space.strides[0].end() - 1);
  std::vector<int64_t> src_outer(space.strides[1].begin(), space.strides[1].end() - 1);
  forEachIndex(outer_shape, dst_outer, src_outer, [&](int64_t od, int64_t os) {
    char* dr = d + od * size;
    const char* sr = s + os * size;
    if (ds == 1 && ss == 1) {
      std::memcpy(dr, sr, static_cast<size_t>(n * size));
      return;
    }
    switch (size) {
      case 1: return copyRun<uint8_t>(dr, ds, sr, ss, n);
      case 2: return copyRun<uint16_t>(dr, ds, sr, ss, n);
      case 4: return copyRun<uint32_t>(dr, ds, sr, ss, n);
      case 8: return copyRun<uint64_t>(dr, ds, sr, ss, n);
      default:
        for (int64_t i = 0; i < n; ++i) std::memcpy(dr + i * ds * size, sr + i * ss * size, static_cast<size_t>(size));
    }
  });
}
}  // namespace

void Tensor::copyFrom(const Tensor& src) {
  if (src.shape() != shape_)
    throw std::invalid_argument("copyFrom: shape " + shapeToString(src.shape()) + " into " + shapeToString(shape_));
  if (device().type != DeviceType::CPU || src.device().type != DeviceType::CPU) {
    if (cudaCopyTensor == nullptr)
      throw std::runtime_error("meshfuse was built without CUDA: cannot copy " + src.toString() + " into " +
                               toString());
    cudaCopyTensor(*this, src);
    return;
  }
  if (src.dtype() == dtype_ && isContiguous() && src.isContiguous()) {
    std::memcpy(data(), src.data(), nbytes());
    return;
  }
  char* d = static_cast<char*>(data());
  const char* s = static_cast<const char*>(src.data());
  const int64_t dsz = static_cast<int64_t>(itemsize()), ssz = static_cast<int64_t>(src.itemsize());
  if (src.dtype() == dtype_) {
    copySameType(d, strides_, s, src.strides(), shape_, dsz);
    return;
  }
  const DataType sd = src.dtype();
  forEachIndex(shape_, strides_, src.strides(),
               [&](int64_t od, int64_t os) { storeFromDouble(d + od * dsz, dtype_, loadAsDouble(s + os * ssz, sd)); });
}

double Tensor::item(int64_t linear_index) const {
  if (device().type != DeviceType::CPU) throw std::runtime_error("item(): CPU tensors only");
  if (linear_index < 0 || linear_index >= numel())
    throw std::out_of_range("item(" + std::to_string(linear_index) + "): " + toString() + " has " +
                            std::to_string(numel()) + " elements");
  int64_t offset = 0, rem = linear_index;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    offset += (rem % shape_[d]) * strides_[d];
    rem /= shape_[d];
  }
  return loadAsDouble(static_cast<const char*>(data()) + offset * static_cast<int64_t>(itemsize()), dtype_);
}

std::string Tensor::toString() const {
  return meshfuse::toString(dtype_) + shapeToString(shape_) + " " + device().toString();
}

}  // namespace meshfuse
