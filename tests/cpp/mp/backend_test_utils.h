// Helpers for the backend suites (every backend of the Backend interface, on host tensors):
// the teams they run on, each team rank's seeded contribution (so every rank can recompute all of
// them), float64 references for the reductions with per-dtype tolerances, and element checks.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "multidevice/communicator.h"
#include "runtime/element.h"

namespace meshfuse::testing {

constexpr std::chrono::seconds kWait(60);
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};

enum class TeamKind { World, Reversed, Parity };

inline std::vector<int64_t> teamOf(TeamKind kind) {
  const int64_t n = Communicator::instance().size(), me = Communicator::instance().rank();
  std::vector<int64_t> team;
  for (int64_t r = 0; r < n; ++r)
    if (kind != TeamKind::Parity || r % 2 == me % 2) team.push_back(r);
  if (kind == TeamKind::Reversed) std::reverse(team.begin(), team.end());
  return team;
}

// Team rank `who`'s contribution: values exactly representable in `dtype`, in ranges where the
// reduction `op` neither overflows nor loses everything (products of numbers near 1).
inline std::vector<double> contribution(uint64_t seed, int64_t who, int64_t numel, DataType dtype,
                                        ReduceOp op = ReduceOp::Sum) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(who));
  std::vector<double> v(static_cast<size_t>(numel));
  for (double& x : v) {
    if (dtype == DataType::Bool) {
      const double p_true = (op == ReduceOp::Prod || op == ReduceOp::Min) ? 0.8 : 0.3;  // and / or: both outcomes
      x = std::bernoulli_distribution(p_true)(rng) ? 1 : 0;
    } else if (isIntegral(dtype)) {
      x = static_cast<double>(op == ReduceOp::Prod ? std::uniform_int_distribution<int>(-3, 3)(rng)
                                                   : std::uniform_int_distribution<int>(-50, 50)(rng));
    } else if (op == ReduceOp::Prod) {
      x = std::uniform_real_distribution<double>(0.5, 2.0)(rng) * (std::bernoulli_distribution(0.5)(rng) ? 1 : -1);
    } else {
      x = std::uniform_real_distribution<double>(-4.0, 4.0)(rng);
    }
    unsigned char bytes[8];
    storeFromDouble(bytes, dtype, x);  // round to the dtype, so the reference sees what the backend sees
    x = loadAsDouble(bytes, dtype);
  }
  return v;
}

inline Tensor tensorOf(const std::vector<double>& values, DataType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, dtype);
  for (size_t i = 0; i < values.size(); ++i)
    storeFromDouble(static_cast<char*>(t.data()) + i * t.itemsize(), dtype, values[i]);
  return t;
}

inline std::vector<double> concat(const std::vector<std::vector<double>>& parts) {
  std::vector<double> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline std::vector<double> slice(const std::vector<double>& v, int64_t start, int64_t length) {
  return {v.begin() + start, v.begin() + start + length};
}

// The float64 reduction over contributions, and per element the tolerance the dtype's rounding
// after each of the (n - 1) combining steps allows.
struct Reduced {
  std::vector<double> value, tolerance;
};

inline Reduced reduceReference(const std::vector<std::vector<double>>& parts, ReduceOp op, DataType dtype) {
  const double eps = dtype == DataType::Float      ? std::ldexp(1.0, -22)
                     : dtype == DataType::Double   ? std::ldexp(1.0, -50)
                     : dtype == DataType::Half     ? std::ldexp(1.0, -10)
                     : dtype == DataType::BFloat16 ? std::ldexp(1.0, -7)
                                                   : 0.0;  // integers and Bool are exact
  const size_t numel = parts[0].size();
  Reduced r{parts[0], std::vector<double>(numel, 0.0)};
  for (size_t k = 0; k < numel; ++k) {
    double magnitude = std::abs(parts[0][k]);
    for (size_t p = 1; p < parts.size(); ++p) {
      const double x = parts[p][k];
      double& acc = r.value[k];
      if (dtype == DataType::Bool) {
        const bool any = op == ReduceOp::Sum || op == ReduceOp::Max;
        const bool result = any ? (acc != 0 || x != 0) : (acc != 0 && x != 0);
        acc = result ? 1.0 : 0.0;
        continue;
      }
      switch (op) {
        case ReduceOp::Sum:
          acc += x;
          magnitude += std::abs(x);
          break;
        case ReduceOp::Prod:
          acc *= x;
          magnitude = std::abs(acc);
          break;
        case ReduceOp::Max: acc = std::max(acc, x); break;
        case ReduceOp::Min: acc = std::min(acc, x); break;
      }
    }
    const bool rounds = op == ReduceOp::Sum || op == ReduceOp::Prod;
    r.tolerance[k] = rounds ? eps * static_cast<double>(parts.size()) * magnitude : 0.0;
  }
  return r;
}

inline void expectValues(const Tensor& actual, const std::vector<double>& expected,
                         const std::vector<double>& tolerance, const std::string& what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  int bad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double got = actual.item(static_cast<int64_t>(i));
    const double tol = tolerance.empty() ? 0.0 : tolerance[i];
    if (std::abs(got - expected[i]) > tol && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << got << ", expected " << expected[i] << " (tolerance "
                    << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << expected.size() << " elements wrong";
}

inline void expectExact(const Tensor& actual, const std::vector<double>& expected, const std::string& what) {
  expectValues(actual, expected, {}, what);
}

// The message of the `E` that `f` throws ("" when it throws nothing; another exception escapes).
template <typename E, typename F>
std::string messageOf(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace meshfuse::testing
