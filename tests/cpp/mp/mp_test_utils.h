// Helpers for multi-process tests: seeded random global tensors (identical on every rank), the
// rank's shard of them, a float64 matmul reference and a tolerance check.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "multidevice/communicator.h"
#include "multidevice/device_mesh.h"
#include "runtime/tensor.h"

namespace meshfuse::testing {

// The backends that carry host tensors in this build (MESHFUSE_HAVE_GLOO/UCC come from CMake).
inline std::vector<CommunicatorBackend> hostBackends() {
  return {
    CommunicatorBackend::Mpi,
#if MESHFUSE_HAVE_GLOO
        CommunicatorBackend::Gloo,
#endif
#if MESHFUSE_HAVE_UCC
        CommunicatorBackend::Ucc,
#endif
  };
}

// The 1-D mesh of every rank of the world, in rank order.
inline DeviceMesh worldMesh() {
  std::vector<int64_t> devices(static_cast<size_t>(Communicator::instance().size()));
  for (size_t i = 0; i < devices.size(); ++i) devices[i] = static_cast<int64_t>(i);
  return DeviceMesh(devices);
}

inline Tensor randomTensor(const std::vector<int64_t>& shape, uint64_t seed, DataType dtype = DataType::Float) {
  Tensor d = Tensor::empty(shape, DataType::Double);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  double* p = d.dataAs<double>();
  for (int64_t i = 0; i < d.numel(); ++i) p[i] = dist(gen);
  return dtype == DataType::Double ? d : d.to(dtype);
}

// Block `index` of `parts` along `axis`, as a contiguous copy.
inline Tensor shardOf(const Tensor& full, int axis, int64_t parts, int64_t index) {
  int64_t chunk = full.size(axis) / parts;
  return full.slice(axis, index * chunk, chunk).clone();
}

// a [M, K] @ b^T (b is [N, K]) in float64.
inline Tensor linearReference(const Tensor& a, const Tensor& b) {
  int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  Tensor out = Tensor::empty({m, n}, DataType::Double);
  double* o = out.dataAs<double>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t q = 0; q < k; ++q) acc += a.item(i * k + q) * b.item(j * k + q);
      o[i * n + j] = acc;
    }
  return out;
}

inline void expectClose(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": no result";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  double worst = 0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    double e = expected.item(i), a = actual.item(i);
    double err = std::abs(a - e) / (1.0 + std::abs(e));
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst relative error at element " << worst_at << ": got " << actual.item(worst_at)
                        << ", expected " << expected.item(worst_at);
}

}  // namespace meshfuse::testing
