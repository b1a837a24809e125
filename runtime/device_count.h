// How many CUDA devices this process sees, for code outside runtime/cuda/ (the Communicator's
// choice of backend for `auto`): 0 in a build without CUDA or on a machine without a GPU. The
// CUDA runtime installs the counter when libmeshfuse loads.
#pragma once

namespace meshfuse {

int cudaDeviceCountOrZero();
bool registerCudaDeviceCounter(int (*counter)());

}  // namespace meshfuse
