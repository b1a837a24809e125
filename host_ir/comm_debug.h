// The MESHFUSE_DEBUG=INFO line of a communication as the evaluator posts it: type, team, backend
// and the bytes this rank sends and receives.
#pragma once
#include <string>

#include "host_ir/host_ir.h"

namespace meshfuse {

std::string describePostedCommunication(const HostIrContainer& hic, const Communication& c);

}  // namespace meshfuse
