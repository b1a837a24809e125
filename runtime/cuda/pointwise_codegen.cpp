// Generation of the fused pointwise kernels (see pointwise_codegen.h).
#include "runtime/cuda/pointwise_codegen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace meshfuse::cuda {

std::string storageType(DataType dtype) {
  switch (dtype) {
    case DataType::Float: return "float";
    case DataType::Double: return "double";
    case DataType::Half: return "__half";
    case DataType::BFloat16: return "__nv_bfloat16";
    case DataType::Int: return "i64";
    case DataType::Int32: return "int";
    case DataType::Bool: return "u8";
  }
  throw std::logic_error("storageType: unknown dtype");
}

// 16-bit floats are computed in float32, as on the CPU executor (and in nvFuser).
std::string computeType(DataType dtype) {
  switch (dtype) {
    case DataType::Float:
    case DataType::Half:
    case DataType::BFloat16: return "float";
    case DataType::Double: return "double";
    case DataType::Int: return "i64";
    case DataType::Int32: return "int";
    case DataType::Bool: return "bool";
  }
  throw std::logic_error("computeType: unknown dtype");
}

namespace {
// A value of computeType(from) as computeType(to).
std::string valueConvert(const std::string& expr, DataType from, DataType to) {
  const std::string a = computeType(from), b = computeType(to);
  if (a == b) return expr;
  if (b == "bool") return "((" + expr + ") != 0)";
  return "static_cast<" + b + ">(" + expr + ")";
}

std::string literal(double v) {
  char buf[64];
  if (std::isfinite(v)) {
    std::snprintf(buf, sizeof buf, "%a", v);  // exact (a C++17 hexadecimal floating literal)
  } else {
    long long bits;
    std::memcpy(&bits, &v, sizeof bits);
    std::snprintf(buf, sizeof buf, "__longlong_as_double(%lldLL)", bits);
  }
  return buf;
}

bool isFloatCompute(DataType d) { return computeType(d) == "float"; }
bool isDoubleCompute(DataType d) { return d == DataType::Double; }

}  // namespace

std::string opExpression(OpType op, DataType dtype) {
  const std::string ct = computeType(dtype);
  const bool f = isFloatCompute(dtype), d = isDoubleCompute(dtype), b = ct == "bool";
  auto fn = [&](const char* fname) {
    if (f) return std::string(fname) + "f(a)";
    if (d) return std::string(fname) + "(a)";
    return "static_cast<" + ct + ">(" + fname + "(static_cast<double>(a)))";
  };
  switch (op) {
    case OpType::Neg: return b ? "a" : "-a";
    case OpType::Abs: return f ? "fabsf(a)" : d ? "fabs(a)" : b ? "a" : "(a < 0 ? -a : a)";
    case OpType::Exp: return fn("exp");
    case OpType::Log: return fn("log");
    case OpType::Sqrt: return fn("sqrt");
    case OpType::Tanh: return fn("tanh");
    case OpType::Erf: return fn("erf");
    case OpType::Relu: return "(a < static_cast<" + ct + ">(0) ? static_cast<" + ct + ">(0) : a)";
    case OpType::Sigmoid:
      if (f) return "1.0f / (1.0f + expf(-a))";
      if (d) return "1.0 / (1.0 + exp(-a))";
      break;
    case OpType::Gelu:  // the exact form: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))
      if (f) return "0.5f * a * (1.0f + erff(a * 0.70710678118654752f))";
      if (d) return "0.5 * a * (1.0 + erf(a * 0.70710678118654752))";
      break;
    // 1 / sqrt rather than rsqrtf (2 ulp): the CPU executor's rounding, and it is rarely per element.
    case OpType::Rsqrt:
      if (f) return "1.0f / sqrtf(a)";
      if (d) return "1.0 / sqrt(a)";
      break;
    case OpType::Reciprocal:
      if (f) return "1.0f / a";
      if (d) return "1.0 / a";
      break;
    case OpType::Silu:
      if (f) return "a / (1.0f + expf(-a))";
      if (d) return "a / (1.0 + exp(-a))";
      break;
    case OpType::Square: return b ? "a" : "a * a";
    case OpType::LogicalNot: return "!a";
    case OpType::Add: return "a + b";
    case OpType::Sub: return "a - b";
    case OpType::Mul: return b ? "(a && b)" : "a * b";
    case OpType::Div: return "a / b";
    // NaN from either side wins, as on the CPU (pointwise_math.h) and in numpy; fmaxf returned the other
    // operand. (a != a is false for integers.)
    case OpType::Max: return "((a != a || a > b) ? a : b)";
    case OpType::Min: return "((a != a || a < b) ? a : b)";
    case OpType::Pow:
      if (f) return "powf(a, b)";
      if (d) return "pow(a, b)";
      return "static_cast<" + ct + ">(pow(static_cast<double>(a), static_cast<double>(b)))";
    case OpType::Lt: return "(a < b)";
    case OpType::Le: return "(a <= b)";
    case OpType::Gt: return "(a > b)";
    case OpType::Ge: return "(a >= b)";
    case OpType::Eq: return "(a == b)";
    case OpType::Ne: return "(a != b)";
    case OpType::LogicalAnd: return "(a && b)";
    case OpType::LogicalOr: return "(a || b)";
    case OpType::Where: return "(a ? b : c)";
    case OpType::Full:
    case OpType::Cast:
    case OpType::Set: return "a";
    default: break;
  }
  throw std::invalid_argument("CUDA pointwise codegen: " + toString(op) + " on " + toString(dtype) +
                              " is not a pointwise operation it can generate");
}

std::string philoxSource() {
  // Counter {counter, offset}, key {seed}; 10 rounds (runtime/philox.h). __fadd_rn and friends keep
  // NVRTC from fusing a multiply and an add, which would round once where the CPU rounds twice.
  return R"(__device__ __forceinline__ uint4 philox4x32(u64 counter, u64 offset, u64 seed) {
  unsigned c0 = static_cast<unsigned>(counter), c1 = static_cast<unsigned>(counter >> 32);
  unsigned c2 = static_cast<unsigned>(offset), c3 = static_cast<unsigned>(offset >> 32);
  unsigned k0 = static_cast<unsigned>(seed), k1 = static_cast<unsigned>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c1 = lo1;
    c3 = lo0;
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}
__device__ __forceinline__ float philoxUnitF(unsigned r) { return static_cast<float>(r >> 8) * 0x1p-24f; }
__device__ __forceinline__ double philoxUnitD(unsigned hi, unsigned lo) {
  return static_cast<double>(((static_cast<u64>(hi) << 32) | lo) >> 11) * 0x1p-53;
}
// The words of element g of a draw whose elements take W words each (runtime/philox.h): counter
// g / (4 / W), from word (g % (4 / W)) * W on, moved to the front (.x first).
__device__ __forceinline__ uint4 philoxFrom(const uint4 r, int word) {
  return word == 0 ? r : word == 1 ? make_uint4(r.y, r.z, r.w, 0u) : word == 2 ? make_uint4(r.z, r.w, 0u, 0u)
                                                                                : make_uint4(r.w, 0u, 0u, 0u);
}
__device__ __forceinline__ uint4 philoxElement(u64 g, int words, u64 offset, u64 seed) {
  const unsigned per = 4 / words;
  return philoxFrom(philox4x32(g / per, offset, seed), static_cast<int>(g % per) * words);
}
__device__ __forceinline__ float philoxUniformF(const uint4 r, double lo, double hi) {
  const float l = static_cast<float>(lo), h = static_cast<float>(hi);
  return __fadd_rn(l, __fmul_rn(__fsub_rn(h, l), philoxUnitF(r.x)));
}
__device__ __forceinline__ double philoxUniformD(const uint4 r, double lo, double hi) {
  return __dadd_rn(lo, __dmul_rn(__dsub_rn(hi, lo), philoxUnitD(r.x, r.y)));
}
__device__ __forceinline__ float philoxNormalF(const uint4 r, double mean, double stddev) {
  const float u1 = philoxUnitF(r.x) + 0x1p-24f, u2 = philoxUnitF(r.y);
  const float z = __fmul_rn(sqrtf(-2.0f * logf(u1)), cosf(__fmul_rn(6.283185307179586f, u2)));
  return __fadd_rn(static_cast<float>(mean), __fmul_rn(static_cast<float>(stddev), z));
}
// uniform() promises [lo, hi): a draw that rounds to hi or above in its dtype steps down to the
// dtype's largest value below hi, as runtime/cpu/pointwise.cpp's keepBelowMax does.
__device__ __forceinline__ unsigned short philoxStepDown16(unsigned short b) {
  return (b & 0x8000u) ? static_cast<unsigned short>(b + 1) : (b == 0 ? 0x8001u : static_cast<unsigned short>(b - 1));
}
__device__ __forceinline__ float philoxBelowH(float v, double lo, double hi) {
  __half h = __float2half_rn(v);
  while (hi > lo && static_cast<double>(__half2float(h)) >= hi) h = __ushort_as_half(philoxStepDown16(__half_as_ushort(h)));
  return __half2float(h);
}
__device__ __forceinline__ float philoxBelowB(float v, double lo, double hi) {
  __nv_bfloat16 h = __float2bfloat16_rn(v);
  while (hi > lo && static_cast<double>(__bfloat162float(h)) >= hi)
    h = __ushort_as_bfloat16(philoxStepDown16(__bfloat16_as_ushort(h)));
  return __bfloat162float(h);
}
__device__ __forceinline__ float philoxBelowF(float v, double lo, double hi) {
  while (hi > lo && static_cast<double>(v) >= hi) v = nextafterf(v, -__int_as_float(0x7f800000));
  return v;
}
__device__ __forceinline__ double philoxBelowD(double v, double lo, double hi) {
  while (hi > lo && v >= hi) v = nextafter(v, -__longlong_as_double(0x7ff0000000000000LL));
  return v;
}
__device__ __forceinline__ double philoxNormalD(const uint4 r, double mean, double stddev) {
  const double u1 = philoxUnitD(r.x, r.y) + 0x1p-53, u2 = philoxUnitD(r.z, r.w);
  const double rad = sqrt(__dmul_rn(-2.0, log(u1))), ang = cos(__dmul_rn(6.283185307179586476925, u2));
  return __dadd_rn(mean, __dmul_rn(__dmul_rn(stddev, rad), ang));
}
)";
}

namespace {

std::string operandExpr(const PointwiseProgram& prog, const PointwiseProgram::Operand& o, DataType to) {
  using K = PointwiseProgram::Operand::Kind;
  switch (o.kind) {
    case K::Input: return loadConvert("x" + std::to_string(o.index), prog.inputs.at(o.index), to);
    case K::Scalar: return valueConvert("p.scal[" + std::to_string(o.index) + "]", DataType::Double, to);
    case K::Constant: return valueConvert(literal(o.value), DataType::Double, to);
    case K::Temp: return valueConvert("t" + std::to_string(o.index), prog.instrs.at(o.index).dtype, to);
  }
  throw std::logic_error("operandExpr: unknown operand kind");
}

void checkProgram(const PointwiseProgram& prog) {
  if (prog.outputs.empty()) throw std::invalid_argument("CUDA pointwise codegen: the program has no output");
  for (size_t i = 0; i < prog.instrs.size(); ++i) {
    const auto& ins = prog.instrs[i];
    const size_t arity = isRandom(ins.op) ? 4 : isTernary(ins.op) ? 3 : isBinary(ins.op) ? 2 : 1;
    if (!isPointwise(ins.op) || ins.args.size() != arity)
      throw std::invalid_argument("CUDA pointwise codegen: instruction " + std::to_string(i) + " (" + toString(ins.op) +
                                  ") has " + std::to_string(ins.args.size()) + " operands");
    for (const auto& a : ins.args)
      if (a.kind == PointwiseProgram::Operand::Kind::Temp && a.index >= static_cast<int>(i))
        throw std::invalid_argument("CUDA pointwise codegen: instruction " + std::to_string(i) +
                                    " uses a temp defined later");
  }
  for (int t : prog.outputs)
    if (t < 0 || t >= static_cast<int>(prog.instrs.size()))
      throw std::invalid_argument("CUDA pointwise codegen: output temp " + std::to_string(t) + " does not exist");
}

int numIn(const PointwiseProgram& p) { return std::max<int>(1, static_cast<int>(p.inputs.size())); }

bool isTensorOperand(const PointwiseProgram::Operand& o) {
  using K = PointwiseProgram::Operand::Kind;
  return o.kind == K::Input || o.kind == K::Temp;
}

// The type a comparison compares in: the tensor operands' promoted type, which a number operand
// widens only from integers (an integer tensor against 2.5 compares in double, exactly; a float
// tensor against 0.1 compares in float, as torch and the CPU executor do).
DataType comparisonType(const PointwiseProgram::Instr& ins) {
  std::optional<DataType> t;
  for (const auto& a : ins.args)
    if (isTensorOperand(a)) t = t ? promoteTypes(*t, a.dtype) : a.dtype;
  if (!t) t = promoteTypes(ins.args[0].dtype, ins.args[1].dtype);
  for (const auto& a : ins.args) {
    if (isTensorOperand(a) || isFloatingPoint(*t)) continue;
    if (isFloatingPoint(a.dtype)) return DataType::Double;
    if (*t == DataType::Bool && a.dtype != DataType::Bool) t = DataType::Int;
  }
  return *t;
}

// The compute type operand k of `ins` is converted to.
DataType argType(const PointwiseProgram::Instr& ins, size_t k) {
  if (isComparison(ins.op)) return comparisonType(ins);
  if (isLogical(ins.op) || (ins.op == OpType::Where && k == 0)) return DataType::Bool;
  if (isRandom(ins.op)) return DataType::Double;  // the parameters as given; seed and offset as integers below
  return ins.dtype;
}

// A 16-bit float created in float32 holds its dtype's value from the start (full(0.1, Half) is
// Half's 0.1 also where the chain uses it before storing), as on the CPU executor.
std::string roundedToDtype(const std::string& v, DataType dtype) {
  if (dtype == DataType::Half) return "__half2float(__float2half_rn(" + v + "))";
  if (dtype == DataType::BFloat16) return "__bfloat162float(__float2bfloat16_rn(" + v + "))";
  return v;
}

// The instruction's value, of computeType(result type of the expression).
std::string instrExpression(const PointwiseProgram::Instr& ins, int random_slot) {
  if (isRandom(ins.op)) {
    const bool wide = ins.dtype == DataType::Double;
    const std::string fn =
        std::string(ins.op == OpType::Uniform ? "philoxUniform" : "philoxNormal") + (wide ? "D" : "F");
    const std::string v = fn + "(r" + std::to_string(random_slot) + ", a, b)";
    if (ins.op == OpType::Uniform) {
      const char* below = ins.dtype == DataType::Half       ? "philoxBelowH"
                          : ins.dtype == DataType::BFloat16 ? "philoxBelowB"
                          : wide                            ? "philoxBelowD"
                                                            : "philoxBelowF";
      return std::string(below) + "(" + v + ", a, b)";
    }
    return roundedToDtype(v, ins.dtype);
  }
  if (ins.op == OpType::Full) return roundedToDtype("a", ins.dtype);
  const DataType operand = argType(ins, ins.op == OpType::Where ? 1 : 0);
  std::string e = opExpression(ins.op, operand);
  const DataType produced = isComparison(ins.op) || isLogical(ins.op) ? DataType::Bool : operand;
  return valueConvert(e, produced, ins.dtype);
}
}  // namespace

std::string loadConvert(const std::string& expr, DataType from, DataType to_compute) {
  std::string v;
  switch (from) {
    case DataType::Half: v = "__half2float(" + expr + ")"; break;
    case DataType::BFloat16: v = "__bfloat162float(" + expr + ")"; break;
    case DataType::Bool: v = "(" + expr + " != 0)"; break;
    default: v = expr;
  }
  return valueConvert(v, from, to_compute);
}

std::string storeConvert(const std::string& expr, DataType compute_of, DataType to_storage) {
  std::string v = valueConvert(expr, compute_of, to_storage);
  switch (to_storage) {
    case DataType::Half: return "__float2half_rn(" + v + ")";
    case DataType::BFloat16: return "__float2bfloat16_rn(" + v + ")";
    case DataType::Bool: return "static_cast<u8>(" + v + ")";
    default: return v;
  }
}

std::string kernelPrelude() {
  return "#include <cuda_fp16.h>\n"
         "#include <cuda_bf16.h>\n"
         "typedef long long i64;\n"
         "typedef unsigned long long u64;\n"
         "typedef unsigned char u8;\n"
         "template <typename T, int N> struct __align__(sizeof(T) * N) Pack { T v[N]; };\n";
}

int PointwiseProgram::numRandom() const {
  int n = 0;
  for (const auto& ins : instrs) n += isRandom(ins.op) ? 1 : 0;
  return n;
}

std::vector<DataType> PointwiseProgram::outputDtypes() const {
  std::vector<DataType> out;
  for (int t : outputs) out.push_back(instrs.at(t).dtype);
  return out;
}

std::string PointwiseProgram::key() const {
  using K = Operand::Kind;
  std::ostringstream os;
  os << "in";
  for (DataType d : inputs) os << ":" << static_cast<int>(d);
  os << ";s" << num_scalars << ";";
  for (const auto& ins : instrs) {
    os << static_cast<int>(ins.op) << "/" << static_cast<int>(ins.dtype) << "(";
    for (const auto& a : ins.args) {
      // The operand's own dtype too: comparisonType() reads it (an Int tensor against a Double
      // scalar compares in double, against an Int one in integers), so it changes the code.
      os << static_cast<int>(a.kind) << "." << a.index << ":" << static_cast<int>(a.dtype);
      if (a.kind == K::Constant) os << "=" << literal(a.value);
      os << ",";
    }
    os << ")";
  }
  os << ";out";
  for (int t : outputs) os << ":" << t;
  return os.str();
}

std::string PointwiseVariant::key() const {
  if (contiguous) return "c" + std::to_string(vector_width);
  return "s" + std::to_string(ndim) + (index32 ? "i32" : "i64");
}

size_t pointwiseParamWords(const PointwiseProgram& program, const PointwiseVariant& variant) {
  size_t nin = static_cast<size_t>(numIn(program)), nout = program.outputs.size();
  const size_t nrand = static_cast<size_t>(program.numRandom());
  size_t words = nin + nout + static_cast<size_t>(std::max(1, program.num_scalars)) + 1 + nrand;
  if (!variant.contiguous) words += static_cast<size_t>(variant.ndim) * (1 + nin + nout + nrand);
  return words;
}

namespace {
// A random op's draw: the words an element takes (runtime/philox.h) and its seed and offset as
// kernel-level expressions (a runtime scalar or a constant), for the draws made outside chain().
struct RandomDraw {
  int words = 1;
  std::string seed, offset;
};

std::vector<RandomDraw> randomDraws(const PointwiseProgram& prog) {
  using K = PointwiseProgram::Operand::Kind;
  std::vector<RandomDraw> draws;
  for (const auto& ins : prog.instrs) {
    if (!isRandom(ins.op)) continue;
    RandomDraw d;
    d.words = (ins.op == OpType::Normal ? 2 : 1) * (ins.dtype == DataType::Double ? 2 : 1);
    for (size_t k : {size_t{2}, size_t{3}}) {
      if (ins.args[k].kind != K::Scalar && ins.args[k].kind != K::Constant)
        throw std::invalid_argument("CUDA pointwise codegen: a random op's seed and offset must be scalars");
      (k == 2 ? d.seed : d.offset) = "static_cast<u64>(" + operandExpr(prog, ins.args[k], DataType::Double) + ")";
    }
    draws.push_back(d);
  }
  return draws;
}
}  // namespace

int pointwiseElementsPerThread(const PointwiseProgram& program, const PointwiseVariant& variant) {
  const int random_unit = program.numRandom() > 0 ? 4 : 1;
  return variant.contiguous ? std::max(variant.vector_width, random_unit) : random_unit;
}

std::string generatePointwiseSource(const PointwiseProgram& prog, const PointwiseVariant& var,
                                    const std::string& name) {
  checkProgram(prog);
  const int nin = numIn(prog), nout = static_cast<int>(prog.outputs.size()),
            ninputs = static_cast<int>(prog.inputs.size());
  const int vec = var.contiguous ? var.vector_width : 1;
  if (vec < 1 || (vec & (vec - 1)) != 0) throw std::invalid_argument("vector width must be a power of two");
  if (!var.contiguous && (var.ndim < 1 || var.ndim > 16))
    throw std::invalid_argument("strided pointwise kernels take 1 to 16 dimensions, got " + std::to_string(var.ndim));
  const std::vector<DataType> out_types = prog.outputDtypes();
  const int nrand = prog.numRandom();

  std::ostringstream s;
  s << kernelPrelude();
  if (nrand > 0) s << philoxSource();
  s << "struct Params {\n  const void* in[" << nin << "];\n  void* out[" << nout << "];\n  double scal["
    << std::max(1, prog.num_scalars) << "];\n  i64 n;\n";
  if (nrand > 0) s << "  i64 rand_base[" << nrand << "];\n";
  if (!var.contiguous) {
    s << "  i64 shape[" << var.ndim << "];\n  i64 in_st[" << nin << "][" << var.ndim << "];\n  i64 out_st[" << nout
      << "][" << var.ndim << "];\n";
    if (nrand > 0) s << "  i64 rand_st[" << nrand << "][" << var.ndim << "];\n";
  }
  s << "};\n";
  // The host packs the same block as 8-byte words (pointwiseParamWords): the layouts must agree.
  s << "static_assert(sizeof(Params) == " << 8 * pointwiseParamWords(prog, var)
    << ", \"host and device disagree on the parameter block\");\n\n";

  // The chain on one element: inputs by value (storage types), outputs by reference.
  // Random ops also take their element's Philox words r<k> (from .x on; philoxElement).
  s << "__device__ __forceinline__ void chain(const Params& p";
  for (int k = 0; k < nrand; ++k) s << ", const uint4 r" << k;
  for (int i = 0; i < ninputs; ++i) s << ", const " << storageType(prog.inputs[i]) << " x" << i;
  for (int o = 0; o < nout; ++o) s << ", " << storageType(out_types[o]) << "& y" << o;
  s << ") {\n";
  int random_slot = 0;
  for (size_t i = 0; i < prog.instrs.size(); ++i) {
    const auto& ins = prog.instrs[i];
    s << "  " << computeType(ins.dtype) << " t" << i << ";\n  {\n";
    for (size_t k = 0; k < ins.args.size(); ++k) {
      if (isRandom(ins.op) && k >= 2) continue;  // seed and offset: taken by the caller's draw
      const DataType at = argType(ins, k);
      s << "    const " << computeType(at) << " " << static_cast<char>('a' + k) << " = "
        << operandExpr(prog, ins.args[k], at) << ";\n";
    }
    s << "    t" << i << " = " << instrExpression(ins, random_slot) << ";\n  }\n";
    if (isRandom(ins.op)) ++random_slot;
  }
  for (int o = 0; o < nout; ++o) {
    int t = prog.outputs[o];
    s << "  y" << o << " = " << storeConvert("t" + std::to_string(t), prog.instrs[t].dtype, out_types[o]) << ";\n";
  }
  s << "}\n\n";

  const std::vector<RandomDraw> draws = randomDraws(prog);
  // The words of each random op's element g<k> (an expression), one draw per element.
  auto elementWords = [&](const std::function<std::string(int)>& g, const std::string& indent) {
    for (int k = 0; k < nrand; ++k)
      s << indent << "const uint4 r" << k << " = philoxElement(" << g(k) << ", " << draws[k].words << ", "
        << draws[k].offset << ", " << draws[k].seed << ");\n";
  };
  auto chainCall = [&](const std::function<std::string(int)>& words, const std::function<std::string(int)>& x,
                       const std::function<std::string(int)>& y) {
    std::string c = "chain(p";
    for (int k = 0; k < nrand; ++k) c += ", " + words(k);
    for (int i = 0; i < ninputs; ++i) c += ", " + x(i);
    for (int o = 0; o < nout; ++o) c += ", " + y(o);
    return c + ");\n";
  };
  auto rName = [](int k) { return "r" + std::to_string(k); };
  auto scalarElement = [&](const std::string& in_index, const std::string& out_index, const std::string& indent) {
    for (int i = 0; i < ninputs; ++i) {
      std::string idx = in_index.empty() ? "o_in" + std::to_string(i) : in_index;
      s << indent << "const " << storageType(prog.inputs[i]) << " x" << i << " = static_cast<const "
        << storageType(prog.inputs[i]) << "*>(p.in[" << i << "])[" << idx << "];\n";
    }
    for (int o = 0; o < nout; ++o) s << indent << storageType(out_types[o]) << " y" << o << ";\n";
    s << indent
      << chainCall(
             rName, [](int i) { return "x" + std::to_string(i); }, [](int o) { return "y" + std::to_string(o); });
    for (int o = 0; o < nout; ++o) {
      std::string idx = out_index.empty() ? "o_out" + std::to_string(o) : out_index;
      s << indent << "static_cast<" << storageType(out_types[o]) << "*>(p.out[" << o << "])[" << idx << "] = y" << o
        << ";\n";
    }
  };

  s << "extern \"C\" __global__ void __launch_bounds__(256) " << name << "(const Params p) {\n";
  if (var.contiguous) {
    // A thread takes a unit of `unit` consecutive elements, `packs` vector accesses: with random ops
    // at least 4, so that a unit's elements are whole Philox counters (the contiguous variant has
    // every random op's index the flat index, base 0) and each counter is drawn once.
    const int unit = pointwiseElementsPerThread(prog, var), packs = unit / vec;
    s << "  const i64 n = p.n;\n  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;\n"
      << "  const i64 tid = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
    std::string tail_start = "tid";
    if (unit > 1) {
      s << "  const i64 nu = n / " << unit << ";\n  for (i64 u = tid; u < nu; u += step) {\n";
      for (int k = 0; k < nrand; ++k) {
        const int counters = unit * draws[k].words / 4;
        s << "    uint4 q" << k << "[" << counters << "];\n#pragma unroll\n    for (int j = 0; j < " << counters
          << "; ++j) q" << k << "[j] = philox4x32(static_cast<u64>(u) * " << counters << " + j, " << draws[k].offset
          << ", " << draws[k].seed << ");\n";
      }
      s << "#pragma unroll\n    for (int pk = 0; pk < " << packs << "; ++pk) {\n      const i64 v = u * " << packs
        << " + pk;\n";
      for (int i = 0; i < ninputs; ++i) {
        std::string pack = "Pack<" + storageType(prog.inputs[i]) + ", " + std::to_string(vec) + ">";
        s << "      const " << pack << " vx" << i << " = reinterpret_cast<const " << pack << "*>(p.in[" << i
          << "])[v];\n";
      }
      for (int o = 0; o < nout; ++o)
        s << "      Pack<" << storageType(out_types[o]) << ", " << vec << "> vy" << o << ";\n";
      s << "#pragma unroll\n      for (int k = 0; k < " << vec << "; ++k) {\n        const int e = pk * " << vec
        << " + k;  // the element within the unit\n        "
        << chainCall(
               [&](int k) {
                 const int per = 4 / draws[k].words;
                 return "philoxFrom(q" + std::to_string(k) + "[e / " + std::to_string(per) + "], e % " +
                        std::to_string(per) + " * " + std::to_string(draws[k].words) + ")";
               },
               [](int i) { return "vx" + std::to_string(i) + ".v[k]"; },
               [](int o) { return "vy" + std::to_string(o) + ".v[k]"; })
        << "      }\n";
      for (int o = 0; o < nout; ++o) {
        std::string pack = "Pack<" + storageType(out_types[o]) + ", " + std::to_string(vec) + ">";
        s << "      reinterpret_cast<" << pack << "*>(p.out[" << o << "])[v] = vy" << o << ";\n";
      }
      s << "    }\n  }\n";
      tail_start = "nu * " + std::to_string(unit) + " + tid";
    }
    s << "  for (i64 i = " << tail_start << "; i < n; i += step) {\n";
    elementWords([](int k) { return "static_cast<u64>(p.rand_base[" + std::to_string(k) + "] + i)"; }, "    ");
    scalarElement("i", "i", "    ");
    s << "  }\n";
  } else {
    // With random ops a thread takes 4 consecutive elements and draws a counter again only where an
    // element's index leaves the previous element's counter (q<k>, counter c<k>): where the op's
    // index runs on with the iteration (a shard's rows) a counter serves up to 4 elements.
    const int unit = pointwiseElementsPerThread(prog, var);
    const std::string it = var.index32 ? "unsigned" : "u64";
    s << "  const " << it << " n = static_cast<" << it << ">(p.n);\n"
      << "  const " << it << " units = n / " << unit << " + (n % " << unit << " != 0);\n"
      << "  const " << it << " step = static_cast<" << it << ">(gridDim.x) * blockDim.x;\n"
      << "  for (" << it << " u = static_cast<" << it
      << ">(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += step) {\n";
    for (int k = 0; k < nrand; ++k) s << "    u64 c" << k << " = ~0ull;\n    uint4 q" << k << ";\n";
    s << "    for (int s = 0; s < " << unit << "; ++s) {\n"
      << "    const " << it << " i = u * " << unit << " + s;\n"
      << "    if (i >= n) break;\n"
      << "    " << it << " rem = i;\n";
    for (int i = 0; i < ninputs; ++i) s << "    " << it << " o_in" << i << " = 0;\n";
    for (int o = 0; o < nout; ++o) s << "    " << it << " o_out" << o << " = 0;\n";
    for (int k = 0; k < nrand; ++k) s << "    u64 o_rand" << k << " = 0;\n";
    s << "#pragma unroll\n    for (int d = " << var.ndim - 1 << "; d >= 0; --d) {\n"
      << "      const " << it << " e = static_cast<" << it << ">(p.shape[d]);\n"
      << "      const " << it << " idx = rem % e;\n      rem /= e;\n";
    for (int i = 0; i < ninputs; ++i)
      s << "      o_in" << i << " += idx * static_cast<" << it << ">(p.in_st[" << i << "][d]);\n";
    for (int o = 0; o < nout; ++o)
      s << "      o_out" << o << " += idx * static_cast<" << it << ">(p.out_st[" << o << "][d]);\n";
    for (int k = 0; k < nrand; ++k)  // global indices can pass 2^32 even when the local block does not
      s << "      o_rand" << k << " += static_cast<u64>(idx) * static_cast<u64>(p.rand_st[" << k << "][d]);\n";
    s << "    }\n";
    for (int k = 0; k < nrand; ++k) {
      const std::string ks = std::to_string(k), per = std::to_string(4 / draws[k].words);
      s << "    const u64 g" << ks << " = static_cast<u64>(p.rand_base[" << ks << "]) + o_rand" << ks << ";\n"
        << "    if (g" << ks << " / " << per << " != c" << ks << ") {\n"
        << "      c" << ks << " = g" << ks << " / " << per << ";\n"
        << "      q" << ks << " = philox4x32(c" << ks << ", " << draws[k].offset << ", " << draws[k].seed << ");\n"
        << "    }\n"
        << "    const uint4 r" << ks << " = philoxFrom(q" << ks << ", static_cast<int>(g" << ks << " % " << per
        << ") * " << draws[k].words << ");\n";
    }
    scalarElement("", "", "    ");
    s << "    }\n  }\n";
  }
  s << "}\n";
  return s.str();
}

}  // namespace meshfuse::cuda
