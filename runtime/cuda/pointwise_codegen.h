// CUDA C++ source for a fused pointwise chain. A PointwiseProgram is a straight-line list of ops
// over tensor inputs, runtime scalars and constants; the generated kernel evaluates the whole chain
// per element (one read of each input, one write of each output) in a grid-stride loop. Random ops
// (uniform, normal) run the Philox arithmetic of runtime/philox.h on the element's row-major index
// in the global tensor (element g: counter g / (4 / W), W words from word (g % (4 / W)) * W), so
// CUDA and CPU draw the same numbers; a thread takes groups of consecutive elements and draws each
// counter once for all the elements it serves. Variants:
// the contiguous fast path (flat index, 16-byte vector loads/stores) and the strided path
// (broadcasting and views through per-tensor strides over the coalesced iteration shape).
// CUDA-free header: the codegen is plain string building, testable without a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "runtime/dtype.h"

namespace meshfuse::cuda {

struct PointwiseProgram {
  struct Operand {
    enum class Kind : uint8_t { Input, Scalar, Constant, Temp };
    Kind kind = Kind::Input;
    int index = 0;                     // input, scalar or temp number
    double value = 0;                  // Constant
    DataType dtype = DataType::Float;  // the operand's own type (constants and scalars too)
  };
  // Operands as in the IR: unary 1, binary 2, where 3 (cond, a, b), full 1 (fill), uniform/normal
  // 4 (minval or mean, maxval or std, seed, offset).
  struct Instr {
    OpType op;
    std::vector<Operand> args;
    DataType dtype;  // result type (the cast target for Cast)
  };
  std::vector<DataType> inputs;  // tensor inputs
  int num_scalars = 0;           // runtime scalars, passed as doubles
  std::vector<Instr> instrs;     // instruction i defines temp i
  std::vector<int> outputs;      // temp of each output
  std::vector<DataType> outputDtypes() const;
  int numRandom() const;  // uniform/normal instrs: each has an index stream (RandomIndex)
  // The structure and types (not sizes): with the variant, the kernel cache key.
  std::string key() const;
};

struct PointwiseVariant {
  bool contiguous = true;  // every tensor dense over the same shape: flat indexing
  int vector_width = 1;    // elements per vector access on the contiguous path (1: scalar)
  int ndim = 1;            // strided path: rank of the (coalesced) iteration shape
  bool index32 = false;    // strided path: offsets fit in 32 bits
  std::string key() const;
};

// Where the elements of one random op sit in its global tensor: element (i_0, ..., i_{r-1}) of the
// iteration space has global row-major index base + sum_d i_d * strides[d] (strides 0 where the
// op's own value is broadcast). Identity (base 0, the iteration space is the whole global tensor):
// the flat iteration index, which the contiguous variant requires.
struct RandomIndex {
  bool identity = true;
  int64_t base = 0;
  std::vector<int64_t> strides;  // over the (uncoalesced) iteration shape
};

// The kernel's parameter block is an array of 8-byte words in this order: input pointers, output
// pointers, scalars (doubles, at least one slot), n, the base of each random op's index, then for
// the strided path shape[ndim], the strides of each input and each output (elements) and each
// random op's index strides.
size_t pointwiseParamWords(const PointwiseProgram& program, const PointwiseVariant& variant);

// Elements a thread takes per step of its grid-stride loop: a vector's on the contiguous path; with
// random ops at least 4 (whole Philox counters, each drawn once: runtime/philox.h).
int pointwiseElementsPerThread(const PointwiseProgram& program, const PointwiseVariant& variant);

std::string generatePointwiseSource(const PointwiseProgram& program, const PointwiseVariant& variant,
                                    const std::string& kernel_name);

// The CUDA expression of a pointwise op (not creation ops) whose operands, named a, b, c, are
// already of computeType(`operand_dtype`); shared with the normalization generator.
std::string opExpression(OpType op, DataType operand_dtype);
// Device functions philox4x32(counter, offset, seed), philoxElement(g, words, offset, seed) (element
// g's words, from .x on), philoxUniform{F,D} and philoxNormal{F,D} (a value from those words): the
// arithmetic of runtime/philox.h, rounding step by step as it does (no contraction into FMAs).
std::string philoxSource();

// C type names of storage and of arithmetic, shared with the other generated kernels.
std::string storageType(DataType dtype);
std::string computeType(DataType dtype);
// The expression converting `expr` of storage type `from` to compute type of `to`, and back.
std::string loadConvert(const std::string& expr, DataType from, DataType to_compute);
std::string storeConvert(const std::string& expr, DataType compute_of, DataType to_storage);
// The prelude every generated kernel starts with (fp16/bf16 headers, integer typedefs).
std::string kernelPrelude();

}  // namespace meshfuse::cuda
