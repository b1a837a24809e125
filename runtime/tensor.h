// Tensor: a strided view (dtype, shape, strides in elements, byte offset) onto shared storage.
// Storage comes from an Allocator (CPU now, CUDA in runtime/cuda/) or wraps external memory
// (DLPack import) with the deleter that gives it back.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace meshfuse {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string toString() const;
  static Device cpu() { return {}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

// The process-wide CPU allocator (64-byte aligned, so vector loads never split cache lines).
Allocator* cpuAllocator();
// The allocator for a device; CUDA devices need a build with CUDA (else std::runtime_error).
Allocator* allocatorFor(Device device);
// Copies `bytes` between host and device memory (either side may be CUDA); provided by the CUDA
// runtime (runtime/cuda/), absent (nullptr) in a build without CUDA. Synchronous.
void cudaCopyBytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes)
    __attribute__((weak));

// Bytes currently allocated through cpuAllocator() (for leak tests).
int64_t cpuBytesInUse();

class Storage {
 public:
  Storage(void* data, size_t bytes, Device device, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void(void*)> release_;
};

std::vector<int64_t> contiguousStrides(const std::vector<int64_t>& shape);
int64_t numelOf(const std::vector<int64_t>& shape);
std::string shapeToString(const std::vector<int64_t>& shape);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, int64_t byte_offset, DataType dtype, std::vector<int64_t> shape,
         std::vector<int64_t> strides);

  static Tensor empty(const std::vector<int64_t>& shape, DataType dtype, Device device = Device::cpu());
  static Tensor zeros(const std::vector<int64_t>& shape, DataType dtype, Device device = Device::cpu());
  // Wraps memory owned elsewhere; `release` runs when the last view of it is gone.
  static Tensor fromBlob(void* data, DataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                         Device device, std::function<void(void*)> release);

  bool defined() const { return storage_ != nullptr; }
  DataType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const { return shape_.at(static_cast<size_t>(axis)); }
  int64_t numel() const { return numelOf(shape_); }
  size_t itemsize() const { return dataTypeSize(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  void* data() const;
  template <typename T>
  T* dataAs() const {
    return static_cast<T*>(data());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  int64_t byteOffset() const { return byte_offset_; }

  bool isContiguous() const;
  // Views (no copy).
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor slice(int64_t axis, int64_t start, int64_t length) const;
  Tensor expand(const std::vector<int64_t>& shape) const;  // stride 0 on size-1 axes
  Tensor view(const std::vector<int64_t>& shape) const;    // contiguous only
  // Copies.
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;
  // Copies src into this tensor (same shape; any strides; dtype conversion). CUDA tensors on either
  // side go through cudaCopyTensor (a CUDA build).
  void copyFrom(const Tensor& src);
  Tensor to(DataType dtype) const;
  // A copy on `device` (itself when already there). CPU<->CUDA needs a CUDA build.
  Tensor to(Device device) const;
  // Reads element i of the logical (row-major) order, converted to double: for tests and debug.
  double item(int64_t linear_index) const;

  std::string toString() const;  // "Float[4, 8] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t byte_offset_ = 0;
  DataType dtype_ = DataType::Float;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
};

// Copies `src` into `dst` (same shape, any strides and dtypes) when either is a CUDA tensor: a
// strided copy kernel on the current stream, staged through the host for a CPU side (then
// synchronous). Provided by runtime/cuda/, absent (nullptr) in a build without CUDA.
void cudaCopyTensor(const Tensor& dst, const Tensor& src) __attribute__((weak));

}  // namespace meshfuse
