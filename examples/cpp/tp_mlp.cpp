// A tensor-parallel MLP from C++ (the Python version: examples/tp_mlp.py), on every rank of
// `mpirun -np N`:
//
//   y = linear(relu(linear(x, w1, b1)), w2, b2)
//
// w1 and b1 are split by rows (column-parallel: each rank computes a slice of the hidden layer), w2
// by columns (row-parallel: each rank's partial product is summed by the allreduce meshfuse
// inserts). The fusion is defined once with global shapes; each rank passes its own shards, and
// checks the replicated y against a float64 loop. Build: see CMakeLists.txt here.
#include <host_ir/multidevice_executor.h>  // the package puts include/meshfuse on the include path
#include <ops/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

using namespace meshfuse;

namespace {

// A [rows, cols] Float tensor of normal values scaled by `scale`, the same on every rank (one seed).
Tensor randomMatrix(int64_t rows, int64_t cols, uint64_t seed, double scale) {
  Tensor t = Tensor::empty({rows, cols}, DataType::Float);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.dataAs<float>()[i] = static_cast<float>(normal(gen));
  return t;
}

// Rank `index`'s block of `parts` along `axis`.
Tensor block(const Tensor& full, int64_t axis, int64_t parts, int64_t index) {
  const int64_t chunk = full.size(axis) / parts;
  return full.slice(axis, index * chunk, chunk).clone();
}

// linear(x, w, b) in float64: x [m, k], w [n, k], b [1, n].
std::vector<double> linearReference(const std::vector<double>& x, const Tensor& w, const Tensor& b, int64_t m) {
  const int64_t n = w.size(0), k = w.size(1);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b.item(j);
      for (int64_t q = 0; q < k; ++q) acc += x[static_cast<size_t>(i * k + q)] * w.item(j * k + q);
      y[static_cast<size_t>(i * n + j)] = acc;
    }
  return y;
}

}  // namespace

int main() {
  Communicator& comm = Communicator::instance();
  const int64_t d = comm.size(), rank = comm.rank();
  const int64_t batch = 8, hidden = 64, inner = 4 * hidden;

  auto fusion = std::make_shared<Fusion>();
  TensorView* x = fusion->newTensor(DataType::Float, {-1, hidden});  // -1: the batch is bound at run time
  TensorView* w1 = fusion->newTensor(DataType::Float, {inner, hidden});
  TensorView* b1 = fusion->newTensor(DataType::Float, {inner});
  TensorView* w2 = fusion->newTensor(DataType::Float, {hidden, inner});
  TensorView* b2 = fusion->newTensor(DataType::Float, {hidden});
  for (TensorView* tv : {x, w1, b1, w2, b2}) fusion->addInput(tv);
  TensorView* h = ops::unary(OpType::Relu, ops::linear(x, w1, b1));
  TensorView* y = ops::linear(h, w2, b2);
  fusion->addOutput(y);

  std::vector<int64_t> devices(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) devices[static_cast<size_t>(i)] = i;
  const DeviceMesh mesh(devices);
  for (TensorView* tv : {x, w1, b1, w2, b2, h, y}) tv->setDeviceMesh(mesh);
  for (auto [tv, axis] : {std::pair{w1, 0}, std::pair{b1, 0}, std::pair{h, 1}, std::pair{w2, 1}}) {
    tv->outerSplit(axis, d);  // [d, extent / d] ...
    tv->parallelize(axis, ParallelType::MeshX);
  }

  const Tensor x_full = randomMatrix(batch, hidden, 1, 1.0), w1_full = randomMatrix(inner, hidden, 2, 0.125),
               b1_full = randomMatrix(1, inner, 3, 1.0), w2_full = randomMatrix(hidden, inner, 4, 0.0625),
               b2_full = randomMatrix(1, hidden, 5, 1.0);
  MultiDeviceExecutorParams params;  // backend: auto (MPI on the CPU)
  MultiDeviceExecutor executor(fusion, comm, params);
  const std::vector<Tensor> out =
      executor.runWithInput({x_full, block(w1_full, 0, d, rank), block(b1_full.view({inner}), 0, d, rank),
                             block(w2_full, 1, d, rank), b2_full.view({hidden})});

  std::vector<double> xs(static_cast<size_t>(x_full.numel()));
  for (int64_t i = 0; i < x_full.numel(); ++i) xs[static_cast<size_t>(i)] = x_full.item(i);
  std::vector<double> hs = linearReference(xs, w1_full, b1_full, batch);
  for (double& v : hs) v = std::max(v, 0.0);
  const std::vector<double> expected = linearReference(hs, w2_full, b2_full, batch);
  double worst = 0;
  for (int64_t i = 0; i < out[0].numel(); ++i)
    worst = std::max(worst, std::abs(out[0].item(i) - expected[static_cast<size_t>(i)]) /
                                (1 + std::abs(expected[static_cast<size_t>(i)])));
  std::printf("rank %lld of %lld: y %s, max relative error %.2e against float64\n", static_cast<long long>(rank),
              static_cast<long long>(d), out[0].toString().c_str(), worst);
  if (rank == 0) std::printf("%s", executor.hostIr().c_str());
  return worst < 1e-4 ? 0 : 1;
}
