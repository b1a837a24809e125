// Which library runs float32 GEMMs (matmul and linear segments), chosen once per process and
// implemented in runtime/cpu/matmul.cpp. blas_core.h is about which kernels OpenBLAS itself runs.
#pragma once

namespace meshfuse::cpu {

// The library that float32 GEMMs (matmul and linear segments) run through. oneDNN's sgemm (the
// oneDNN torch links) reads the same row-major/transposed operands as cblas_sgemm and runs the
// transformer layer's shapes 5-15% faster than OpenBLAS 0.3.21 here; double, integer and attention
// GEMMs stay on OpenBLAS.
enum class FloatGemm { OpenBlas, OneDnn };
// OneDnn when libmeshfuse was built with oneDNN (CMake MESHFUSE_DNNL) unless MESHFUSE_CPU_GEMM=openblas
// (read once), else OpenBlas.
FloatGemm floatGemm();
bool haveOneDnnGemm();
// Overrides the choice (tests, A/B measurements); OneDnn without oneDNN throws std::invalid_argument.
void setFloatGemm(FloatGemm gemm);

}  // namespace meshfuse::cpu
