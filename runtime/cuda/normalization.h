// The CUDA normalization scheduler: runs a Segment::Kind::Normalization segment (LayerNorm, RMSNorm,
// softmax and their backward) as one generated persistent kernel (normalization_codegen.h), plus
// a small epilogue kernel when the segment has outer reductions (weight and bias gradients).
//
// prepareNormalization resolves the segment to a NormalizationProgram (its loads, steps and stores)
// and the tensors and strides of one run; chooseNormalizationVariant picks the launch shape from the
// row length, the dtypes, the alignment of the tensors and the register budget; both are plain host
// code (tests call them without a GPU). runNormalization compiles (once per program and variant,
// kernel_cache.h), sizes the grid from the multiprocessor count and the kernel's occupancy, and
// launches on the device's current stream. Both run on every execution, so what repeats is cached:
// the segment's plan (by its exprs and shapes), the kernels and their occupancy (by the program's
// binary key); no source is built or hashed after the first run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cuda/normalization_codegen.h"
#include "runtime/segment.h"

namespace meshfuse::cuda {

struct NormalizationLaunch {
  NormalizationProgram program;
  std::vector<Tensor> loads, stores;  // in port order (stores: the segment's outputs, in order)
  std::vector<double> scalars;
  std::vector<int64_t> outer_shape, inner_shape;  // F's
  // F strides (outer axes, then inner axes) of each port: loads (at least one slot), then stores.
  std::vector<std::vector<int64_t>> strides;
  int64_t rows = 0, row_length = 0;
  // The segment's values that the loads and the scalars read, in their order: what rebinds a kept
  // launch to another run's tensors (rebindNormalization).
  std::vector<const Val*> load_values, scalar_values;
};

// The launch of `seg` reading `values` (segment inputs, any device) and writing `outputs` (one
// tensor per seg.outputs, of its local shape), or nullopt with the reason in `why` when the
// segment is not one this scheduler runs (then the executor runs it expr by expr).
std::optional<NormalizationLaunch> prepareNormalization(const Segment& seg, const ShapeMap& shapes,
                                                        const ValueMap& values, const std::vector<Tensor>& outputs,
                                                        std::string* why = nullptr);

// `launch`, prepared for an earlier run of the same segment whose inputs had the shapes, strides,
// dtypes and 16-byte alignments of this run's (and outputs of the same shapes), bound to this run's
// inputs and scalars (`values`) and `outputs`: what prepareNormalization would return for them.
void rebindNormalization(NormalizationLaunch& launch, const ValueMap& values, const std::vector<Tensor>& outputs);

NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& launch);
// The same with thread-block clusters allowed or not for rows one block cannot hold (by default
// they are; MESHFUSE_NORM_CLUSTER=0 leaves those rows to the multi-pass variant).
NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& launch, bool allow_clusters);
// The same with a row that one block holds, or would stream, split over a cluster of `split` blocks
// that hold it, where that fits (MESHFUSE_NORM_SPLIT's meaning; 1: not split).
NormalizationVariant chooseNormalizationVariant(const NormalizationLaunch& launch, bool allow_clusters, int split);

// Whether runNormalization splits a large segment (4M elements or more) by default: exactly when the
// `unsplit` variant streams its row inputs and `split` (the split of 2 above) holds them in a cluster
// of two blocks. A rule, not a timing, so that every rank and every run of a replicated segment makes
// the same choice, and so computes the same bits; MESHFUSE_NORM_AUTOTUNE=1 times the two instead
// (normalization.cpp says why).
bool splitsByDefault(const NormalizationVariant& unsplit, const NormalizationVariant& split);

// Compiles (cached) and launches on `device`'s current stream; the tensors must live there.
void runNormalization(int device, const NormalizationLaunch& launch);

}  // namespace meshfuse::cuda
