// Sum / max / mean over any set of axes of a device tensor of any strides, by a generated kernel:
// a block per output when the reduced elements are contiguous (innermost reductions), a thread
// column per output with the reduction split over the block's second dimension otherwise (outer
// reductions, coalesced across outputs).
#pragma once
#include <string>
#include <vector>

#include "ir/ir.h"
#include "runtime/tensor.h"

namespace meshfuse::cuda {

// `out` is contiguous, with the kept axes in order (extent-1 axes for keepdim are allowed).
void runReduction(int device, OpType op, const Tensor& x, const std::vector<int64_t>& axes, const Tensor& out);

struct ReductionVariant {
  int kept_ndim = 1;
  int reduced_ndim = 1;
  bool row = true;  // block per output (contiguous reduced elements)
};
// The kernel's parameter block in 8-byte words: in, out, n_out, n_red, scale, then the kept axes'
// extents and strides and the reduced axes' extents and strides.
size_t reductionParamWords(const ReductionVariant& variant);
std::string generateReductionSource(OpType op, DataType in, DataType out, const ReductionVariant& variant,
                                    const std::string& kernel_name);

// The column kernel of a reduction over the rows of a [rows, cols] matrix with contiguous columns
// (a bias gradient): each thread sums `vec` adjacent columns from 16-byte loads, four rows in flight,
// and the rows are split over blockIdx.y so that narrow matrices still fill the GPU; with several
// splits the kernel writes [splits, cols] partial results in the accumulator's type and runs again
// over them. The generic column kernel reads one element per thread at a time (1.4-1.7 TB/s on
// [2048, 36864-49152] on the H100).
struct ColumnReductionVariant {
  int vec = 1;  // columns per thread: 16 bytes of the input
};
// Parameter block in 8-byte words: in, out, rows, cols, row_stride, rows_per_split, scale.
constexpr size_t kColumnReductionParamWords = 7;
std::string generateColumnReductionSource(OpType op, DataType in, DataType out, const ColumnReductionVariant& variant,
                                          const std::string& kernel_name);

}  // namespace meshfuse::cuda
