#include "host_ir/consistency.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "host_ir/timeout_policy.h"
#include "multidevice/communicator.h"
#include "runtime/device_count.h"

namespace meshfuse {

uint64_t fingerprintHash(std::string_view bytes, uint64_t seed) {
  // Eight bytes a step, then the rest one at a time (about 7 GB/s: it also hashes input tensors).
  uint64_t h = seed;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes.data() + i, sizeof word);
    h = (h ^ word) * 1099511628211ull;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * 1099511628211ull;
  return h;
}

std::vector<std::string> programFingerprint(const Fusion& lowered, const InputSignature& sig,
                                            const MultiDeviceExecutorParams& params,
                                            CommunicatorBackend resolved_backend) {
  std::vector<std::string> lines;
  std::istringstream fusion_text(lowered.toString());
  for (std::string line; std::getline(fusion_text, line);) lines.push_back(line);
  for (size_t i = 0; i < sig.global.size() && i < lowered.inputs().size(); ++i) {
    const Val* v = lowered.inputs()[i];
    lines.push_back("input " + std::to_string(i) + " " + v->name() + ": " + toString(sig.dtypes[i]) +
                    (v->isTensor() ? " global shape " + shapeToString(sig.global[i]) : " scalar"));
  }
  lines.push_back("backend " + toString(resolved_backend));
  lines.push_back("number_of_streams " + std::to_string(params.executor.number_of_streams));
  return lines;
}

namespace {

template <typename T>
std::string packWords(const std::vector<T>& words) {
  std::string bytes(words.size() * sizeof(T), '\0');
  if (!words.empty()) std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

template <typename T>
std::vector<T> unpackWords(const std::string& bytes) {
  std::vector<T> words(bytes.size() / sizeof(T));
  if (!words.empty()) std::memcpy(words.data(), bytes.data(), words.size() * sizeof(T));
  return words;
}

// The first line index at which two programs (per-line hashes, counts) differ; -1 when equal.
int64_t firstDifference(const std::vector<uint64_t>& a, uint64_t a_count, const std::vector<uint64_t>& b,
                        uint64_t b_count) {
  for (uint64_t i = 0; i < std::max(a_count, b_count); ++i)
    if (i >= a_count || i >= b_count || a[2 * i] != b[2 * i]) return static_cast<int64_t>(i);
  return -1;
}

// Every member learns which members failed to lower (round 1 flagged them) and why, and throws.
[[noreturn]] void throwLoweringFailures(const std::vector<int64_t>& team, const std::vector<uint64_t>& failed,
                                        const std::string& error, std::chrono::milliseconds timeout) {
  std::vector<std::string> errors = Communicator::instance().allgatherBytes(team, error, timeout);
  std::vector<size_t> ranks;
  for (size_t r = 0; r < team.size(); ++r)
    if (failed[r]) ranks.push_back(r);
  std::ostringstream os;
  os << "rank" << (ranks.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << team[ranks[i]];
  os << " failed while lowering this fusion, so no rank executes";
  for (size_t r : ranks) os << "\n  rank " << team[r] << ": " << errors[r];
  throw UserError(os.str());
}

}  // namespace

void checkProgramsAgree(const std::vector<std::string>& lines, const std::vector<int64_t>& team,
                        std::chrono::milliseconds timeout, const std::string& error, const char* what) {
  Communicator& comm = Communicator::instance();
  std::vector<uint64_t> per_line;  // (hash, length) per line
  uint64_t total = fingerprintHash("");
  for (const std::string& line : lines) {
    uint64_t h = fingerprintHash(line);
    per_line.push_back(h);
    per_line.push_back(line.size());
    total = fingerprintHash(std::string_view(reinterpret_cast<const char*>(&h), sizeof(h)), total);
  }
  const uint64_t count = lines.size();

  // Round 1, the only one when all agree: (line count, hash of all lines, whether lowering failed).
  const uint64_t failed_here = error.empty() ? 0 : 1;
  std::vector<std::string> summaries =
      comm.allgatherBytes(team, packWords<uint64_t>({count, total, failed_here}), timeout);
  std::vector<uint64_t> counts, totals, failed;
  for (const std::string& s : summaries) {
    auto w = unpackWords<uint64_t>(s);
    counts.push_back(w.at(0));
    totals.push_back(w.at(1));
    failed.push_back(w.at(2));
  }
  if (std::any_of(failed.begin(), failed.end(), [](uint64_t f) { return f != 0; }))
    throwLoweringFailures(team, failed, error, timeout);
  std::vector<size_t> differing;
  for (size_t r = 1; r < team.size(); ++r)
    if (counts[r] != counts[0] || totals[r] != totals[0]) differing.push_back(r);
  if (differing.empty()) return;

  // Round 2: every line's (hash, length), padded to the longest program, to find the first
  // differing line.
  const uint64_t longest = *std::max_element(counts.begin(), counts.end());
  std::vector<uint64_t> padded = per_line;
  padded.resize(2 * longest, 0);
  std::vector<std::vector<uint64_t>> all_lines;
  for (const std::string& s : comm.allgatherBytes(team, packWords(padded), timeout))
    all_lines.push_back(unpackWords<uint64_t>(s));
  std::vector<int64_t> first_of(team.size(), -1);
  int64_t first = -1;
  for (size_t r : differing) {
    // Equal lines with different totals cannot happen; name line 1 then anyway.
    first_of[r] = std::max<int64_t>(0, firstDifference(all_lines[0], counts[0], all_lines[r], counts[r]));
    if (first < 0 || first_of[r] < first) first = first_of[r];
  }
  const auto k = static_cast<uint64_t>(first);

  // Round 3: the text of line k on every member (a flag byte: 0 = the program has no line k).
  uint64_t widest = 0;
  for (size_t r = 0; r < team.size(); ++r)
    if (k < counts[r]) widest = std::max(widest, all_lines[r][2 * k + 1]);
  std::string mine(1 + widest, '\0');
  if (k < count) {
    mine[0] = 1;
    std::memcpy(mine.data() + 1, lines[k].data(), lines[k].size());
  }
  std::vector<std::string> texts = comm.allgatherBytes(team, mine, timeout);
  auto textOf = [&](size_t r) {
    if (texts[r].empty() || texts[r][0] == 0) return std::string("(the program ends before this line)");
    return "'" + texts[r].substr(1, all_lines[r][2 * k + 1]) + "'";
  };

  std::ostringstream os;
  os << (what != nullptr ? what
                         : "the ranks lowered different programs for this fusion, so none executes (each rank must "
                           "run the same definition, with inputs of the same global shapes and dtypes, and the same "
                           "parameters)")
     << ": rank";
  os << (differing.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < differing.size(); ++i) os << (i ? ", " : "") << team[differing[i]];
  os << " differ" << (differing.size() > 1 ? "" : "s") << " from rank " << team[0] << "; the first difference is line "
     << k + 1 << ":\n  rank " << team[0] << ": " << textOf(0);
  for (size_t r : differing) {
    os << "\n  rank " << team[r] << ": ";
    if (first_of[r] == first)
      os << textOf(r);
    else
      os << "(the same; its first difference is line " << first_of[r] + 1 << ")";
  }
  throw UserError(os.str());
}

void checkNewProgramAgrees(const Fusion* lowered, std::exception_ptr failure, const InputSignature& sig,
                           const MultiDeviceExecutorParams& params, Device device, std::chrono::milliseconds timeout) {
  Communicator& comm = Communicator::instance();
  std::vector<std::string> lines;
  std::string error;
  if (lowered) {
    lines = programFingerprint(*lowered, sig, params, comm.resolve(params.lower.communicator_backend, device));
  } else {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "an unknown exception";
    }
    if (error.empty()) error = "(an exception without a message)";  // round 1 tells failure by a non-empty error
  }
  // `auto` picks each team's backend from the node table (the same everywhere) and this node's GPU
  // count, taken to stand for every node's: nodes that differ would pick different backends.
  if (lowered && params.lower.communicator_backend == CommunicatorBackend::Auto && device.type == DeviceType::CUDA)
    lines.push_back("auto: GPUs on the node " + std::to_string(cudaDeviceCountOrZero()));
  std::vector<int64_t> world(static_cast<size_t>(comm.size()));
  for (int64_t r = 0; r < comm.size(); ++r) world[static_cast<size_t>(r)] = r;
  withTimeoutPolicy("in the consistency check of a new program over the world (backend mpi)", [&] {
    try {
      checkProgramsAgree(lines, world, timeout, error);
    } catch (const UserError&) {
      if (failure) std::rethrow_exception(failure);  // the failing rank raises its own error
      throw;
    }
  });
}

}  // namespace meshfuse
