// How a BLAS-style GEMM (OpenBLAS on CPU, cuBLASLt on CUDA) reads one [rows, cols] matrix held with
// element strides (row_stride, col_stride): row-major with leading dimension `ld`, or the transpose
// of such a matrix. A matrix of neither kind (say, both strides > 1) has no layout and must be made
// contiguous first. Shared by both runtimes so that a permuted operand, such as the dy^T of a
// weight gradient, reaches either GEMM as a transpose flag instead of a copy.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>

namespace meshfuse {

struct MatrixLayout {
  bool transposed = false;  // memory holds the [cols, rows] matrix row-major
  int64_t ld = 0;           // elements between consecutive rows of that memory matrix
};

inline std::optional<MatrixLayout> matrixLayout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= std::max<int64_t>(cols, 1)))
    return MatrixLayout{false, rows == 1 ? std::max<int64_t>(cols, 1) : row_stride};
  if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= std::max<int64_t>(rows, 1)))
    return MatrixLayout{true, cols == 1 ? std::max<int64_t>(rows, 1) : col_stride};
  return std::nullopt;
}

}  // namespace meshfuse
