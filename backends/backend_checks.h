// Argument checks shared by the host-memory backends (MPI, Gloo): every rank throws the same
// std::invalid_argument before any communication starts, naming the operation (`op`, e.g.
// "gloo allgather"), the tensor and what was expected.
#pragma once
#include <cstdint>
#include <string>

#include "backends/backend.h"

namespace meshfuse::checks {

// Defined, contiguous, and on a device `backend` can take.
void tensor(const Backend& backend, const std::string& op, const char* name, const Tensor& t);
void sameDtype(const Backend& backend, const std::string& op, const char* a_name, const Tensor& a, const char* b_name,
               const Tensor& b);
void numel(const std::string& op, const char* name, int64_t actual, int64_t expected, const std::string& why);
// `whole` must be teamSize() blocks of `block`'s size and dtype (allgather, gather, ...).
void blocks(const Backend& backend, const std::string& op, const char* whole_name, const Tensor& whole,
            const char* block_name, const Tensor& block);
// All-to-all: `output` like `input` (dtype, element count), and `input` splits into teamSize() blocks.
void allToAll(const Backend& backend, const std::string& op, const Tensor& input, const Tensor& output);
// `what` is "root" or "peer": a team rank, 0 .. teamSize()-1.
void teamRank(const Backend& backend, const std::string& op, const char* what, int64_t rank);

}  // namespace meshfuse::checks
