// uniform and normal on the CPU executor against the element-at-a-time stream (philox::drawElement,
// itself checked against the published Philox vectors in test_cpu_philox.cpp): the whole tensor,
// a block of rows that starts and ends mid-counter, a block of columns (runs of global indices),
// and a draw broadcast into a larger computation (indices that repeat), Float and Double.
#include <gtest/gtest.h>

#include <vector>

#include "ops/ops.h"
#include "runtime/element.h"
#include "runtime/philox.h"
#include "runtime/segment.h"

namespace meshfuse {
namespace {

struct Block {
  const char* name;
  std::vector<int64_t> local, global, offsets;
  bool broadcast = false;  // the draw (of shape `local`) multiplied into a [3, local...] tensor of ones
};

TEST(CpuRandom, EveryElementIsItsGlobalIndexsDraw) {
  const std::vector<Block> blocks = {
      {"whole", {4, 1001}, {4, 1001}, {0, 0}},
      {"rows 3..8 (starts at 3003, mid-counter)", {5, 1001}, {8, 1001}, {3, 0}},
      {"columns 501..518 of odd rows", {8, 17}, {8, 1001}, {0, 501}},
      {"rows 1..2 of 17", {1, 17}, {3, 17}, {1, 0}},
      {"broadcast", {4, 1001}, {4, 1001}, {0, 0}, true},
  };
  const uint64_t seed = 1234567, offset = (1ull << 33) + 5;
  for (const Block& b : blocks)
    for (DataType dt : {DataType::Float, DataType::Double})
      for (OpType op : {OpType::Uniform, OpType::Normal}) {
        SCOPED_TRACE(std::string(b.name) + " " + toString(dt) + " " + toString(op));
        Fusion f;
        auto num = [&](double v) { return f.newScalar(DataType::Double, v); };
        TensorView* r =
            op == OpType::Uniform
                ? ops::uniform(num(-2), num(3), b.global, dt, f.newScalar(DataType::Int, static_cast<double>(seed)),
                               f.newScalar(DataType::Int, static_cast<double>(offset)))
                : ops::normal(num(1), num(2), b.global, dt, f.newScalar(DataType::Int, static_cast<double>(seed)),
                              f.newScalar(DataType::Int, static_cast<double>(offset)));
        TensorView* out = r;
        TensorView* ones = nullptr;
        std::vector<int64_t> out_shape = b.local;
        if (b.broadcast) {
          out_shape.insert(out_shape.begin(), 3);
          ones = f.newTensor(dt, out_shape);
          f.addInput(ones);
          out = ops::binary(OpType::Mul, ones, r);
        }
        Segment seg;
        for (const auto& e : f.exprs()) seg.exprs.push_back(e.get());
        if (ones) seg.inputs.push_back(ones);
        seg.outputs = {out};
        ShapeMap shapes;
        for (const auto& v : f.vals())
          if (v->isTensor()) shapes[v.get()] = static_cast<TensorView*>(v.get())->shape();
        shapes[r] = b.local;
        if (b.global != b.local) seg.global_blocks[r] = {b.global, b.offsets};
        ValueMap values;
        if (ones) {
          Tensor t = Tensor::empty(out_shape, dt);
          for (int64_t i = 0; i < t.numel(); ++i)
            storeFromDouble(static_cast<char*>(t.data()) + i * static_cast<int64_t>(t.itemsize()), dt, 1.0);
          values.tensors[ones] = t;
        }
        makeCpuExecutor()->run(seg, values, shapes);
        const Tensor got = values.tensor(out);
        const int64_t rows = b.local[0], cols = b.local[1], copies = b.broadcast ? 3 : 1;
        int64_t differ = 0;
        for (int64_t c = 0; c < copies; ++c)
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
              const uint64_t g = static_cast<uint64_t>((i + b.offsets[0]) * b.global[1] + j + b.offsets[1]);
              const double a = op == OpType::Uniform ? -2.0 : 1.0, z = op == OpType::Uniform ? 3.0 : 2.0;
              double want = philox::drawElement(g, offset, seed, op == OpType::Normal, dt == DataType::Double, a, z);
              if (dt == DataType::Float) want = static_cast<float>(want);
              differ += got.item((c * rows + i) * cols + j) != want;
            }
        EXPECT_EQ(differ, 0);
      }
}

}  // namespace
}  // namespace meshfuse
