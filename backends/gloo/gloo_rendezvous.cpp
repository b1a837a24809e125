#include "backends/gloo/gloo_rendezvous.h"

#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "backends/backend.h"
#include "multidevice/communicator.h"

namespace meshfuse::gloo_backend {

namespace {

// Every member contributes one fixed-size record (Communicator::allgatherBytes wants equal
// sizes): a status byte, the store directory (team rank 0 only) or why it could not be made,
// and the member's host name.
constexpr size_t kPathField = 1024, kHostField = 256;
constexpr char kOk = 'P', kFailed = 'E';

std::string field(const std::string& text, size_t width) {
  std::string out = text.substr(0, width - 1);
  out.resize(width, '\0');
  return out;
}
std::string unfield(const std::string& record, size_t offset, size_t width) {
  std::string out = record.substr(offset, width);
  return out.substr(0, out.find('\0'));
}

std::string hostName() {
  char name[kHostField] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// Made by team rank 0; removed (with the store's files) when it goes out of scope.
class StoreDirectory {
 public:
  StoreDirectory() {
    const char* base = std::getenv("MESHFUSE_GLOO_STORE_DIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/meshfuse-gloo-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      error_ = "mkdtemp(" + pattern + ") failed: " + std::strerror(errno) +
               " (set MESHFUSE_GLOO_STORE_DIR to a writable directory)";
      return;
    }
    path_ = pattern;
  }
  ~StoreDirectory() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_, error_;
};

::gloo::transport::tcp::attr deviceAttributes(const std::vector<std::string>& records) {
  ::gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("MESHFUSE_GLOO_IFACE"); iface && *iface) {
    attr.iface = iface;
    return attr;
  }
  const std::string mine = hostName();
  const bool one_host = std::all_of(records.begin(), records.end(), [&](const std::string& r) {
    return unfield(r, 1 + kPathField, kHostField) == mine;
  });
  attr.hostname = one_host ? "127.0.0.1" : mine;
  return attr;
}

}  // namespace

std::shared_ptr<::gloo::Context> connectTeam(Communicator& communicator, const std::vector<int64_t>& team,
                                             int rank_in_team, std::chrono::milliseconds timeout) {
  const std::string where = "gloo backend for team " + teamToString(team);
  std::unique_ptr<StoreDirectory> directory;
  std::string record;
  if (rank_in_team == 0) {
    directory = std::make_unique<StoreDirectory>();
    const bool ok = directory->error().empty();
    record = std::string(1, ok ? kOk : kFailed) + field(ok ? directory->path() : directory->error(), kPathField);
  } else {
    record = std::string(1, kOk) + field("", kPathField);
  }
  record += field(hostName(), kHostField);
  const std::vector<std::string> records = communicator.allgatherBytes(team, record, timeout);
  const std::string store_path = unfield(records[0], 1, kPathField);
  if (records[0][0] != kOk)  // every member throws the same error
    throw std::runtime_error(where + ": team rank 0 could not create the rendezvous directory: " + store_path);

  const int size = static_cast<int>(team.size());
  try {
    auto device = ::gloo::transport::tcp::CreateDevice(deviceAttributes(records));
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank_in_team, size);
    context->setTimeout(timeout);
    ::gloo::rendezvous::FileStore store(store_path);
    context->connectFullMesh(store, device);
    // Every member is connected once this returns, so the store directory can go.
    ::gloo::BarrierOptions barrier(context);
    barrier.setTimeout(timeout);
    ::gloo::barrier(barrier);
    return context;
  } catch (const std::exception& e) {
    throw std::runtime_error(where + " (store " + store_path + "): connecting the team failed: " + e.what());
  }
}

}  // namespace meshfuse::gloo_backend
