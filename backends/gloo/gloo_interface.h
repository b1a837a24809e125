// Where a rank's Gloo TCP device listens: an address the team's other members can reach. In order:
//   1. MESHFUSE_GLOO_IFACE (an interface name), when set;
//   2. loopback, when the whole team runs on this node (no network needed);
//   3. the interface Open MPI's TCP components use (OMPI_MCA_btl_tcp_if_include, else
//      OMPI_MCA_oob_tcp_if_include: interface names or CIDR subnets, the first one this host has),
//      since the job's MPI traffic already reaches the peers through it;
//   4. the address this host's name resolves to (as a cluster's DNS or /etc/hosts says), unless
//      that is a loopback address (Debian maps the host name to 127.0.1.1), which is an error
//      asking for MESHFUSE_GLOO_IFACE.
// The choice is made per rank; peers learn each other's addresses through the Communicator's MPI
// (gloo_rendezvous.cpp), so no host name needs to resolve anywhere but on its own host.
#pragma once
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>

namespace meshfuse::gloo_backend {

struct DeviceChoice {
  std::string iface;    // bind to this interface (Gloo looks up its address) ...
  std::string address;  // ... or to this numeric address
  std::string reason;   // for MESHFUSE_DEBUG=INFO and errors: "interface sim0 (10.1.2.1) from ..."
};

// `getenv` is replaceable for tests. Throws std::runtime_error when nothing usable is found.
DeviceChoice chooseDevice(
    bool team_on_one_node,
    const std::function<const char*(const char*)>& getenv = [](const char* name) { return std::getenv(name); });

// The first entry of an Open MPI if_include list ("eth0,10.0.0.0/8") this host has an IPv4
// address on, as (interface, address); empty strings when none.
std::pair<std::string, std::string> matchIfInclude(const std::string& list);

}  // namespace meshfuse::gloo_backend
