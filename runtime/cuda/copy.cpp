// Tensor copies that involve CUDA tensors (the cudaCopyTensor hook of runtime/tensor.h): a strided,
// converting copy is a one-op pointwise program (Set or Cast) run by the generated kernels; a CPU
// side is staged through a contiguous host tensor of the source's dtype. A same-dtype copy whose
// last axis is contiguous takes the vectorized kernel of strided_copy.h instead.
#include "runtime/cuda/pointwise_kernel.h"
#include "runtime/cuda/strided_copy.h"
#include "runtime/tensor.h"

namespace meshfuse {

namespace {
void deviceToDevice(const Tensor& dst, const Tensor& src) {
  if (cuda::tryVectorizedCopy(dst, src)) return;
  cuda::PointwiseProgram program;
  program.inputs = {src.dtype()};
  program.instrs.push_back({src.dtype() == dst.dtype() ? OpType::Set : OpType::Cast,
                            {{cuda::PointwiseProgram::Operand::Kind::Input, 0, 0, src.dtype()}},
                            dst.dtype()});
  program.outputs = {0};
  cuda::runPointwise(dst.device().index, program, {src}, {}, {dst});
}
}  // namespace

void cudaCopyTensor(const Tensor& dst, const Tensor& src) {
  if (src.shape() != dst.shape())
    throw std::invalid_argument("copy: shape " + shapeToString(src.shape()) + " into " + shapeToString(dst.shape()));
  if (dst.numel() == 0) return;
  const Device sd = src.device(), dd = dst.device();
  if (sd.type == DeviceType::CUDA && dd.type == DeviceType::CUDA) {
    if (sd == dd) return deviceToDevice(dst, src);
    // Across devices: a dense copy of the source lands on the destination device first.
    Tensor staged = Tensor::empty(src.shape(), src.dtype(), dd);
    Tensor dense = src.contiguous();
    cudaCopyBytes(staged.data(), dd, dense.data(), sd, dense.nbytes());
    return deviceToDevice(dst, staged);
  }
  if (sd.type == DeviceType::CPU) {  // host -> device
    Tensor host = src.contiguous();
    if (dst.isContiguous() && dst.dtype() == src.dtype()) {
      cudaCopyBytes(dst.data(), dd, host.data(), sd, host.nbytes());
      return;
    }
    Tensor staged = Tensor::empty(src.shape(), src.dtype(), dd);
    cudaCopyBytes(staged.data(), dd, host.data(), sd, host.nbytes());
    return deviceToDevice(dst, staged);
  }
  // device -> host
  Tensor dense = src.contiguous();
  if (dst.isContiguous() && dst.dtype() == src.dtype()) {
    cudaCopyBytes(dst.data(), dd, dense.data(), sd, dense.nbytes());
    return;
  }
  Tensor host = Tensor::empty(src.shape(), src.dtype(), Device::cpu());
  cudaCopyBytes(host.data(), Device::cpu(), dense.data(), sd, dense.nbytes());
  Tensor target = dst;  // a handle onto the same storage
  target.copyFrom(host);
}

}  // namespace meshfuse
