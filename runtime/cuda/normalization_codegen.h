// CUDA C++ source for a normalization segment (LayerNorm, RMSNorm, softmax, their backward): the
// segment's iteration space F splits into rows and a row (runtime/normalization_plan.h). The main
// kernel gives each row to threads_x threads (threads_y rows per block, a persistent grid-stride loop
// over row groups) and evaluates the segment in passes over the row: one pass per level of inner
// reductions (LayerNorm: the mean, then the variance of the centred values), each reduced warp then
// block (one barrier per level), and a last pass that stores the per-element outputs and
// accumulates outer reductions.
//
// Three variants:
// - persistent (items > 0): each thread holds its items * vec elements of the row in registers,
//   loaded once with 16-byte accesses, so every pass reads registers and the row crosses device
//   memory once (per-column inputs, the weights, are re-read from L1/L2 by each pass needing them).
// - streaming (items > 0, stream): as persistent, but the per-element inputs are re-read by each
//   pass (from L1/L2) rather than held: registers hold only the outer accumulators and the cached
//   expensive values, for segments reading more inputs than fit.
// - cluster (items > 0, cluster > 1; sm_90, off with MESHFUSE_NORM_CLUSTER=0): a row too
//   long for one block is split over a thread-block cluster, each block holding an interleaved share
//   in registers as the persistent variant does; each block reduction is followed by a cluster
//   barrier and a read of the other blocks' totals through distributed shared memory.
// - multi-pass (items == 0), for rows too long for the registers of one block: each pass re-reads
//   the row from global memory (from L2 while it fits) and recomputes what it needs. Correct at any
//   row length, about (passes + 1) reads of the row: a fallback, not a fast path.
// The element loops are what the kernels spend their instructions on (they were instruction-bound
// before memory-bound, BENCHMARKS.md): a vector chunk is bounds-checked once (rows are a multiple
// of the vector width whenever vectors are used) or not at all when the chunks cover the row
// exactly, and a final cast is stored with the store's one conversion.
// Outer reductions (over the rows) accumulate per thread (registers, or the workspace in the
// multi-pass variant), each (block, row slot) writes its partial row to a workspace, and a second
// kernel (the epilogue) adds the partials in a fixed order (deterministic; a tile of columns per
// block, the partials of a column split over several threads), then computes and stores the values
// that depend on them (casts of the weight gradients, say).
// CUDA-free header: plain string building, testable without a GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "runtime/dtype.h"
#include "runtime/normalization_plan.h"

namespace meshfuse::cuda {

struct NormalizationProgram {
  using Varies = NormalizationPlan::Varies;
  struct Operand {
    enum class Kind : uint8_t { Load, Temp, Scalar, Constant };
    Kind kind = Kind::Load;
    int index = 0;
    double value = 0;  // Constant
  };
  // A tensor read (load) or written (store), lined up with F.
  struct Port {
    DataType dtype = DataType::Float;
    Varies varies = Varies::PerElement;  // of the value it holds
    bool after = false;                  // a value computed from an outer reduction (epilogue)
    bool has_rows = false;               // the tensor has F's extent on some outer axis (stride != 0)
    bool has_columns = false;            // ... on some inner axis
    bool contiguous_row = false;         // its row part is one dense run: column j sits at offset j
    Operand value;                       // stores: what is stored
  };
  struct Step {
    OpType op = OpType::Set;
    std::vector<Operand> args;
    Varies varies = Varies::PerElement;
    bool after = false;  // computed from an outer reduction's result (in the epilogue)
    bool outer = false;  // an outer reduction (accumulated over the rows)
    bool round = false;  // Cast and creation ops: the value is rounded to round_to
    DataType round_to = DataType::Float;
    double scale = 1;  // Mean: 1 / count
  };
  std::vector<Port> loads, stores;
  std::vector<Step> steps;  // step i defines temp i
  int num_scalars = 0;
  DataType compute = DataType::Float;  // Float, or Double when the segment holds a Double
  int outer_rank = 1, inner_rank = 1;  // F's axes before and after the split

  int numOuterReductions() const;
  bool hasEpilogue() const { return numOuterReductions() > 0; }
  std::string key() const;  // structure and types, not sizes or strides
};

struct NormalizationVariant {
  int vec = 1;        // elements per vector access along a row (n % vec == 0, contiguous rows aligned)
  int threads_x = 1;  // threads sharing a row: a power of two up to 32, or a multiple of 32 up to 1024
  int threads_y = 1;  // rows per block
  int items = 1;      // persistent: vec-wide vectors per thread covering the row; 0: multi-pass
  // Persistent only: the per-element inputs are re-read in each pass (from L1/L2, where the row
  // stays) instead of held in registers; the outer accumulators still are. For segments with more
  // inputs than registers (a backward fused with its neighbours) that would otherwise go multi-pass.
  bool stream = false;
  // Persistent only: each row group prefetches the next one's contiguous element rows into L2 once
  // its own loads are issued, so the memory system keeps reading while the block reduces and
  // stores (at a block or two per multiprocessor, those phases otherwise leave it idle). Measured on
  // the H200 ([8192, 12288] bf16): LayerNorm 0.143 -> 0.131 ms, softmax 0.168 -> 0.148, the
  // LayerNorm backward 0.304 -> 0.232.
  bool prefetch = false;
  // Persistent only: expensive element values (exp) needed by two passes are recomputed in the
  // second instead of held in registers between them.
  bool recompute = false;
  // Persistent only: register-held inputs pass an optimization fence before each later pass, so the
  // compiler recomputes what it derived from them rather than holding those values across passes.
  bool fence = false;
  // Persistent only: the threads' chunks cover the row exactly (threads_x * items * vec == row
  // length), so no chunk needs a bounds check.
  bool exact = false;
  // Persistent only: the blocks of a thread-block cluster (sm_90) that share each row, for rows
  // longer than one block's registers hold (or any row, under MESHFUSE_NORM_SPLIT for A/B runs):
  // each holds an interleaved share of the row, and the reductions combine the blocks' totals
  // through distributed shared memory. 1: one block a row.
  int cluster = 1;
  // The blocks per multiprocessor the kernel is compiled for (__launch_bounds__'s second argument,
  // which caps the registers a thread may use); 0 leaves it to the compiler.
  int min_blocks = 0;
  std::string key() const;
};

// The parameter block (8-byte words) of the main kernel, in this order: load pointers, store
// pointers, the workspace pointer, scalars (at least one slot), rows, n (the row length), F's outer
// shape, F's inner shape, for each load and each store its outer strides and inner strides, and
// last the number of partial rows per outer reduction in the workspace (read by the epilogue).
// Both kernels take the same block.
size_t normalizationParamWords(const NormalizationProgram& program);

// Ops whose per-element results the persistent variant keeps in registers when several passes
// need them (the scheduler counts those in its register budget).
bool isExpensiveNormalizationOp(OpType op);

std::string generateNormalizationSource(const NormalizationProgram& program, const NormalizationVariant& variant,
                                        const std::string& kernel_name);
// The epilogue's block: X consecutive columns by Y threads that split the partial rows of each.
constexpr int kNormalizationEpilogueX = 32;
constexpr int kNormalizationEpilogueY = 16;

std::string generateNormalizationEpilogueSource(const NormalizationProgram& program, const std::string& kernel_name);

}  // namespace meshfuse::cuda
