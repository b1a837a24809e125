// cuBLASLt matmul plans and the matmul/linear entry points (see matmul.h).
#include "runtime/cuda/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <vector>

#include "ir/ir.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch_timing.h"
#include "runtime/cuda/pointwise_kernel.h"
#include "runtime/cuda/streams.h"
#include "runtime/host_span.h"
#include "runtime/matrix_layout.h"

namespace meshfuse::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;
// Autotuning: how many of the heuristic's algorithms are timed by default (and at most), how often
// each, and the smallest product (in FLOPs) worth the one-off cost (a few launches of each
// candidate, once per plan).
constexpr int kTuneCandidates = 8;
constexpr int kMaxTuneCandidates = 64;
constexpr int kTuneRepeats = 3;
constexpr double kTuneMinFlops = 1e9;

// MESHFUSE_MATMUL_AUTOTUNE (matmulTuneCandidates), read once.
int tuneCandidates() {
  static const int count = matmulTuneCandidates(std::getenv("MESHFUSE_MATMUL_AUTOTUNE"));
  return count;
}

// MESHFUSE_MATMUL_TUNE_LOG=1: one line per tuned plan on stderr (the shape key, the heuristic's
// first choice and the chosen one, each in ms), to see what autotuning buys on a machine.
bool tuneLogEnabled() {
  static const bool enabled = std::getenv("MESHFUSE_MATMUL_TUNE_LOG") != nullptr;
  return enabled;
}

// MESHFUSE_MATMUL_TF32 (0 or 1; read once, tests set it): whether fp32 products may round their
// operands to TF32 on tensor cores. Off by default, as in torch: fp32 results then match the CPU's
// sgemm to fp32 rounding, where TF32 keeps 10 mantissa bits (about 1e-3 relative error).
std::atomic<bool>& floatMatmulTf32Setting() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("MESHFUSE_MATMUL_TF32");
    const std::string s = v ? v : "0";
    if (s != "0" && s != "1") throw UserError("MESHFUSE_MATMUL_TF32=" + s + ": expected 0 or 1");
    return s == "1";
  }()};
  return on;
}

cudaDataType_t cudaTypeOf(DataType d) {
  switch (d) {
    case DataType::Float: return CUDA_R_32F;
    case DataType::Double: return CUDA_R_64F;
    case DataType::Half: return CUDA_R_16F;
    case DataType::BFloat16: return CUDA_R_16BF;
    default: break;
  }
  throw UserError("CUDA matmul: " + toString(d) + " is not supported (Float, Double, Half, BFloat16 are)");
}

int alignmentOf(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C=D
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first (algo is one of them)
  bool tuned = false;
  // The epilogue the descriptor asks for. A plain bias falls back to none (the bias is then added
  // by a pointwise kernel afterwards); an activation epilogue has no fallback: no candidates.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool fusedBias() const {
    return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_BIAS ||
           epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  // The bias pointer is read (a fused bias) or written (DGELU_BGRAD's bias gradient).
  bool usesBiasPointer() const { return fusedBias() || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
  bool hasAux() const {
    return epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
           epilogue == CUBLASLT_EPILOGUE_DGELU || epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
};

// The cuBLASLt epilogue for a call: the activation's, else the plain bias (with its fallback).
std::vector<cublasLtEpilogue_t> epiloguesToTry(const GemmEpilogue& e) {
  const bool bias = e.bias != nullptr, aux = e.aux != nullptr;
  switch (e.activation) {
    case GemmEpilogue::Activation::Gelu:
      if (aux) return {bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX};
      return {bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU};
    case GemmEpilogue::Activation::GeluGrad:
      return {e.bias_grad != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU};
    case GemmEpilogue::Activation::None: break;
  }
  if (bias) return {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_DEFAULT};
  return {CUBLASLT_EPILOGUE_DEFAULT};
}

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;  // one per stream: concurrent matmuls must not share one
  std::map<std::string, Plan> plans;
};

std::mutex g_mutex;
std::map<int, DeviceState> g_devices;
std::atomic<int64_t> g_activation_epilogue_runs{0};

DeviceState& stateOf(int device) {
  DeviceState& s = g_devices[device];
  if (s.handle == nullptr) MESHFUSE_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  return s;
}

void* workspaceFor(DeviceState& s, cudaStream_t stream) {
  void*& w = s.workspaces[stream];
  if (w == nullptr) MESHFUSE_CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));
  return w;
}

cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l;
  MESHFUSE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    int32_t count = static_cast<int32_t>(batch);
    MESHFUSE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    MESHFUSE_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

// Builds the plan with the first of `epilogues` the heuristic has algorithms for (none: a plan
// without candidates). align: A, B, C, bias, aux pointer alignments.
Plan makePlan(DeviceState& s, const GemmProblem& p, const std::vector<cublasLtEpilogue_t>& epilogues,
              const int align[5], int64_t aux_ld, int sm_target, bool tf32) {
  const cudaDataType_t t = cudaTypeOf(p.dtype);
  const bool dbl = p.dtype == DataType::Double;
  const cublasComputeType_t compute =
      dbl ? CUBLAS_COMPUTE_64F : (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  Plan plan;
  // Column-major view of the row-major problem: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m). A
  // row-major matrix with row stride ld is a column-major one with leading dimension ld.
  const int64_t ldb = p.ldb > 0 ? p.ldb : (p.trans_b ? p.k : p.n);
  const int64_t lda = p.lda > 0 ? p.lda : (p.trans_a ? p.m : p.k);
  plan.a = p.trans_b ? layout(t, p.k, p.n, ldb, p.batch, p.stride_b) : layout(t, p.n, p.k, ldb, p.batch, p.stride_b);
  plan.b = p.trans_a ? layout(t, p.m, p.k, lda, p.batch, p.stride_a) : layout(t, p.k, p.m, lda, p.batch, p.stride_a);
  plan.c = layout(t, p.n, p.m, p.n, p.batch, p.stride_c);
  cublasLtMatmulPreference_t pref;
  MESHFUSE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  MESHFUSE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const cublasLtMatmulPreferenceAttributes_t align_attr[3] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
  for (int i = 0; i < 3; ++i) {
    uint32_t a = static_cast<uint32_t>(align[i]);
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &a, sizeof a));
  }
  uint32_t ad = static_cast<uint32_t>(align[2]);
  MESHFUSE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));

  for (cublasLtEpilogue_t epi : epilogues) {
    if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, compute, dbl ? CUDA_R_64F : CUDA_R_32F));
    cublasOperation_t opa = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (sm_target > 0) {  // the heuristic picks an algorithm for this many multiprocessors
      int32_t sms = sm_target;
      MESHFUSE_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
    }
    plan.epilogue = epi;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      // The heuristic reads the bias and aux pointers' alignments: stand-ins with the real ones.
      if (plan.usesBiasPointer()) {
        const void* fake = reinterpret_cast<const void*>(static_cast<uintptr_t>(align[3]));
        MESHFUSE_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &fake, sizeof fake));
      }
      if (plan.hasAux()) {
        const void* fake = reinterpret_cast<const void*>(static_cast<uintptr_t>(align[4]));
        MESHFUSE_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &fake, sizeof fake));
        MESHFUSE_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
        const int32_t aux_type = t;
        MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                             &aux_type, sizeof aux_type));
      }
    }
    // (Untuned, the first is used: the same as in the default count's list.)
    std::vector<cublasLtMatmulHeuristicResult_t> results(
        static_cast<size_t>(tuneCandidates() > 0 ? tuneCandidates() : kTuneCandidates));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                                       static_cast<int>(results.size()), results.data(), &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
      for (int i = 0; i < found; ++i)
        if (results[i].state == CUBLAS_STATUS_SUCCESS) plan.candidates.push_back(results[i].algo);
    }
    if (!plan.candidates.empty()) {
      plan.algo = plan.candidates.front();
      cublasLtMatmulPreferenceDestroy(pref);
      return plan;
    }
  }
  cublasLtMatmulPreferenceDestroy(pref);
  return plan;
}

[[noreturn]] void throwNoAlgorithm(const GemmProblem& p) {
  std::ostringstream os;
  os << "cuBLASLt has no algorithm for " << toString(p.dtype) << " [" << p.batch << " x " << p.m << " x " << p.k
     << "] @ [" << p.k << " x " << p.n << "]" << (p.trans_a ? " (A transposed)" : "")
     << (p.trans_b ? " (B transposed)" : "");
  throw std::runtime_error(os.str());
}

// Times each candidate algorithm on the call's own operands (`c` is overwritten, which the call
// does anyway) and keeps the fastest in plan.algo. The heuristic's first choice is a model's guess;
// on the H200 it can leave 10-15% on the table for the transformer's [2048 x 12288] x [12288 x 4e]
// shapes. Skipped while the stream is being captured into a graph (no synchronization allowed).
void tune(Plan& plan, const std::string& what, cublasLtHandle_t handle, cudaStream_t stream, const void* alpha,
          const void* beta, const void* a, const void* b, void* c, void* workspace) {
  plan.tuned = true;
  if (plan.candidates.size() < 2 || streamCapturing(stream)) return;
  float best_ms = std::numeric_limits<float>::infinity(), first_ms = 0;
  size_t best_index = 0;
  for (size_t index = 0; index < plan.candidates.size(); ++index) {
    const cublasLtMatmulAlgo_t& algo = plan.candidates[index];
    // An algorithm that refuses (in its warm-up or later) is skipped.
    const std::optional<float> ms = timeLaunches(stream, kTuneRepeats, [&] {
      return cublasLtMatmul(handle, plan.desc, alpha, b, plan.a, a, plan.b, beta, c, plan.c, c, plan.c, &algo,
                            workspace, kWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
    });
    if (!ms) continue;
    if (index == 0) first_ms = *ms;
    if (*ms < best_ms) {
      best_ms = *ms;
      best_index = index;
      plan.algo = algo;
    }
  }
  if (tuneLogEnabled())
    std::fprintf(stderr, "[meshfuse] matmul %s: heuristic's first %.3f ms, chosen candidate %zu of %zu %.3f ms\n",
                 what.c_str(), first_ms, best_index, plan.candidates.size(), best_ms);
}

void addBiasInPlace(int device, DataType dtype, void* c, int64_t rows, int64_t n, const void* bias) {
  PointwiseProgram prog;
  using K = PointwiseProgram::Operand::Kind;
  prog.inputs = {dtype, dtype};
  prog.instrs.push_back({OpType::Add, {{K::Input, 0, 0, dtype}, {K::Input, 1, 0, dtype}}, dtype});
  prog.outputs = {0};
  auto no_release = [](void*) {};
  Tensor ct = Tensor::fromBlob(c, dtype, {rows, n}, {n, 1}, Device::cuda(device), no_release);
  Tensor bt = Tensor::fromBlob(const_cast<void*>(bias), dtype, {n}, {1}, Device::cuda(device), no_release);
  runPointwise(device, prog, {ct, bt}, {}, {ct});
}

// The last two axes of `t` as a 2-D tensor (every other axis has extent 1).
Tensor lastMatrix(const Tensor& t) {
  const int64_t r = t.dim();
  return Tensor(t.storage(), t.byteOffset(), t.dtype(), {t.size(r - 2), t.size(r - 1)},
                {t.strides()[r - 2], t.strides()[r - 1]});
}

// A 2-D operand as cuBLASLt reads it: in place, with `transposed` and `ld` set, when it is
// row-major or transposed row-major with a leading dimension the tensor-core kernels accept
// (packed, or a multiple of 16 bytes); else a contiguous copy (transposed false, ld 0 = packed).
Tensor operandFor(const Tensor& t, bool& transposed, int64_t& ld) {
  if (auto l = matrixLayout(t.size(0), t.size(1), t.strides()[0], t.strides()[1])) {
    const int64_t packed = l->transposed ? t.size(0) : t.size(1);
    const int64_t per16 = std::max<int64_t>(1, 16 / static_cast<int64_t>(dataTypeSize(t.dtype())));
    if (l->ld == packed || l->ld % per16 == 0) {
      transposed = l->transposed;
      ld = l->ld;
      return t;
    }
  }
  transposed = false;
  ld = 0;
  return t.contiguous();
}

void checkOnDevice(const Tensor& t, int device, const char* what, const char* op) {
  if (t.device() != Device::cuda(device))
    throw UserError(std::string(op) + ": " + what + " " + t.toString() + " is not on cuda:" + std::to_string(device));
}
}  // namespace

void gemm(int device, const GemmProblem& p, const void* a, const void* b, void* c, const void* bias) {
  GemmEpilogue e;
  e.bias = bias;
  if (!gemmWithEpilogue(device, p, a, b, c, e)) throwNoAlgorithm(p);
}

bool gemmWithEpilogue(int device, const GemmProblem& p, const void* a, const void* b, void* c, const GemmEpilogue& e) {
  if (p.m == 0 || p.n == 0 || p.batch == 0) return true;
  const bool activation = e.activation != GemmEpilogue::Activation::None;
  // cuBLASLt's GELU epilogues: one matrix (no batch), aux rows a multiple of 8 elements apart.
  if (activation && (p.batch != 1 || p.k == 0 || (e.aux && e.aux_ld % 8 != 0))) return false;
  if (e.activation == GemmEpilogue::Activation::GeluGrad && (e.aux == nullptr || e.bias != nullptr)) return false;
  if (e.bias_grad != nullptr && e.activation != GemmEpilogue::Activation::GeluGrad) return false;
  DeviceGuard guard(device);
  cudaStream_t stream = currentStream(device);
  const void* bias_pointer = e.bias != nullptr ? e.bias : e.bias_grad;
  const int align[5] = {alignmentOf(b), alignmentOf(a), alignmentOf(c), bias_pointer ? alignmentOf(bias_pointer) : 256,
                        e.aux ? alignmentOf(e.aux) : 256};
  std::optional<host_span::Scope> lookup_span(std::in_place, "cuBLASLt: plan lookup");
  const std::vector<cublasLtEpilogue_t> epilogues = epiloguesToTry(e);
  const bool tf32 = p.dtype == DataType::Float && floatMatmulTf32Setting().load();  // plans are per setting
  std::ostringstream key;
  key << static_cast<int>(p.dtype) << ":" << p.m << "," << p.n << "," << p.k << "," << p.batch << "," << p.stride_a
      << "," << p.stride_b << "," << p.stride_c << "," << p.trans_a << p.trans_b << "," << p.lda << "," << p.ldb << ","
      << (e.bias != nullptr) << ",epi" << static_cast<int>(epilogues.front()) << "," << e.aux_ld << "@" << align[0]
      << "," << align[1] << "," << align[2] << "," << align[3] << "," << align[4] << "/sm" << matmulSmCountTarget()
      << (tf32 ? "/tf32" : "");
  // The lock covers the enqueue too: a plan's descriptor carries this call's bias and aux pointers.
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& state = stateOf(device);
  auto it = state.plans.find(key.str());
  if (it == state.plans.end())
    it = state.plans.emplace(key.str(), makePlan(state, p, epilogues, align, e.aux_ld, matmulSmCountTarget(), tf32))
             .first;
  Plan* plan = &it->second;
  lookup_span.reset();
  if (plan->candidates.empty()) return false;
  void* workspace = workspaceFor(state, stream);
  cublasLtHandle_t handle = state.handle;
  if (p.k == 0) {  // an empty contraction: zeros (plus the bias)
    MESHFUSE_CUDA_CHECK(
        cudaMemsetAsync(c, 0, static_cast<size_t>(p.batch * p.m * p.n) * dataTypeSize(p.dtype), stream));
    if (e.bias) addBiasInPlace(device, p.dtype, c, p.batch * p.m, p.n, e.bias);
    return true;
  }
  if (plan->usesBiasPointer())
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                                         sizeof bias_pointer));
  if (plan->hasAux())
    MESHFUSE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof e.aux));
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool dbl = p.dtype == DataType::Double;
  const void* alpha = dbl ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = dbl ? static_cast<const void*>(&zero_d) : &zero_f;
  const double flops = 2.0 * static_cast<double>(p.batch) * static_cast<double>(p.m) * static_cast<double>(p.n) *
                       static_cast<double>(p.k);
  // (Tuning a GELU-aux plan writes aux, which the call writes anyway; a DGELU plan only reads it.)
  if (!plan->tuned && tuneCandidates() > 0 && flops >= kTuneMinFlops)
    tune(*plan, key.str(), handle, stream, alpha, beta, a, b, c, workspace);
  {
    host_span::Scope call_span("cublasLtMatmul");
    MESHFUSE_CUBLAS_CHECK(cublasLtMatmul(handle, plan->desc, alpha, b, plan->a, a, plan->b, beta, c, plan->c, c,
                                         plan->c, &plan->algo, workspace, kWorkspaceBytes, stream));
  }
  if (e.bias && !plan->fusedBias()) addBiasInPlace(device, p.dtype, c, p.batch * p.m, p.n, e.bias);
  if (activation) ++g_activation_epilogue_runs;
  return true;
}

int64_t activationEpilogueRuns() { return g_activation_epilogue_runs.load(); }

namespace {
std::atomic<GeluGradEpilogue>& geluGradEpilogueSetting() {
  static std::atomic<GeluGradEpilogue> mode{[] {
    const char* v = std::getenv("MESHFUSE_CUDA_DGELU_EPILOGUE");
    const std::string s = v ? v : "off";
    if (s == "dgelu") return GeluGradEpilogue::Dgelu;
    if (s == "dgelu_bgrad") return GeluGradEpilogue::DgeluBgrad;
    if (s != "off") throw UserError("MESHFUSE_CUDA_DGELU_EPILOGUE=" + s + ": expected off, dgelu or dgelu_bgrad");
    return GeluGradEpilogue::Off;
  }()};
  return mode;
}
}  // namespace

bool floatMatmulTf32() { return floatMatmulTf32Setting().load(); }
void setFloatMatmulTf32(bool on) { floatMatmulTf32Setting().store(on); }

GeluGradEpilogue geluGradEpilogue() { return geluGradEpilogueSetting().load(); }
void setGeluGradEpilogue(GeluGradEpilogue mode) { geluGradEpilogueSetting().store(mode); }

void runMatmul(int device, const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  checkOnDevice(a_in, device, "operand", "matmul");
  checkOnDevice(b_in, device, "operand", "matmul");
  checkOnDevice(out, device, "output", "matmul");
  if (a_in.dtype() != b_in.dtype() || out.dtype() != a_in.dtype())
    throw UserError("matmul: operands " + a_in.toString() + " and " + b_in.toString() + " -> " + out.toString() +
                    " must share one dtype on CUDA");
  if (!out.isContiguous()) throw std::invalid_argument("matmul: the output must be contiguous");
  // Vectors become matrices (their extra axis is absent from `out`, which leaves its layout alone).
  const Tensor a = a_in.dim() == 1 ? a_in.contiguous().view({1, a_in.size(0)}) : a_in;
  const Tensor b = b_in.dim() == 1 ? b_in.contiguous().view({b_in.size(0), 1}) : b_in;
  const int64_t m = a.size(a.dim() - 2), k = a.size(a.dim() - 1), n = b.size(b.dim() - 1);
  if (b.size(b.dim() - 2) != k)
    throw UserError("matmul: contraction extents differ: " + a_in.toString() + " @ " + b_in.toString());
  const std::vector<int64_t> batch_a(a.shape().begin(), a.shape().end() - 2);
  const std::vector<int64_t> batch_b(b.shape().begin(), b.shape().end() - 2);
  const size_t rank = std::max(batch_a.size(), batch_b.size());
  std::vector<int64_t> batch(rank, 1);
  for (const auto* bs : {&batch_a, &batch_b})
    for (size_t i = 0; i < bs->size(); ++i) {
      int64_t& e = batch[rank - bs->size() + i];
      e = std::max(e, (*bs)[i]);
    }
  const int64_t nbatch = numelOf(batch);
  if (out.numel() != nbatch * m * n)
    throw std::invalid_argument("matmul: output " + out.toString() + " does not hold " +
                                std::to_string(nbatch * m * n) + " elements");
  // An operand is expanded to the full batch and made dense (a no-op when it already is).
  auto dense = [&](const Tensor& t) {
    std::vector<int64_t> full = batch;
    full.insert(full.end(), t.shape().end() - 2, t.shape().end());
    std::vector<int64_t> padded(full.size() - t.shape().size(), 1);
    padded.insert(padded.end(), t.shape().begin(), t.shape().end());
    return Tensor(t.storage(), t.byteOffset(), t.dtype(), padded,
                  [&] {
                    std::vector<int64_t> st(padded.size() - t.shape().size(), 0);
                    st.insert(st.end(), t.strides().begin(), t.strides().end());
                    return st;
                  }())
        .expand(full)
        .contiguous();
  };
  GemmProblem p;
  p.dtype = a.dtype();
  p.m = m;
  p.n = n;
  p.k = k;
  if (numelOf(batch_b) == 1) {
    // B is shared by every batch: read in place when its layout allows (a transposed weight is a flag).
    Tensor bd = operandFor(lastMatrix(b), p.trans_b, p.ldb);
    if (nbatch == 1) {
      Tensor ad = operandFor(lastMatrix(a), p.trans_a, p.lda);
      gemm(device, p, ad.data(), bd.data(), out.data(), nullptr);
      return;
    }
    // The batch folds into M, one large product (A dense).
    Tensor ad = dense(a);
    p.m = m * nbatch;
    gemm(device, p, ad.data(), bd.data(), out.data(), nullptr);
    return;
  }
  Tensor ad = dense(a), bd = dense(b);
  p.batch = nbatch;
  p.stride_a = m * k;
  p.stride_b = k * n;
  p.stride_c = m * n;
  gemm(device, p, ad.data(), bd.data(), out.data(), nullptr);
}

namespace {
// A linear's problem with its operands as cuBLASLt reads them (held alive by the tensors).
struct PreparedGemm {
  GemmProblem problem;
  Tensor a, b, bias;
};

PreparedGemm prepareLinear(int device, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  checkOnDevice(x, device, "input", "linear");
  checkOnDevice(weight, device, "weight", "linear");
  checkOnDevice(out, device, "output", "linear");
  if (bias.defined()) checkOnDevice(bias, device, "bias", "linear");
  if (weight.dtype() != x.dtype() || out.dtype() != x.dtype() || (bias.defined() && bias.dtype() != x.dtype()))
    throw UserError("linear: input " + x.toString() + ", weight " + weight.toString() +
                    (bias.defined() ? ", bias " + bias.toString() : std::string()) + " must share one dtype on CUDA");
  const int64_t k = x.size(x.dim() - 1);
  const int64_t n = weight.dim() == 2 ? weight.size(0) : 1;
  if (weight.size(weight.dim() - 1) != k)
    throw UserError("linear: weight " + weight.toString() + " does not contract with input " + x.toString());
  if (bias.defined() && bias.numel() != n)
    throw UserError("linear: bias " + bias.toString() + " must hold " + std::to_string(n) + " elements");
  if (!out.isContiguous()) throw std::invalid_argument("linear: the output must be contiguous");
  PreparedGemm g;
  GemmProblem& p = g.problem;
  p.dtype = x.dtype();
  g.a = x.dim() == 2 ? operandFor(x, p.trans_a, p.lda) : x.contiguous();
  // The weight is [n, k]: cuBLASLt transposes it, unless its memory already holds [k, n].
  bool weight_held_transposed = false;
  g.b = weight.dim() == 2 ? operandFor(weight, weight_held_transposed, p.ldb) : weight.contiguous();
  p.trans_b = !weight_held_transposed;
  g.bias = bias.defined() ? bias.contiguous() : Tensor();
  p.m = g.a.numel() / std::max<int64_t>(k, 1);
  if (k == 0) p.m = numelOf(std::vector<int64_t>(x.shape().begin(), x.shape().end() - 1));
  p.n = n;
  p.k = k;
  return g;
}
}  // namespace

void runLinear(int device, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  const PreparedGemm g = prepareLinear(device, x, weight, bias, out);
  gemm(device, g.problem, g.a.data(), g.b.data(), out.data(), g.bias.defined() ? g.bias.data() : nullptr);
}

bool runProductWithActivation(int device, const ProductOperands& operands, GemmEpilogue::Activation activation,
                              const Tensor& aux, const Tensor& out, const Tensor& bias_grad) {
  const Tensor& a = operands.a;
  const Tensor& b = operands.b;
  PreparedGemm g;
  if (operands.linear) {
    g = prepareLinear(device, a, b, operands.bias, out);
  } else {
    // A 2-D product only (numpy's vector and batch forms have no epilogue here).
    if (a.dim() != 2 || b.dim() != 2 || a.dtype() != b.dtype() || out.dtype() != a.dtype() || !out.isContiguous() ||
        a.size(1) != b.size(0))
      return false;
    checkOnDevice(a, device, "operand", "matmul");
    checkOnDevice(b, device, "operand", "matmul");
    g.problem.dtype = a.dtype();
    g.a = operandFor(a, g.problem.trans_a, g.problem.lda);
    g.b = operandFor(b, g.problem.trans_b, g.problem.ldb);
    g.problem.m = a.size(0);
    g.problem.n = b.size(1);
    g.problem.k = a.size(1);
  }
  const GemmProblem& p = g.problem;
  if (out.numel() != p.m * p.n) return false;
  if (aux.defined() && (aux.dtype() != p.dtype || !aux.isContiguous() || aux.numel() != p.m * p.n)) return false;
  if (bias_grad.defined() && (bias_grad.dtype() != p.dtype || !bias_grad.isContiguous() || bias_grad.numel() != p.n))
    return false;
  GemmEpilogue e;
  e.activation = activation;
  e.bias = g.bias.defined() ? g.bias.data() : nullptr;
  e.aux = aux.defined() ? aux.data() : nullptr;
  e.aux_ld = p.n;
  e.bias_grad = bias_grad.defined() ? bias_grad.data() : nullptr;
  return gemmWithEpilogue(device, p, g.a.data(), g.b.data(), out.data(), e);
}

int matmulTuneCandidates(const char* setting) {
  if (setting == nullptr) return kTuneCandidates;
  const std::string text = setting;
  if (text == "0") return 0;
  char* end = nullptr;
  const long n = std::strtol(text.c_str(), &end, 10);
  if (end != text.c_str() && *end == '\0' && n >= 2) return static_cast<int>(std::min<long>(n, kMaxTuneCandidates));
  return kTuneCandidates;
}

}  // namespace meshfuse::cuda
