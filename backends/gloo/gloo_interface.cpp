#include "backends/gloo/gloo_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace meshfuse::gloo_backend {

namespace {

struct Interface {
  std::string name;
  in_addr address;
};

// Every IPv4 address of every interface that is up (Gloo's TCP transport and Open MPI's if_include
// lists are used with IPv4 here).
std::vector<Interface> ipv4Interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && i->ifa_name)
      out.push_back({i->ifa_name, reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr});
  freeifaddrs(list);
  return out;
}

std::string toText(in_addr a) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

bool isLoopback(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

// "10.1.2.0/24" contains `a`; false for anything that is not an IPv4 CIDR subnet.
bool inSubnet(const std::string& cidr, in_addr a) {
  const size_t slash = cidr.find('/');
  if (slash == std::string::npos) return false;
  in_addr net{};
  if (inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &net) != 1) return false;
  char* end = nullptr;
  const long bits = std::strtol(cidr.c_str() + slash + 1, &end, 10);
  if (*end != '\0' || bits < 0 || bits > 32) return false;
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (ntohl(net.s_addr) & mask) == (ntohl(a.s_addr) & mask);
}

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

// The first IPv4 address `host` resolves to (no DNS wait when it is in /etc/hosts).
bool resolveIpv4(const std::string& host, in_addr* out, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    *why = gai_strerror(rc);
    return false;
  }
  *out = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return true;
}

}  // namespace

std::pair<std::string, std::string> matchIfInclude(const std::string& list) {
  const std::vector<Interface> interfaces = ipv4Interfaces();
  std::istringstream entries(list);
  for (std::string entry; std::getline(entries, entry, ',');) {
    for (const Interface& i : interfaces)
      if (i.name == entry || inSubnet(entry, i.address)) return {i.name, toText(i.address)};
  }
  return {};
}

DeviceChoice chooseDevice(bool team_on_one_node, const std::function<const char*(const char*)>& getenv) {
  if (const char* iface = getenv("MESHFUSE_GLOO_IFACE"); iface && *iface)
    return {iface, "", "interface " + std::string(iface) + " from MESHFUSE_GLOO_IFACE"};
  if (team_on_one_node) return {"", "127.0.0.1", "loopback 127.0.0.1: the whole team runs on this node"};

  std::string skipped;  // Open MPI lists that named nothing on this host, for the error below
  for (const char* variable : {"OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"}) {
    const char* list = getenv(variable);
    if (!list || !*list) continue;
    auto [iface, address] = matchIfInclude(list);
    if (!iface.empty())
      return {"", address,
              "interface " + iface + " (" + address + "), the first of " + variable + "=" + list + " on this host"};
    skipped += std::string(skipped.empty() ? "" : ", ") + variable + "=" + list;
  }

  const std::string host = hostName();
  in_addr address{};
  std::string why;
  if (host.empty() || !resolveIpv4(host, &address, &why))
    throw std::runtime_error("the host name '" + host + "' does not resolve to an IPv4 address (" + why +
                             ") and no interface was named" + (skipped.empty() ? "" : " (none of " + skipped + ")") +
                             ": set MESHFUSE_GLOO_IFACE to the interface that reaches the other nodes");
  if (isLoopback(address))
    throw std::runtime_error("the host name '" + host + "' resolves to " + toText(address) +
                             ", a loopback address the other nodes cannot reach, and no interface was named" +
                             (skipped.empty() ? "" : " (none of " + skipped + " is on this host)") +
                             ": set MESHFUSE_GLOO_IFACE to the interface that reaches the other nodes");
  return {"", toText(address), "address " + toText(address) + " of the host name " + host};
}

}  // namespace meshfuse::gloo_backend
