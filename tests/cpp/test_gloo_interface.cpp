// Where the Gloo backend's TCP device listens (backends/gloo/gloo_interface.h), with the
// environment replaced: the explicit interface first, loopback for a team on one node, then Open
// MPI's TCP interface lists (names or subnets), then the host name's address.
#if MESHFUSE_HAVE_GLOO
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "backends/gloo/gloo_interface.h"

namespace meshfuse::gloo_backend {
namespace {

// A getenv over a fixed table.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  const char* operator()(const char* name) const {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  }
};

TEST(GlooInterface, MeshfuseGlooIfaceWinsEvenOnOneNode) {
  FakeEnv env{{{"MESHFUSE_GLOO_IFACE", "eth7"}, {"OMPI_MCA_btl_tcp_if_include", "lo"}}};
  for (bool one_node : {true, false}) {
    DeviceChoice c = chooseDevice(one_node, env);
    EXPECT_EQ(c.iface, "eth7");
    EXPECT_EQ(c.address, "");
    EXPECT_NE(c.reason.find("MESHFUSE_GLOO_IFACE"), std::string::npos) << c.reason;
  }
}

TEST(GlooInterface, ATeamOnOneNodeUsesLoopback) {
  DeviceChoice c = chooseDevice(true, FakeEnv{{{"OMPI_MCA_btl_tcp_if_include", "lo"}}});
  EXPECT_EQ(c.address, "127.0.0.1");
  EXPECT_NE(c.reason.find("loopback"), std::string::npos) << c.reason;
}

TEST(GlooInterface, OpenMpisTcpInterfaceByNameOrSubnet) {
  // Every Linux host has lo at 127.0.0.1; an entry this host lacks is passed over.
  for (const char* list : {"lo", "127.0.0.0/8", "nosuchiface9,10.255.255.0/30,lo"}) {
    DeviceChoice c = chooseDevice(false, FakeEnv{{{"OMPI_MCA_btl_tcp_if_include", list}}});
    EXPECT_EQ(c.address, "127.0.0.1") << list;
    EXPECT_NE(c.reason.find(std::string("OMPI_MCA_btl_tcp_if_include=") + list), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("interface lo"), std::string::npos) << c.reason;
  }
  // The BTL's list first, then the out-of-band channel's.
  DeviceChoice oob = chooseDevice(false, FakeEnv{{{"OMPI_MCA_btl_tcp_if_include", "nosuchiface9"},
                                                  {"OMPI_MCA_oob_tcp_if_include", "127.0.0.0/8"}}});
  EXPECT_NE(oob.reason.find("OMPI_MCA_oob_tcp_if_include"), std::string::npos) << oob.reason;
}

TEST(GlooInterface, ElseTheHostNamesAddressOrAnErrorAskingForTheInterface) {
  // What the host name resolves to differs between machines: either a usable address, named in
  // the reason, or an error that says what to set.
  try {
    DeviceChoice c = chooseDevice(false, FakeEnv{{{"OMPI_MCA_btl_tcp_if_include", "nosuchiface9"}}});
    EXPECT_NE(c.reason.find("host name"), std::string::npos) << c.reason;
    EXPECT_NE(c.address.rfind("127.", 0), 0u) << "a loopback address cannot reach other nodes: " << c.address;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MESHFUSE_GLOO_IFACE"), std::string::npos) << msg;
    EXPECT_NE(msg.find("OMPI_MCA_btl_tcp_if_include=nosuchiface9"), std::string::npos) << msg;
  }
}

TEST(GlooInterface, MatchIfIncludeTakesTheFirstEntryThisHostHas) {
  EXPECT_EQ(matchIfInclude("nosuchiface9,lo"), std::make_pair(std::string("lo"), std::string("127.0.0.1")));
  EXPECT_EQ(matchIfInclude("240.0.0.0/8"), std::make_pair(std::string(), std::string()));  // reserved (class E)
  EXPECT_EQ(matchIfInclude("127.0.0.0/33,garbage/"), std::make_pair(std::string(), std::string()));
}

}  // namespace
}  // namespace meshfuse::gloo_backend
#endif
