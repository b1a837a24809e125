#include "host_ir/comm_debug.h"

#include "runtime/tensor.h"

namespace meshfuse {

namespace {
// Bytes of tv's local tensor on this rank, or -1 when it has none here.
int64_t localBytes(const HostIrContainer& hic, const TensorView* tv) {
  if (tv == nullptr) return -1;
  auto it = hic.local_shapes.find(tv);
  if (it == hic.local_shapes.end()) return -1;
  return numelOf(it->second) * static_cast<int64_t>(dataTypeSize(tv->dtype()));
}
}  // namespace

std::string describePostedCommunication(const HostIrContainer& hic, const Communication& c) {
  std::string s = "post " + c.toString();
  int64_t in = localBytes(hic, c.in), out = localBytes(hic, c.out);
  if (in >= 0) s += " in_bytes=" + std::to_string(in);
  if (out >= 0) s += " out_bytes=" + std::to_string(out);
  return s;
}

}  // namespace meshfuse
