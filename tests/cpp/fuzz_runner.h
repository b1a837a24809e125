// Runs one fuzz case and judges it: a valid case must execute and match the float64 reference;
// a mutated one must raise UserError (while defining or executing). Anything else (another
// exception type, a mismatch, a mutated case that runs) is a failure, described with its seed.
#pragma once
#include <cstdlib>
#include <sstream>
#include <string>

#include "fuzz_generator.h"
#include "host_ir/fusion_executor.h"
#include "multidevice/sharding.h"

namespace meshfuse::testing {

// The value of an environment variable (MESHFUSE_FUZZ_SEED, MESHFUSE_FUZZ_CASES) or `fallback`.
inline uint64_t fuzzEnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

enum class FuzzOutcome { Matched, RaisedUserError, Failed };

struct FuzzResult {
  FuzzOutcome outcome = FuzzOutcome::Failed;
  std::string detail;  // the failure, or the UserError's message
};

// The block of global `full` that `tv` holds on `rank` (its mesh_x shard), or the whole of it.
inline RefTensor localBlock(const TensorView* tv, const RefTensor& full, int64_t rank) {
  const int axis = tv->shardedAxis(ParallelType::MeshX);
  if (axis < 0) return full;
  const int64_t parts = tv->partsAlong(ParallelType::MeshX, full.shape[axis]);
  const int64_t chunk = full.shape[axis] / parts, block = tv->deviceMesh()->indexOf(rank) % parts;
  RefTensor out{full.shape, {}};
  out.shape[axis] = chunk;
  for (int64_t i = 0; i < numelOf(full.shape); ++i) {
    auto idx = unravel(i, full.shape);
    if (idx[axis] / chunk == block) out.data.push_back(full.data[static_cast<size_t>(i)]);
  }
  return out;
}

// `strict`: a valid case that raises UserError fails (single process, where every generated
// sharding is legal); otherwise it counts as RaisedUserError (multi-device lowering may reject a
// combination of meshes by design). `device`: where the inputs live, hence where the fusion runs
// (a CUDA device runs it through the CUDA executor; results come back to the host to be judged);
// `params` picks the backend.
inline FuzzResult runFuzzCase(uint64_t seed, int64_t world_size, int64_t rank, bool strict, bool twice,
                              Device device = Device::cpu(), const MultiDeviceExecutorParams& params = {}) {
  FusionFuzzer fuzzer(seed, world_size, rank);
  auto describe = [&](const std::string& what) {
    std::ostringstream os;
    os << "seed " << seed << " (mutation: " << toString(fuzzer.mutation()) << "): " << what << "\n"
       << fuzzer.current().fusion->toString();
    return os.str();
  };
  try {
    FuzzCase& c = fuzzer.make();
    for (Argument& arg : c.args)
      if (auto* t = std::get_if<Tensor>(&arg)) *t = t->to(device);
    FusionExecutorCache fec(c.fusion);
    std::vector<Tensor> outs;
    for (int run = 0; run < (twice ? 2 : 1); ++run) outs = fec.execute(c.args, params);
    if (c.mutation != Mutation::None)
      return {FuzzOutcome::Failed, describe("ran, but a UserError was expected; lowered:\n" + fec.lastLoweredFusion())};
    std::vector<RefTensor> expected = ReferenceEvaluator().run(*c.fusion, c.global_inputs);
    const double tol = toleranceFor(*c.fusion);
    for (size_t i = 0; i < outs.size(); ++i) {
      auto* tv = static_cast<const TensorView*>(c.fusion->outputs()[i]);
      const bool here = !tv->hasDeviceMesh() || tv->deviceMesh()->has(rank);
      if (!here) {
        if (outs[i].defined()) return {FuzzOutcome::Failed, describe("output " + tv->name() + " is not on this rank")};
        continue;
      }
      if (outs[i].device() != device)
        return {FuzzOutcome::Failed, describe("output " + tv->name() + " is on " + outs[i].toString())};
      std::string why = compareToReference(outs[i].to(Device::cpu()), localBlock(tv, expected[i], rank), tol);
      if (!why.empty()) return {FuzzOutcome::Failed, describe("output " + tv->name() + ": " + why)};
    }
    return {FuzzOutcome::Matched, ""};
  } catch (const UserError& e) {
    if (fuzzer.mutation() == Mutation::None && strict)
      return {FuzzOutcome::Failed, describe(std::string("a valid case raised UserError: ") + e.what())};
    return {FuzzOutcome::RaisedUserError, e.what()};
  } catch (const std::exception& e) {
    return {FuzzOutcome::Failed, describe(std::string("raised a non-UserError exception: ") + e.what())};
  }
}

}  // namespace meshfuse::testing
