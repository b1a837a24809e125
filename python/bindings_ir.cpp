// Bindings of the IR (ir/ir.h) and the ops that build it (ops/ops.h).
//
// Ownership: a Fusion is held by std::shared_ptr (FusionExecutorCache shares it); its Vals are owned
// by the Fusion and exposed without a deleter. Every Val handed to Python keeps its Fusion's Python
// object alive (toPython), so no Python object can outlive the memory it points to.
#include <pybind11/stl.h>

#include <sstream>

#include "ir/ir.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace meshfuse::python {

namespace {

template <typename T>
using NoDelete = std::unique_ptr<T, py::nodelete>;

// The Python object of a Val's Fusion (the one Python created; pybind11 finds it by address).
py::object fusionObject(const Val* v) { return py::cast(v->fusion(), py::return_value_policy::reference); }

// A Val for Python, tied to its Fusion's lifetime. (Not py::keep_alive<0, 1>: pybind11 3.1 runs that
// policy even when argument conversion failed, on its "try the next overload" sentinel, and crashes.)
// An object Python already holds for v comes back from py::cast as is, already tied: tying it again
// appended to pybind11's list of its patients every time (fd._fusion.outputs() does it on every
// execute: 8-16 bytes per held tensor per execute, for as long as the script held the tensor).
py::object toPython(Val* v) {
  py::object o = py::cast(v, py::return_value_policy::reference);
  if (!reinterpret_cast<py::detail::instance*>(o.ptr())->has_patients) py::detail::keep_alive_impl(o, fusionObject(v));
  return o;
}

// Wraps an op so that its result goes through toPython.
template <typename... Args>
auto owned(TensorView* (*op)(Args...)) {
  return [op](Args... args) { return toPython(op(std::forward<Args>(args)...)); };
}

// tv.axis(i): one axis of a TensorView's loop domain, so that `tv.axis(0).parallelize(p)` reads as
// in nvFuser. It refers to the TensorView (kept alive by the Python object) by index.
struct LoopAxisRef {
  TensorView* tv;
  int64_t index;
  py::object fusion;  // keeps tv's Fusion alive

  const LoopAxis& axis() const {
    if (index >= static_cast<int64_t>(tv->loop().size()))
      throw UserError(tv->name() + ": axis(" + std::to_string(index) + ") no longer exists: the loop domain has " +
                      std::to_string(tv->loop().size()) + " axes");
    return tv->loop()[index];
  }
  // The loop axis's extent when its logical axis has extent `logical` (-1: symbolic, and so is the
  // result unless the split fixes it). A level-1 part splits the inner part of the first split.
  int64_t extentGiven(int64_t logical) const {
    const LoopAxis& a = axis();
    if (a.part == LoopAxis::Part::Whole) return logical;
    int64_t base = logical;
    if (a.level > 0 && logical >= 0) base = a.parent_outer_split ? logical / a.parent_factor : a.parent_factor;
    if (a.level > 0 && logical < 0 && !a.parent_outer_split) base = a.parent_factor;
    bool given = (a.part == LoopAxis::Part::Outer) == a.outer_split;
    if (given) return a.factor;
    return base < 0 ? -1 : base / a.factor;
  }
  int64_t extent() const { return extentGiven(tv->shape()[axis().logical]); }
};

LoopAxisRef axisOf(TensorView* tv, int64_t i) {
  int64_t n = static_cast<int64_t>(tv->loop().size());
  int64_t index = i < 0 ? i + n : i;
  if (index < 0 || index >= n)
    throw UserError(tv->name() + ": axis(" + std::to_string(i) + ") but the loop domain " + tv->loopToString() +
                    " has " + std::to_string(n) + " axes" + tv->loopDomainHint());
  return {tv, index, fusionObject(tv)};
}

void bindEnums(py::module_& m) {
  py::enum_<DataType>(m, "DataType")
      .value("Float", DataType::Float)
      .value("Double", DataType::Double)
      .value("Half", DataType::Half)
      .value("BFloat16", DataType::BFloat16)
      .value("Int", DataType::Int)
      .value("Int32", DataType::Int32)
      .value("Bool", DataType::Bool);
  m.def("data_type_size", &dataTypeSize, "Bytes per element of a DataType");
  m.def("promote_types", &promoteTypes, "The DataType of `a op b`");

  py::enum_<ParallelType>(m, "ParallelType")
      .value("serial", ParallelType::Serial)
      .value("mesh_x", ParallelType::MeshX)
      .value("mesh_y", ParallelType::MeshY)
      .value("mesh_z", ParallelType::MeshZ)
      .value("stream", ParallelType::Stream);
}

void bindVals(py::module_& m) {
  py::class_<Val, NoDelete<Val>>(m, "Val")
      .def_property_readonly("name", &Val::name)
      .def_property_readonly("dtype", &Val::dtype)
      .def_property_readonly("is_tensor", &Val::isTensor)
      .def("__repr__", &Val::name);

  py::class_<Scalar, Val, NoDelete<Scalar>>(m, "Scalar")
      .def_property_readonly("value", &Scalar::value)
      .def_property_readonly("is_constant", &Scalar::isConstant);

  py::class_<LoopAxisRef>(m, "LoopAxis")
      .def_property_readonly("extent", &LoopAxisRef::extent)
      .def("extent_given", &LoopAxisRef::extentGiven, py::arg("logical_extent"),
           "The extent for a given extent of the logical axis (e.g. of a global array)")
      .def_property_readonly("logical_axis", [](const LoopAxisRef& a) { return a.axis().logical; })
      .def_property_readonly("parallel_type", [](const LoopAxisRef& a) { return a.axis().parallel; })
      .def(
          "parallelize", [](LoopAxisRef& a, ParallelType p) { a.tv->parallelize(a.index, p); },
          py::arg("parallel_type"))
      .def("__repr__", [](const LoopAxisRef& a) {
        return a.tv->name() + ".axis(" + std::to_string(a.index) + ") of " + a.tv->loopToString();
      });

  py::class_<TensorView, Val, NoDelete<TensorView>>(m, "TensorView")
      .def_property_readonly("shape", &TensorView::shape)
      .def_property_readonly("ndim", &TensorView::ndim)
      .def_property_readonly("contiguity", &TensorView::contiguity)
      .def("is_contiguous", &TensorView::isContiguous)
      .def("set_device_mesh", &TensorView::setDeviceMesh, py::arg("mesh"))
      .def_property_readonly("device_mesh", &TensorView::deviceMesh)
      .def("split", &TensorView::split, py::arg("axis"), py::arg("factor"), py::arg("inner_split") = true)
      .def("outer_split", &TensorView::outerSplit, py::arg("axis"), py::arg("parts"))
      .def("parallelize", &TensorView::parallelize, py::arg("axis"), py::arg("parallel_type"))
      .def("axis", &axisOf, py::arg("index"))
      .def(
          "shard_like",
          [](TensorView& tv, const TensorView& other) {
            if (tv.ndim() != other.ndim())
              throw UserError("shard_like: " + tv.name() + " has " + std::to_string(tv.ndim()) + " dimensions, " +
                              other.name() + " has " + std::to_string(other.ndim()));
            if (!other.hasDeviceMesh()) throw UserError("shard_like: " + other.name() + " has no device mesh");
            tv.setDeviceMesh(*other.deviceMesh());
            tv.setLoop(other.loop());
          },
          py::arg("other"), "Gives this tensor other's device mesh and loop domain (splits and parallel types)")
      .def_property_readonly("num_loop_axes", [](const TensorView& tv) { return tv.loop().size(); })
      .def_property_readonly("loop", &TensorView::loopToString)
      .def("sharded_axis", &TensorView::shardedAxis, py::arg("parallel_type"),
           "The logical axis sharded over the parallel type's mesh dimension, or -1")
      .def_property_readonly("is_sharded", &TensorView::isSharded)
      .def("__repr__", [](const TensorView& tv) {
        std::ostringstream os;
        os << tv.name() << "(" << toString(tv.dtype()) << ", shape=[";
        for (size_t i = 0; i < tv.shape().size(); ++i) os << (i ? ", " : "") << tv.shape()[i];
        os << "], loop=" << tv.loopToString();
        if (tv.hasDeviceMesh()) os << ", " << tv.deviceMesh()->toString();
        os << ")";
        return os.str();
      });
}

Val* notNone(Val* v, const char* what) {
  if (v == nullptr) throw UserError(std::string(what) + ": expected a TensorView or Scalar, got None");
  return v;
}

py::list valsOf(const std::vector<Val*>& vals) {
  py::list out;
  for (Val* v : vals) out.append(toPython(v));
  return out;
}

void bindFusion(py::module_& m) {
  py::class_<Fusion, std::shared_ptr<Fusion>>(m, "Fusion")
      .def(py::init<>())
      .def(
          "new_tensor",
          [](Fusion& f, DataType dtype, std::vector<int64_t> shape, std::vector<bool> contiguity) {
            return toPython(f.newTensor(dtype, std::move(shape), std::move(contiguity)));
          },
          py::arg("dtype"), py::arg("shape"), py::arg("contiguity") = std::vector<bool>{})
      .def(
          "new_scalar",
          [](Fusion& f, DataType dtype, std::optional<double> value) { return toPython(f.newScalar(dtype, value)); },
          py::arg("dtype"), py::arg("value") = py::none())
      .def(
          "add_input", [](Fusion& f, Val* v) { f.addInput(notNone(v, "add_input")); }, py::arg("val"))
      .def(
          "add_output", [](Fusion& f, Val* v) { f.addOutput(notNone(v, "add_output")); }, py::arg("val"))
      .def("inputs", [](const Fusion& f) { return valsOf(f.inputs()); })
      .def("outputs", [](const Fusion& f) { return valsOf(f.outputs()); })
      .def(
          "owns", [](const Fusion& f, const Val* v) { return f.owns(v); }, py::arg("val"))
      .def("is_input", &Fusion::isInput, py::arg("val"))
      .def("is_output", &Fusion::isOutput, py::arg("val"))
      .def("__str__", &Fusion::toString)
      .def("to_string", &Fusion::toString);
}

void bindOps(py::module_& m) {
  py::module_ ops = m.def_submodule("ops", "Ops that append one expression to their operands' fusion");

  const std::pair<const char*, OpType> unary_ops[] = {{"neg", OpType::Neg},
                                                      {"abs", OpType::Abs},
                                                      {"exp", OpType::Exp},
                                                      {"log", OpType::Log},
                                                      {"sqrt", OpType::Sqrt},
                                                      {"relu", OpType::Relu},
                                                      {"sigmoid", OpType::Sigmoid},
                                                      {"tanh", OpType::Tanh},
                                                      {"gelu", OpType::Gelu},
                                                      {"rsqrt", OpType::Rsqrt},
                                                      {"reciprocal", OpType::Reciprocal},
                                                      {"erf", OpType::Erf},
                                                      {"silu", OpType::Silu},
                                                      {"square", OpType::Square},
                                                      {"logical_not", OpType::LogicalNot}};
  for (const auto& [name, op] : unary_ops)
    ops.def(
        name, [op = op](TensorView* x) { return toPython(ops::unary(op, x)); }, py::arg("x"));

  const std::pair<const char*, OpType> binary_ops[] = {{"add", OpType::Add},
                                                       {"sub", OpType::Sub},
                                                       {"mul", OpType::Mul},
                                                       {"div", OpType::Div},
                                                       {"maximum", OpType::Max},
                                                       {"minimum", OpType::Min},
                                                       {"pow", OpType::Pow},
                                                       {"lt", OpType::Lt},
                                                       {"le", OpType::Le},
                                                       {"gt", OpType::Gt},
                                                       {"ge", OpType::Ge},
                                                       {"eq", OpType::Eq},
                                                       {"ne", OpType::Ne},
                                                       {"logical_and", OpType::LogicalAnd},
                                                       {"logical_or", OpType::LogicalOr}};
  for (const auto& [name, op] : binary_ops)
    ops.def(
        name, [op = op](Val* a, Val* b) { return toPython(ops::binary(op, a, b)); }, py::arg("a"), py::arg("b"));

  ops.def(
      "where", [](Val* c, Val* a, Val* b) { return toPython(ops::where(c, a, b)); }, py::arg("cond"), py::arg("a"),
      py::arg("b"));
  ops.def("slice", owned(&ops::slice), py::arg("x"), py::arg("start_indices"), py::arg("end_indices"),
          py::arg("strides"));
  ops.def(
      "cat", [](const std::vector<TensorView*>& tensors, int64_t dim) { return toPython(ops::cat(tensors, dim)); },
      py::arg("tensors"), py::arg("dim"));
  ops.def("stride_order", owned(&ops::strideOrder), py::arg("x"), py::arg("stride_order"));
  ops.def(
      "full",
      [](std::vector<int64_t> shape, Val* fill, DataType dtype) {
        return toPython(ops::full(std::move(shape), fill, dtype));
      },
      py::arg("shape"), py::arg("fill_value"), py::arg("dtype"));
  for (const auto& [name, op] :
       {std::pair<const char*, OpType>{"uniform", OpType::Uniform}, {"normal", OpType::Normal}})
    ops.def(
        name,
        [op = op](Val* a, Val* b, std::vector<int64_t> shape, DataType dtype, Val* seed, Val* offset) {
          auto* f = op == OpType::Uniform ? &ops::uniform : &ops::normal;
          return toPython(f(a, b, std::move(shape), dtype, seed, offset));
        },
        py::arg("a"), py::arg("b"), py::arg("shape"), py::arg("dtype"), py::arg("rng_seed") = nullptr,
        py::arg("rng_offset") = nullptr);
  ops.def(
      "var_mean",
      [](TensorView* x, std::vector<int64_t> dims, int64_t correction, bool keepdim) {
        auto [var, mean] = ops::varMean(x, std::move(dims), correction, keepdim);
        return py::make_tuple(toPython(var), toPython(mean));
      },
      py::arg("x"), py::arg("dims"), py::arg("correction"), py::arg("keepdim"));
  ops.def(
      "sdpfa_fwd",
      [](TensorView* q, TensorView* k, TensorView* v, Val* dropout_p, Val* is_causal, Val* scale) {
        ops::SdpaFwdResult r = ops::sdpfaFwd(q, k, v, dropout_p, is_causal, scale);
        return py::make_tuple(toPython(r.out), toPython(r.log_sumexp), toPython(r.philox_seed),
                              toPython(r.philox_offset));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("dropout_p") = nullptr,
      py::arg("is_causal") = nullptr, py::arg("scale") = nullptr);
  ops.def(
      "sdpfa_bwd",
      [](TensorView* grad_out, TensorView* q, TensorView* k, TensorView* v, TensorView* out, TensorView* lse,
         Val* dropout_p, Val* is_causal, TensorView* seed, TensorView* offset, Val* scale) {
        auto g = ops::sdpfaBwd(grad_out, q, k, v, out, lse, dropout_p, is_causal, seed, offset, scale);
        return py::make_tuple(toPython(g[0]), toPython(g[1]), toPython(g[2]));
      },
      py::arg("grad_output"), py::arg("query"), py::arg("key"), py::arg("value"), py::arg("output"),
      py::arg("log_sumexp"), py::arg("dropout_p"), py::arg("is_causal"), py::arg("philox_seed"),
      py::arg("philox_offset"), py::arg("scale") = nullptr);
  ops.def("cast", owned(&ops::cast), py::arg("x"), py::arg("dtype"));
  ops.def("set", owned(&ops::set), py::arg("x"));
  const std::pair<const char*, OpType> reductions[] = {
      {"sum", OpType::Sum}, {"max", OpType::ReduceMax}, {"mean", OpType::Mean}};
  for (const auto& [name, op] : reductions)
    ops.def(
        name,
        [op = op](TensorView* x, std::vector<int64_t> axes, bool keepdim) {
          return toPython(ops::reduction(op, x, std::move(axes), keepdim));
        },
        py::arg("x"), py::arg("axes"), py::arg("keepdim") = false);
  ops.def("broadcast_in_dim", owned(&ops::broadcastInDim), py::arg("x"), py::arg("shape"), py::arg("broadcast_dims"));
  ops.def("reshape", owned(&ops::reshape), py::arg("x"), py::arg("new_shape"));
  ops.def("permute", owned(&ops::permute), py::arg("x"), py::arg("dims"));
  ops.def("matmul", owned(&ops::matmul), py::arg("a"), py::arg("b"));
  ops.def("linear", owned(&ops::linear), py::arg("x"), py::arg("weight"), py::arg("bias") = nullptr);
  // A constant in the fusion of `owner` (for Python numbers used as operands).
  ops.def(
      "constant",
      [](const Val* owner, double value, DataType dtype) {
        if (owner == nullptr) throw UserError("constant: owner is None");
        return toPython(owner->fusion()->newScalar(dtype, value));
      },
      py::arg("owner"), py::arg("value"), py::arg("dtype"));
}

}  // namespace

void bindIr(py::module_& m) {
  bindEnums(m);
  bindVals(m);
  bindFusion(m);
  bindOps(m);
}

}  // namespace meshfuse::python
