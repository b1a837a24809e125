#include "backends/backend_checks.h"

#include <stdexcept>

namespace meshfuse::checks {

void tensor(const Backend& backend, const std::string& op, const char* name, const Tensor& t) {
  if (!t.defined()) throw std::invalid_argument(op + ": " + name + " is undefined");
  if (!t.isContiguous()) throw std::invalid_argument(op + ": " + name + " " + t.toString() + " is not contiguous");
  if (!backend.supports(t.device()))
    throw std::invalid_argument(op + ": " + name + " is on " + t.device().toString() +
                                ", which this build cannot stage through host memory (built without CUDA)");
}

void sameDtype(const Backend& backend, const std::string& op, const char* a_name, const Tensor& a, const char* b_name,
               const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(op + ": " + a_name + " is " + toString(a.dtype()) + " but " + b_name + " is " +
                                toString(b.dtype()) + "; the " + toString(backend.type()) +
                                " backend does not convert");
}

void numel(const std::string& op, const char* name, int64_t actual, int64_t expected, const std::string& why) {
  if (actual != expected)
    throw std::invalid_argument(op + ": " + name + " has " + std::to_string(actual) + " elements, expected " +
                                std::to_string(expected) + " (" + why + ")");
}

void blocks(const Backend& backend, const std::string& op, const char* whole_name, const Tensor& whole,
            const char* block_name, const Tensor& block) {
  tensor(backend, op, whole_name, whole);
  sameDtype(backend, op, whole_name, whole, block_name, block);
  numel(op, whole_name, whole.numel(), backend.teamSize() * block.numel(),
        "team size " + std::to_string(backend.teamSize()) + " x " + block_name + " " + std::to_string(block.numel()));
}

void allToAll(const Backend& backend, const std::string& op, const Tensor& input, const Tensor& output) {
  tensor(backend, op, "input", input);
  tensor(backend, op, "output", output);
  sameDtype(backend, op, "input", input, "output", output);
  numel(op, "output", output.numel(), input.numel(), "the same as input");
  if (input.numel() % backend.teamSize() != 0)
    throw std::invalid_argument(op + ": input has " + std::to_string(input.numel()) +
                                " elements, not divisible by the team size " + std::to_string(backend.teamSize()));
}

void teamRank(const Backend& backend, const std::string& op, const char* what, int64_t rank) {
  if (rank < 0 || rank >= backend.teamSize())
    throw std::invalid_argument(op + ": " + what + " " + std::to_string(rank) + " is not a team rank (team " +
                                teamToString(backend.team()) + " has " + std::to_string(backend.teamSize()) +
                                " members)");
}

}  // namespace meshfuse::checks
