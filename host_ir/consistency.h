// The consistency check of a newly lowered program: before its first communication, the ranks of
// the world compare what they lowered, so a rank whose definition, input shapes, dtypes or
// parameters differ fails with a UserError on every rank (naming the ranks and the first line
// that differs) instead of posting collectives that never match. Paid once per cached program.
#pragma once
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "host_ir/fusion_executor.h"
#include "host_ir/input_check.h"

namespace meshfuse {

// The rank-independent description of a lowered program: the lines of the resharded fusion's
// toString(), then the bound global shape and dtype of every input, the resolved backend and the
// executor parameters that shape the program. Equal on two ranks iff they lowered the same program.
std::vector<std::string> programFingerprint(const Fusion& lowered, const InputSignature& sig,
                                            const MultiDeviceExecutorParams& params,
                                            CommunicatorBackend resolved_backend);

// Collective over `team` (world ranks; every member calls it): compares the members' lines.
// Returns when all are equal (one allgather of 24 bytes); otherwise every member throws the same
// UserError naming the ranks that differ from the team's first rank and the text, on each of
// them, of the first line that differs. CommunicationTimeout when a member does not arrive.
// A member that could not lower its program passes its error instead of lines (`error` not
// empty): every member then throws a UserError naming the failing ranks and their errors, at
// once, rather than the others waiting for lines that never come. `what` opens the message (null:
// "the ranks lowered different programs for this fusion, ...").
void checkProgramsAgree(const std::vector<std::string>& lines, const std::vector<int64_t>& team,
                        std::chrono::milliseconds timeout, const std::string& error = "", const char* what = nullptr);

// The executor's call after lowering a new program on `device`: the fingerprint of this rank's
// `lowered` program, compared over the world (a CommunicationTimeout goes to the timeout policy).
// `lowered` is null when lowering failed here with `failure`: this rank joins the check with that
// error, the others raise a UserError naming it, and this rank rethrows `failure`.
void checkNewProgramAgrees(const Fusion* lowered, std::exception_ptr failure, const InputSignature& sig,
                           const MultiDeviceExecutorParams& params, Device device, std::chrono::milliseconds timeout);

// FNV-1a, 64 bit, over 8-byte words: the same on every rank and build (std::hash is not).
uint64_t fingerprintHash(std::string_view bytes, uint64_t seed = 1469598103934665603ull);

}  // namespace meshfuse
