// Launching a generated pointwise kernel on device tensors: picks the variant (contiguous and
// vectorized, or strided over the coalesced iteration shape), fetches the cached kernel and
// enqueues it on the device's current stream.
#pragma once
#include <string>
#include <vector>

#include "runtime/cuda/pointwise_codegen.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// Inputs and outputs broadcast (numpy rules) to one iteration shape; outputs are preallocated on
// `device`. An output smaller than the iteration shape receives the same value several times.
// `random`: one RandomIndex per random instr of the program, in order (none: identity).
// `program_key`: program.key() where the caller keeps it (a cached program's), else computed here.
void runPointwise(int device, const PointwiseProgram& program, const std::vector<Tensor>& inputs,
                  const std::vector<double>& scalars, const std::vector<Tensor>& outputs,
                  const std::vector<RandomIndex>& random = {}, const std::string& program_key = {});

// The variant runPointwise would choose for these tensors (exposed for tests and benchmarks).
PointwiseVariant choosePointwiseVariant(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                                        const std::vector<RandomIndex>& random = {});

}  // namespace meshfuse::cuda
