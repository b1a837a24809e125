#include "backends/gloo/gloo_rendezvous.h"

#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/gloo/gloo_interface.h"
#include "multidevice/communicator.h"
#include "multidevice/debug_log.h"

namespace meshfuse::gloo_backend {

namespace {

// A gloo::Context whose pairs are connected through addresses exchanged over MPI. Gloo's own
// rendezvous wants a key-value Store (files, Redis); the device and transport context it would
// set are protected members, so a subclass sets them here.
class MpiConnectedContext final : public ::gloo::Context {
 public:
  MpiConnectedContext(int rank, int size) : ::gloo::Context(rank, size) {}

  // Makes a pair for every other member; returns, for each team rank, the length and bytes of
  // the address of the pair made for it (empty for this member itself).
  std::string makePairs(const std::shared_ptr<::gloo::transport::Device>& device) {
    device_ = device;
    transportContext_ = device->createContext(rank, size);
    transportContext_->setTimeout(getTimeout());
    std::string record;
    for (int peer = 0; peer < size; ++peer) {
      std::vector<char> bytes;
      if (peer != rank) bytes = transportContext_->createPair(peer)->address().bytes();
      const uint32_t n = static_cast<uint32_t>(bytes.size());
      record.append(reinterpret_cast<const char*>(&n), sizeof n);
      record.append(bytes.data(), bytes.size());
    }
    return record;
  }

  // records[peer]: what makePairs returned on that peer.
  void connectPairs(const std::vector<std::string>& records) {
    for (int peer = 0; peer < size; ++peer)
      if (peer != rank) transportContext_->getPair(peer)->connect(entry(records.at(static_cast<size_t>(peer)), rank));
  }

 private:
  // The `index`-th length-prefixed entry of a record.
  static std::vector<char> entry(const std::string& record, int index) {
    size_t at = 0;
    for (int i = 0;; ++i) {
      uint32_t n = 0;
      if (at + sizeof n > record.size()) throw std::logic_error("gloo rendezvous: a peer sent a truncated record");
      std::memcpy(&n, record.data() + at, sizeof n);
      at += sizeof n;
      if (at + n > record.size()) throw std::logic_error("gloo rendezvous: a peer sent a truncated record");
      if (i == index) return std::vector<char>(record.begin() + at, record.begin() + at + n);
      at += n;
    }
  }
};

constexpr char kPairs = 'P', kFailed = 'E';

}  // namespace

std::shared_ptr<::gloo::Context> connectTeam(Communicator& communicator, const std::vector<int64_t>& team,
                                             int rank_in_team, std::chrono::milliseconds timeout) {
  const std::string where = "gloo backend for team " + teamToString(team);
  auto context = std::make_shared<MpiConnectedContext>(rank_in_team, static_cast<int>(team.size()));
  context->setTimeout(timeout);
  // A member that cannot make its device still takes part in the exchange, with its reason in
  // place of addresses, so that every member throws at once instead of waiting for it.
  DeviceChoice choice;
  std::string record;
  try {
    choice = chooseDevice(communicator.nodes().nodesOf(team).size() == 1);
    ::gloo::transport::tcp::attr attr;
    attr.iface = choice.iface;
    attr.hostname = choice.address;
    record = kPairs + context->makePairs(::gloo::transport::tcp::CreateDevice(attr));
  } catch (const std::exception& e) {
    record = kFailed + (choice.reason.empty() ? "" : choice.reason + ": ") + e.what();
  }
  if (record[0] == kPairs && debug::enabled(debug::Level::Info))
    debug::info(where + ": TCP device on " + choice.reason + "; addresses exchanged over MPI");
  std::vector<std::string> records = communicator.allgatherBytes(team, record, timeout);
  for (size_t r = 0; r < records.size(); ++r)
    if (records[r].empty() || records[r][0] != kPairs)
      throw std::runtime_error(where + ": rank " + std::to_string(team[r]) + " (on " +
                               communicator.nodes().nodeName(communicator.nodes().nodeOf(team[r])) +
                               ") could not make its TCP device: " + records[r].substr(records[r].empty() ? 0 : 1));
  for (std::string& r : records) r.erase(0, 1);
  try {
    context->connectPairs(records);
  } catch (const std::exception& e) {
    throw std::runtime_error(where + ": connecting rank " + std::to_string(communicator.rank()) + " (" + choice.reason +
                             ") to the team's other members failed: " + e.what() +
                             " (set MESHFUSE_GLOO_IFACE to an interface that reaches them)");
  }
  return context;
}

}  // namespace meshfuse::gloo_backend
