#include "host_ir/input_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "host_ir/consistency.h"
#include "multidevice/communicator.h"
#include "multidevice/sharding.h"

namespace meshfuse {

namespace {
std::string shardNote(const TensorView* tv, int axis) {
  for (int d = 0; d < kMeshDims; ++d) {
    ParallelType p = meshParallelType(d);
    if (tv->shardedAxis(p) == axis)
      return " (the local shard of a global axis split over " + std::to_string(tv->deviceMesh()->size(p)) +
             " devices along " + toString(p) + ")";
  }
  return "";
}

// A scalar input's value against its dtype: scalars travel as doubles, so an Int scalar must be a
// whole number a double holds exactly (as the Python front end checks before it gets here).
void checkScalarValue(const Val* def, size_t index, double value) {
  if (!isIntegral(def->dtype())) return;
  const std::string label = "execute: input " + std::to_string(index) + " (" + def->name() + ") is an " +
                            toString(def->dtype()) + " scalar; got " + exactText(value);
  if (isExactInteger(value) && (def->dtype() != DataType::Int32 || fitsInt32(value))) return;
  if (!std::isfinite(value) || value != std::trunc(value)) throw UserError(label + ", which is not an integer");
  if (def->dtype() == DataType::Int32) throw UserError(label + ", beyond Int32's range [-2**31, 2**31)");
  throw UserError(label + ", beyond 2**53, which a scalar (a double) cannot hold exactly; pass it in a tensor");
}

bool checksReplicas() {
  const char* v = std::getenv("MESHFUSE_CHECK_REPLICAS");
  return v != nullptr && std::string(v) == "1";
}

// Whether ranks other than this one hold the same block: the mesh has a dim of more than one device
// that the tensor is not sharded along.
bool hasReplicas(const TensorView* tv) {
  if (!tv->hasDeviceMesh()) return false;
  for (int d = 0; d < kMeshDims; ++d) {
    const ParallelType p = meshParallelType(d);
    if (tv->deviceMesh()->size(p) > 1 && tv->shardedAxis(p) < 0) return true;
  }
  return false;
}

// The definition's hash over the elements' bytes in logical order: never 0, which marks "not checked".
uint64_t bytesHash(const Tensor& t) {
  const Tensor dense = t.contiguous();
  const uint64_t h = fingerprintHash(std::string_view(static_cast<const char*>(dense.data()), dense.nbytes()));
  return h == 0 ? 1 : h;
}
}  // namespace

void checkEveryLeafIsBound(const Fusion& fusion) {
  auto check = [&](const Val* v, const Expr* user) {
    if (v->definition() != nullptr || fusion.isInput(v)) return;
    if (!v->isTensor() && static_cast<const Scalar*>(v)->value().has_value()) return;
    throw UserError(v->name() + " is " + (user ? "an operand of " + toString(user->op()) : "a fusion output") +
                    " but is neither a fusion input nor computed by an expression" +
                    (v->isTensor() ? "" : " nor a constant") + " (add_input it)");
  };
  for (const auto& e : fusion.exprs()) {
    // An expr drawing fresh random numbers gets its (seed, offset) pair, its last two operands, from
    // the executor at each run (bindFreshRandomState).
    const size_t bound_here = e->attrs().fresh_rng ? 2 : 0;
    for (size_t i = 0; i + bound_here < e->inputs().size(); ++i) check(e->input(i), e.get());
  }
  for (const Val* v : fusion.outputs()) check(v, nullptr);
}

InputSignature checkLocalInputs(const Fusion& fusion, const std::vector<Argument>& inputs, int64_t rank) {
  const auto& defs = fusion.inputs();
  if (inputs.size() != defs.size())
    throw UserError("execute: expected " + std::to_string(defs.size()) + " inputs, got " +
                    std::to_string(inputs.size()));
  InputSignature sig;
  bool device_set = false;
  const bool check_replicas = checksReplicas();
  for (size_t i = 0; i < defs.size(); ++i) {
    const Val* def = defs[i];
    const Argument& arg = inputs[i];
    sig.dtypes.push_back(def->dtype());
    sig.replica_hashes.push_back(0);
    if (!def->isTensor()) {
      if (!std::holds_alternative<double>(arg))
        throw UserError("execute: input " + std::to_string(i) + " (" + def->name() +
                        ") is a scalar; got a tensor or None");
      checkScalarValue(def, i, std::get<double>(arg));
      sig.present.push_back(true);
      sig.global.emplace_back();
      sig.scalars.push_back(std::get<double>(arg));
      continue;
    }
    auto* tv = static_cast<const TensorView*>(def);
    bool mine = !tv->hasDeviceMesh() || tv->deviceMesh()->has(rank);
    if (!mine) {  // whatever is passed for another rank's input is ignored
      sig.present.push_back(false);
      sig.global.emplace_back();
      sig.scalars.push_back(0.0);
      continue;
    }
    if (!std::holds_alternative<Tensor>(arg))
      throw UserError("execute: input " + std::to_string(i) + " (" + tv->name() + ") must be a tensor on rank " +
                      std::to_string(rank) + "; got " + (std::holds_alternative<double>(arg) ? "a scalar" : "None"));
    const Tensor& t = std::get<Tensor>(arg);
    // The IR name and the place in execute()'s list, which is what a user with many inputs counts.
    const std::string label = tv->name() + " (input " + std::to_string(i) + ")";
    if (t.dtype() != tv->dtype())
      throw UserError(label + ": expected dtype " + toString(tv->dtype()) + ", got " + toString(t.dtype()));
    if (t.dim() != tv->ndim())
      throw UserError(label + ": expected rank " + std::to_string(tv->ndim()) + " (shape " +
                      shapeToString(tv->shape()) + "), got rank " + std::to_string(t.dim()) + " (shape " +
                      shapeToString(t.shape()) + ")");
    if (tv->isContiguous() && !t.isContiguous())
      throw UserError(label + ": the definition says contiguous but the input has shape " + shapeToString(t.shape()) +
                      " and strides " + shapeToString(t.strides()) +
                      " (pass a contiguous copy, or define it with contiguity=False)");
    checkHasDeviceMesh(tv);
    // A mesh axis split into other than the mesh's device count: said as such, before the extents (whose
    // expected local values assume the mesh's count and would point at the wrong thing).
    // (checkHasDeviceMesh above: a mesh-parallel axis has a mesh.)
    for (const LoopAxis& la : tv->loop()) {
      if (!isMeshParallel(la.parallel)) continue;
      const int64_t devices = tv->deviceMesh()->size(la.parallel), extent = tv->shape()[la.logical];
      // A whole axis on the mesh, of a known extent that is not the device count: said before the
      // extents too (which expected a block of it, then refused that block).
      if (la.part == LoopAxis::Part::Whole && extent >= 0 && extent != devices)
        throw UserError(wholeAxisOnMeshError(tv, la.logical, extent, la.parallel));
      if (la.part == LoopAxis::Part::Outer && la.outer_split && la.factor != devices)
        throw UserError(label + " axis " + std::to_string(la.logical) + " is split into " + std::to_string(la.factor) +
                        " parts along " + toString(la.parallel) + " but " + tv->deviceMesh()->toString() + " has " +
                        std::to_string(devices) + " devices there (outer_split(axis, mesh size))");
    }
    std::vector<int64_t> global = globalShape(tv, t.shape());
    for (int64_t a = 0; a < tv->ndim(); ++a) {
      int64_t expected = tv->shape()[a];
      if (expected >= 0 && global[a] != expected) {
        std::string note = shardNote(tv, static_cast<int>(a));
        int64_t local_expected = localShape(tv, tv->shape())[a];
        throw UserError(label + " axis " + std::to_string(a) + ": expected extent " + std::to_string(local_expected) +
                        note + ", got " + std::to_string(t.shape()[a]) + " (input shape " + shapeToString(t.shape()) +
                        ")");
      }
    }
    if (!device_set) {
      sig.device = t.device().type;
      sig.device_index = t.device().index;
      device_set = true;
    } else if (t.device().type != sig.device) {
      throw UserError(label + ": on " + t.device().toString() + " while an earlier input is on " +
                      Device{sig.device, sig.device_index}.toString() + "; all inputs must be on one kind of device");
    }
    sig.present.push_back(true);
    sig.global.push_back(global);
    sig.scalars.push_back(0.0);
    sig.replica_hashes.back() =
        check_replicas && hasReplicas(tv) && t.device().type == DeviceType::CPU ? bytesHash(t) : 0;
  }
  return sig;
}

namespace {
std::string offsetText(int64_t given) { return given < 0 ? std::string("none") : std::to_string(given); }

// Wire format: [status, device, trace, seed, offset, given offset, definition, n, then per input: present, rank,
// extents..., the scalar's bits, the replica hash] as int64, then the message.
std::string encode(const InputSignature* sig, const std::string& error) {
  std::vector<int64_t> words;
  words.push_back(sig ? 0 : 1);
  if (sig) {
    words.push_back(static_cast<int64_t>(sig->device));
    words.push_back(sig->trace ? 1 : 0);
    words.push_back(static_cast<int64_t>(sig->rng_seed));
    words.push_back(static_cast<int64_t>(sig->rng_offset));
    words.push_back(sig->given_rng_offset);
    words.push_back(static_cast<int64_t>(sig->definition));
    words.push_back(static_cast<int64_t>(sig->present.size()));
    for (size_t i = 0; i < sig->present.size(); ++i) {
      words.push_back(sig->present[i] ? 1 : 0);
      words.push_back(static_cast<int64_t>(sig->global[i].size()));
      for (int64_t e : sig->global[i]) words.push_back(e);
      int64_t bits = 0;
      std::memcpy(&bits, &sig->scalars[i], sizeof(bits));
      words.push_back(bits);
      words.push_back(static_cast<int64_t>(sig->replica_hashes[i]));
    }
  }
  std::string bytes(words.size() * sizeof(int64_t), '\0');
  std::memcpy(bytes.data(), words.data(), bytes.size());
  uint64_t n = bytes.size();
  std::string header(sizeof(n), '\0');
  std::memcpy(header.data(), &n, sizeof(n));
  return header + bytes + error;
}

struct Decoded {
  bool ok = false;
  std::string error;
  InputSignature sig;
};

Decoded decode(const std::string& blob) {
  Decoded d;
  uint64_t n;
  std::memcpy(&n, blob.data(), sizeof(n));
  std::vector<int64_t> words(n / sizeof(int64_t));
  std::memcpy(words.data(), blob.data() + sizeof(n), n);
  size_t pos = 0;
  d.ok = words[pos++] == 0;
  std::string rest = blob.substr(sizeof(n) + n);
  d.error = rest.substr(0, rest.find('\0'));
  if (!d.ok) return d;
  d.sig.device = static_cast<DeviceType>(words[pos++]);
  d.sig.trace = words[pos++] != 0;
  d.sig.rng_seed = static_cast<uint64_t>(words[pos++]);
  d.sig.rng_offset = static_cast<uint64_t>(words[pos++]);
  d.sig.given_rng_offset = words[pos++];
  d.sig.definition = static_cast<uint64_t>(words[pos++]);
  int64_t count = words[pos++];
  for (int64_t i = 0; i < count; ++i) {
    d.sig.present.push_back(words[pos++] != 0);
    int64_t rank = words[pos++];
    d.sig.global.emplace_back(words.begin() + static_cast<int64_t>(pos),
                              words.begin() + static_cast<int64_t>(pos) + rank);
    pos += rank;
    double value = 0;
    std::memcpy(&value, &words[pos++], sizeof(value));
    d.sig.scalars.push_back(value);
    d.sig.replica_hashes.push_back(static_cast<uint64_t>(words[pos++]));
  }
  return d;
}

// MESHFUSE_CHECK_REPLICAS=1: ranks holding the same block of an input (the same coordinates along the
// mesh dims it is sharded along) must pass the same data; tensor-parallel ranks each loading their own
// batch computed garbage silently. Compares the hashes of the ranks that computed one.
void checkReplicasAgree(const TensorView* tv, size_t input, const std::vector<Decoded>& decoded) {
  if (!tv->hasDeviceMesh()) return;
  const DeviceMesh& mesh = *tv->deviceMesh();
  std::map<std::vector<int64_t>, size_t> first_of_block;  // the block's coordinates -> its first rank
  for (size_t r = 0; r < decoded.size(); ++r) {
    const uint64_t hash = decoded[r].sig.replica_hashes[input];
    if (hash == 0 || !mesh.has(static_cast<int64_t>(r))) continue;
    std::vector<int64_t> block;
    std::vector<std::string> along;
    for (int d = 0; d < kMeshDims; ++d) {
      const ParallelType p = meshParallelType(d);
      if (tv->shardedAxis(p) >= 0)
        block.push_back(mesh.coordinate(static_cast<int64_t>(r), p));
      else if (mesh.size(p) > 1)
        along.push_back(toString(p));
    }
    auto [it, fresh] = first_of_block.emplace(block, r);
    if (fresh || decoded[it->second].sig.replica_hashes[input] == hash) continue;
    std::string dims;
    for (const std::string& a : along) dims += (dims.empty() ? "" : " and ") + a;
    throw UserError(tv->name() + " (input " + std::to_string(input) + "): ranks " + std::to_string(it->second) +
                    " and " + std::to_string(r) + " hold replicas of one block (the tensor is not sharded along " +
                    dims +
                    ") but pass different data (MESHFUSE_CHECK_REPLICAS=1): every replica must be the same, "
                    "e.g. the same batch on every tensor-parallel rank");
  }
}

// The default seed (MESHFUSE_SEED unset) said as such rather than as its number.
std::string seedText(uint64_t seed) {
  return seed == kDefaultRandomSeed ? std::to_string(seed) + ", the default: unset" : std::to_string(seed);
}
}  // namespace

std::vector<std::string> definitionLines(const Fusion& fusion, const MultiDeviceExecutorParams& params) {
  std::vector<std::string> lines;
  std::istringstream text(fusion.toString());
  for (std::string line; std::getline(text, line);) lines.push_back(line);
  lines.push_back("backend " + toString(params.lower.communicator_backend));
  lines.push_back("number_of_streams " + std::to_string(params.executor.number_of_streams));
  return lines;
}

InputSignature agreeOnInputs(const Fusion& fusion, const InputSignature* mine, const std::string& my_error,
                             std::chrono::milliseconds timeout, const std::vector<std::string>& definition_lines) {
  Communicator& comm = Communicator::instance();
  std::vector<int64_t> world(comm.size());
  for (int64_t r = 0; r < comm.size(); ++r) world[r] = r;
  std::string blob = encode(mine, my_error);
  // Contributions must be of equal size: agree on the largest, then pad.
  uint64_t len = blob.size();
  std::string len_bytes(sizeof(len), '\0');
  std::memcpy(len_bytes.data(), &len, sizeof(len));
  uint64_t longest = 0;
  for (const std::string& s : comm.allgatherBytes(world, len_bytes, timeout)) {
    uint64_t l;
    std::memcpy(&l, s.data(), sizeof(l));
    longest = std::max(longest, l);
  }
  blob.resize(longest, '\0');
  std::vector<std::string> all = comm.allgatherBytes(world, blob, timeout);

  std::vector<Decoded> decoded;
  for (const std::string& s : all) decoded.push_back(decode(s));
  if (!my_error.empty()) throw UserError(my_error);
  for (size_t r = 0; r < decoded.size(); ++r)
    if (!decoded[r].ok)
      throw UserError("rank " + std::to_string(r) +
                      " failed its input check, so no rank executes: " + decoded[r].error);

  // First the definition: ranks executing different fusions (say, two cached ones called in another
  // order) would each run their own program against the others' collectives, which either hang or,
  // where sizes happen to fit, return wrong data; and their inputs need not be comparable below.
  for (size_t r = 1; r < decoded.size(); ++r) {
    if (decoded[r].sig.definition == decoded[0].sig.definition) continue;
    const std::string what =
        "execute: the ranks called execute on different fusions (or on one with different parameters) at "
        "the same step; every rank must execute the same definitions in the same order, one at a time, so none "
        "executes. ";
    try {
      checkProgramsAgree(definition_lines, world, timeout, "", "Their definitions differ (constants included)");
    } catch (const UserError& e) {
      throw UserError(what + e.what());
    }
    throw UserError(what + "Rank " + std::to_string(r) + "'s definition differs from rank 0's.");
  }
  InputSignature merged = *mine;
  for (size_t r = 0; r < decoded.size(); ++r) {
    const InputSignature& s = decoded[r].sig;
    if (s.trace != decoded[0].sig.trace)
      throw UserError("execute: rank " + std::to_string(decoded[0].sig.trace ? 0 : r) + " asks for a trace and rank " +
                      std::to_string(decoded[0].sig.trace ? r : 0) +
                      " does not: a trace is gathered from every rank, so pass the same trace= (or set "
                      "MESHFUSE_TRACE) on every rank; rank 0 writes the file");
    if (s.rng_seed != decoded[0].sig.rng_seed)
      throw UserError("execute: ranks disagree on MESHFUSE_SEED (" + seedText(decoded[0].sig.rng_seed) +
                      " on rank 0, " + seedText(s.rng_seed) + " on rank " + std::to_string(r) +
                      "): random tensors would differ between ranks; set the same seed on every rank");
    if ((s.given_rng_offset < 0) != (decoded[0].sig.given_rng_offset < 0))
      throw UserError("execute: rank " + std::to_string(decoded[0].sig.given_rng_offset < 0 ? r : 0) +
                      " passes an rng_offset (" +
                      offsetText(std::max(s.given_rng_offset, decoded[0].sig.given_rng_offset)) + ") and rank " +
                      std::to_string(decoded[0].sig.given_rng_offset < 0 ? 0 : r) +
                      " does not: random tensors would differ between ranks; pass one on every rank or on none");
    merged.rng_offset = std::max(merged.rng_offset, s.rng_offset);
    // The largest, as for the counter: ranks whose generators differ (torch seeded per rank) still draw
    // one mask, and a recomputation, each rank's generator restored, agrees on the same one again.
    merged.given_rng_offset = std::max(merged.given_rng_offset, s.given_rng_offset);
  }
  const auto& defs = fusion.inputs();
  for (size_t i = 0; i < defs.size(); ++i) {
    if (!defs[i]->isTensor()) {
      // A scalar input is one value for the whole program; ranks passing different ones would each
      // compute a different "replicated" result. (Compared bitwise: NaN agrees with NaN.)
      for (size_t r = 1; r < decoded.size(); ++r)
        if (std::memcmp(&decoded[r].sig.scalars[i], &decoded[0].sig.scalars[i], sizeof(double)) != 0) {
          std::ostringstream os;
          os << defs[i]->name() << " (input " << i << "): ranks pass different values for this scalar ("
             << decoded[0].sig.scalars[i] << " on rank 0, " << decoded[r].sig.scalars[i] << " on rank " << r
             << "); a scalar input is replicated, so pass the same value on every rank";
          throw UserError(os.str());
        }
      continue;
    }
    int first = -1;
    for (size_t r = 0; r < decoded.size(); ++r) {
      const InputSignature& s = decoded[r].sig;
      if (!s.present[i]) continue;
      if (first < 0) {
        first = static_cast<int>(r);
        merged.global[i] = s.global[i];
      } else if (s.global[i] != decoded[first].sig.global[i]) {
        throw UserError(defs[i]->name() + ": ranks disagree on its global shape: " +
                        shapeToString(decoded[first].sig.global[i]) + " on rank " + std::to_string(first) + " but " +
                        shapeToString(s.global[i]) + " on rank " + std::to_string(r));
      }
    }
    if (first < 0) throw UserError(defs[i]->name() + ": no rank holds this input (check its device mesh)");
    checkReplicasAgree(static_cast<const TensorView*>(defs[i]), i, decoded);
    if (!mine->present[i] && merged.device == DeviceType::CPU && decoded[first].sig.device != DeviceType::CPU)
      merged.device = decoded[first].sig.device;
  }
  return merged;
}

}  // namespace meshfuse
