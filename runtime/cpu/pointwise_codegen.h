// C++ source for one tile of a float pointwise program (runtime/cpu/pointwise.cpp), compiled at run
// time by the host's C++ compiler (runtime/cpu/host_compiler.h). The interpreter runs each op as its
// own pass over L1 tile buffers, a load and a store per op and element; the generated loop keeps the
// chain's values in registers and reads each input and writes each output once, as a JIT'd XLA or
// torch.compile kernel does. The 18-op GELU backward of the transformer layer runs in about half the
// time (BENCHMARKS.md). Each op's expression is the interpreter's (pointwise_math.h, fast_exp.h), so
// results match it to rounding (the compiler may contract a multiply and an add into an FMA).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "runtime/cpu/host_compiler.h"
#include "runtime/dtype.h"

namespace meshfuse::cpu {

// A program as the interpreter runs it, after its slots are packed: values live in numbered slots
// (a slot is reused once its value is dead, so the steps must be emitted in order).
struct TileProgram {
  struct Operand {
    int slot = -1;  // -1: the scalar
    double scalar = 0;
    int param = -1;  // >= 0 (and slot -1): the call's parameter `param`, not the scalar
  };
  struct Step {
    OpType op = OpType::Set;
    DataType cast_to = DataType::Float;  // Cast's target, a creation op's dtype
    Operand a, b, c;
    int out = -1;
    bool writes_output = false;  // the value is also an output, written right after the step
    int input = -1;              // >= 0: the value is in[input], computed before the kernel (a random draw)
  };
  int num_slots = 0;
  std::vector<int> input_slots;  // in[k] initializes slot input_slots[k]; the steps' inputs follow
  std::vector<Step> steps;
  std::vector<int> final_outputs;  // slots written to the outputs after the last step
  // Values that are the same for every element of one call but change from call to call (a
  // normalization's per-row mean and rstd): read once per call, before the loop.
  int num_params = 0;
  // Reductions over the call's elements of a slot's value (after the steps), as a normalization
  // row's (runtime/cpu/normalization.cpp): Sum adds the elements' sum to a double, Max folds their
  // maximum (NaN if any is NaN) into a float, ColumnSum and ColumnMax fold element i into a
  // double array's element i. Sum and Max keep 16 float lanes over whole blocks of 16 elements and
  // fold the rest in order, as that file's sumChunk and maxChunk do, so their results match.
  struct Reduction {
    enum class Kind : uint8_t { Sum, Max, ColumnSum, ColumnMax };
    Kind kind = Kind::Sum;
    int slot = -1;
  };
  std::vector<Reduction> reductions;
};

// The kernel's entry point: void meshfuse_tile(const float* const* in, float* const* out, long n),
// over n elements; in holds the inputs (input_slots, then those of the steps with input >= 0), then,
// where num_params > 0, a pointer to the parameters; out holds the outputs of the steps with
// writes_output (in step order), then final_outputs, then, per reduction, where its result goes (Sum:
// a double*, Max: a float*, ColumnSum and ColumnMax: a double* to the call's first element, each
// passed as a float*). nullopt when an op has no generated form (rounding to a narrower type, pow):
// the interpreter runs that program.
inline constexpr const char* kTileKernelSymbol = "meshfuse_tile";
std::optional<std::string> tileKernelSource(const TileProgram& program);

// compiledTileKernel (host_compiler.h) of tileKernelSource(program), or nullptr where an op has no
// generated form or the compile fails. Each program's kernel is remembered by the program's fields,
// so a program built again at every execute (a normalization's stages) costs a short key and a
// lookup, not its source written and hashed again (some 5 KiB with the fast-exp code, ~3 us).
TileKernel compiledTileProgram(const TileProgram& program);

}  // namespace meshfuse::cpu
