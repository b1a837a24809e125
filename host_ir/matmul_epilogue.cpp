#include "host_ir/matmul_epilogue.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "ir/pointwise_probe.h"

namespace meshfuse {

namespace {

// Where a chain must agree with the function it is taken for: 33 points over [-5, 5] (past which
// the tanh GELU is the identity or zero to float precision), shifted off the grid's simple values.
std::vector<double> probePoints() {
  std::vector<double> u;
  for (int i = 0; i <= 32; ++i) u.push_back(-5.0 + 10.0 * i / 32 + 0.0137);
  return u;
}

bool close(double got, double want) { return std::abs(got - want) <= 1e-6 * (1.0 + std::abs(want)); }

bool isGeluTanhOf(const Val* root, const Val* u) {
  for (double x : probePoints()) {
    std::optional<double> got = probePointwise(root, {{u, x}});
    if (!got || !close(*got, geluTanh(x))) return false;
  }
  return true;
}

// root(g, a) = g * gelu_tanh'(a), at each probe point with three values of g (so that the chain is
// seen to be linear in g, not only equal at one).
bool isGeluTanhGradOf(const Val* root, const Val* g, const Val* a) {
  for (double x : probePoints())
    for (double dy : {1.0, -0.625, 2.375}) {
      std::optional<double> got = probePointwise(root, {{g, dy}, {a, x}});
      if (!got || !close(*got, dy * geluTanhGrad(x))) return false;
    }
  return true;
}

// Pointwise ops a probe can evaluate (ir/pointwise_probe.h): the only ones an epilogue chain holds.
bool analytic(const Expr* e) {
  switch (e->op()) {
    case OpType::Set:
    case OpType::Cast:
    case OpType::Neg:
    case OpType::Square:
    case OpType::Exp:
    case OpType::Tanh:
    case OpType::Sqrt:
    case OpType::Rsqrt:
    case OpType::Reciprocal:
    case OpType::Add:
    case OpType::Sub:
    case OpType::Mul:
    case OpType::Div:
    case OpType::Pow: break;
    default: return false;
  }
  for (const Val* v : e->inputs())
    if (!isFloatingPoint(v->dtype()) || (!v->isTensor() && !static_cast<const Scalar*>(v)->isConstant())) return false;
  return true;
}

class Finder {
 public:
  Finder(const Fusion& fusion, const std::function<bool(const Expr*)>& local)
      : fusion_(fusion), local_(local), live_(fusion.liveExprs()) {
    for (size_t i = 0; i < live_.size(); ++i) position_[live_[i]] = i;
  }

  std::unordered_map<const Expr*, EpilogueFold> find() {
    std::unordered_map<const Expr*, EpilogueFold> folds;
    for (const Expr* e : live_) {
      if ((e->op() != OpType::Matmul && e->op() != OpType::Linear) || !local_(e)) continue;
      if (!isFloatingPoint(e->out()->dtype())) continue;
      if (auto fold = foldAfter(e)) {
        for (const Expr* f : fold->exprs) claimed_.insert(f);
        folds[e] = std::move(*fold);
      }
    }
    return folds;
  }

 private:
  bool liveUse(const Expr* use) const { return position_.count(use) > 0; }

  // Every live expr that reads `v` is one of `members`.
  bool readOnlyWithin(const Val* v, const std::unordered_set<const Expr*>& members) const {
    return std::all_of(v->uses().begin(), v->uses().end(),
                       [&](const Expr* use) { return !liveUse(use) || members.count(use) > 0; });
  }

  // The exprs after `matmul` that could move up to it: pointwise analytic exprs (and a reshape of
  // the product itself) whose tensor inputs are the product, values of earlier such exprs, or
  // values that exist before the matmul. `from_product` receives the values that depend on the
  // product (the candidate epilogue results).
  std::vector<const Expr*> regionAfter(const Expr* matmul, std::unordered_set<const Val*>& from_product) const {
    const TensorView* product = matmul->out();
    const size_t at = position_.at(matmul);
    from_product = {product};
    std::unordered_set<const Val*> in_region{product};
    std::vector<const Expr*> region;
    for (size_t i = at + 1; i < live_.size(); ++i) {
      const Expr* e = live_[i];
      if (claimed_.count(e) || !local_(e)) continue;
      const bool reshape_of_product = e->op() == OpType::Reshape && e->input(0) == product;
      if (!reshape_of_product && !(isPointwise(e->op()) && analytic(e))) continue;
      bool reads_product = false, available = true;
      for (const Val* v : e->inputs()) {
        if (!v->isTensor()) continue;
        reads_product = reads_product || from_product.count(v) > 0;
        if (in_region.count(v)) continue;
        const Expr* def = v->definition();
        available = available && (def == nullptr || (position_.count(def) && position_.at(def) < at));
      }
      if (!available) continue;
      region.push_back(e);
      in_region.insert(e->outputs().begin(), e->outputs().end());
      if (reads_product) from_product.insert(e->outputs().begin(), e->outputs().end());
    }
    return region;
  }

  // The exprs of `region` that `root` is computed from, in definition order.
  static std::vector<const Expr*> sliceOf(const Val* root, const std::vector<const Expr*>& region) {
    std::unordered_set<const Val*> needed{root};
    std::vector<const Expr*> slice;
    for (auto it = region.rbegin(); it != region.rend(); ++it) {
      if (!needed.count((*it)->out())) continue;
      slice.push_back(*it);
      needed.insert((*it)->inputs().begin(), (*it)->inputs().end());
    }
    std::reverse(slice.begin(), slice.end());
    return slice;
  }

  // Leaves of the slice computed before the matmul by pointwise exprs that only the slice reads
  // join it, with their own producers of that kind (the backward casts the saved GELU input to
  // fp32 before the matmul that computes the gradient it multiplies). The slice stays in
  // definition order.
  void pullInPrivateProducers(std::vector<const Expr*>& slice, const Expr* matmul) const {
    const size_t at = position_.at(matmul);
    for (bool grew = true; grew;) {
      grew = false;
      std::unordered_set<const Expr*> members(slice.begin(), slice.end());
      for (const Expr* e : std::vector<const Expr*>(slice)) {
        for (const Val* v : e->inputs()) {
          const Expr* def = v->definition();
          if (!v->isTensor() || def == nullptr || members.count(def) || claimed_.count(def)) continue;
          if (!position_.count(def) || position_.at(def) >= at || !local_(def)) continue;
          if (!isPointwise(def->op()) || !analytic(def) || fusion_.isOutput(v)) continue;
          if (!readOnlyWithin(v, members)) continue;
          slice.push_back(def);
          members.insert(def);
          grew = true;
        }
      }
    }
    std::sort(slice.begin(), slice.end(),
              [&](const Expr* a, const Expr* b) { return position_.at(a) < position_.at(b); });
  }

  // Every value the slice computes, but the root, is read only inside it and is not an output.
  bool privateInterior(const std::vector<const Expr*>& slice, const Val* root) const {
    std::unordered_set<const Expr*> members(slice.begin(), slice.end());
    for (const Expr* e : slice) {
      const Val* v = e->out();
      if (v == root) continue;
      if (fusion_.isOutput(v) || !readOnlyWithin(v, members)) return false;
    }
    return true;
  }

  std::optional<EpilogueFold> foldAfter(const Expr* matmul) const {
    const TensorView* product = matmul->out();
    std::unordered_set<const Val*> from_product;
    const std::vector<const Expr*> region = regionAfter(matmul, from_product);
    for (auto it = region.rbegin(); it != region.rend(); ++it) {
      const TensorView* root = (*it)->out();
      // The epilogue stores in the product's type, a value computed from the product.
      if (root->dtype() != product->dtype() || !from_product.count(root)) continue;
      std::vector<const Expr*> slice = sliceOf(root, region);
      pullInPrivateProducers(slice, matmul);
      if (!privateInterior(slice, root)) continue;
      // The chain's leaves: the product (or its reshape, which stands for it) and what else it reads.
      const Val* reshaped = nullptr;
      std::unordered_set<const Val*> produced, leaves;
      for (const Expr* e : slice) {
        if (e->op() == OpType::Reshape)
          reshaped = e->out();
        else
          produced.insert(e->out());
      }
      for (const Expr* e : slice)
        for (const Val* v : e->inputs())
          if (v->isTensor() && !produced.count(v) && e->op() != OpType::Reshape) leaves.insert(v);
      EpilogueFold fold;
      // The reshape first: an executor that runs the exprs then fuses all the pointwise ones.
      std::stable_partition(slice.begin(), slice.end(), [](const Expr* e) { return e->op() == OpType::Reshape; });
      fold.exprs = slice;
      fold.epilogue.result = root;
      if (!reshaped && leaves.size() == 1 && leaves.count(product) && isGeluTanhOf(root, product)) {
        fold.epilogue.kind = MatmulEpilogue::Kind::GeluTanh;
        return fold;
      }
      // The gradient: the product (or its reshape) times gelu'(aux); the product is not stored, so
      // nothing else may read it.
      const bool linear_with_bias = matmul->op() == OpType::Linear && matmul->inputs().size() > 2;
      if (linear_with_bias || leaves.size() != 2 || fusion_.isOutput(product)) continue;
      const Val* g = reshaped ? reshaped : product;
      if (!leaves.count(g)) continue;
      if (reshaped && leaves.count(product)) continue;
      leaves.erase(g);
      const auto* aux = static_cast<const TensorView*>(*leaves.begin());
      // (Shapes are checked where they are known, at execution: an executor runs the exprs when
      // aux is not the result's shape.)
      if (!readOnlyWithin(product, {slice.begin(), slice.end()}) || aux->dtype() != product->dtype()) continue;
      if (!isGeluTanhGradOf(root, g, aux)) continue;
      fold.epilogue.kind = MatmulEpilogue::Kind::GeluTanhGrad;
      fold.epilogue.aux = aux;
      addBiasGradient(fold);
      return fold;
    }
    return std::nullopt;
  }

  // The only live use of `v`, when it is local and unclaimed and `v` is not a fusion output.
  const Expr* soleFoldableUse(const Val* v) const {
    const Expr* only = nullptr;
    for (const Expr* use : v->uses()) {
      if (!liveUse(use)) continue;
      if (only != nullptr) return nullptr;
      only = use;
    }
    if (only == nullptr || fusion_.isOutput(v) || claimed_.count(only) || !local_(only)) return nullptr;
    return only;
  }

  // A linear's bias gradient read from the gradient result: sum over every axis but the last, of
  // the result or of its widening cast, stored in the result's dtype (by a cast back when the sum
  // is wider). cuBLASLt's DGELU_BGRAD computes it in the same GEMM.
  void addBiasGradient(EpilogueFold& fold) const {
    const TensorView* result = fold.epilogue.result;
    for (const Expr* use : result->uses()) {
      if (!liveUse(use) || claimed_.count(use) || !local_(use)) continue;
      std::vector<const Expr*> chain;
      const Expr* sum = use;
      if (use->op() == OpType::Cast) {
        if (!isFloatingPoint(use->out()->dtype()) || dataTypeSize(use->out()->dtype()) < dataTypeSize(result->dtype()))
          continue;
        chain.push_back(use);
        sum = soleFoldableUse(use->out());
      }
      if (sum == nullptr || sum->op() != OpType::Sum || sum->attrs().keepdim) continue;
      const int64_t rank = result->ndim();
      std::vector<int64_t> axes = sum->attrs().axes;
      std::sort(axes.begin(), axes.end());
      std::vector<int64_t> leading(static_cast<size_t>(rank - 1));
      for (int64_t i = 0; i < rank - 1; ++i) leading[static_cast<size_t>(i)] = i;
      if (axes != leading) continue;
      chain.push_back(sum);
      const TensorView* grad = sum->out();
      if (grad->dtype() != result->dtype()) {
        const Expr* back = soleFoldableUse(grad);
        if (back == nullptr || back->op() != OpType::Cast || back->out()->dtype() != result->dtype()) continue;
        chain.push_back(back);
        grad = back->out();
      }
      fold.exprs.insert(fold.exprs.end(), chain.begin(), chain.end());
      fold.epilogue.bias_grad = grad;
      return;
    }
  }

  const Fusion& fusion_;
  const std::function<bool(const Expr*)>& local_;
  std::vector<Expr*> live_;
  std::unordered_map<const Expr*, size_t> position_;
  std::unordered_set<const Expr*> claimed_;
};

}  // namespace

std::unordered_map<const Expr*, EpilogueFold> findMatmulEpilogues(const Fusion& fusion,
                                                                  const std::function<bool(const Expr*)>& local) {
  return Finder(fusion, local).find();
}

}  // namespace meshfuse
