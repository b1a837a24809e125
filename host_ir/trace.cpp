#include "host_ir/trace.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "ir/ir.h"

namespace meshfuse {

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}
}  // namespace

std::string Tracer::toJsonEvents(int64_t rank) const {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed;
  bool first = true;
  // Lane names, so the viewer labels the rows.
  int64_t lanes = 1;
  for (const Event& e : events_) lanes = std::max(lanes, e.lane + 1);
  for (int64_t lane = 0; lane < lanes; ++lane) {
    os << (first ? "" : ",\n") << R"({"name":"thread_name","ph":"M","pid":)" << rank << R"(,"tid":)" << lane
       << R"(,"args":{"name":")" << (lane == 0 ? std::string("compute") : "comm stream " + std::to_string(lane - 1))
       << "\"}}";
    first = false;
  }
  os << ",\n"
     << R"({"name":"process_name","ph":"M","pid":)" << rank << R"(,"args":{"name":"rank )" << rank << "\"}}";
  for (const Event& e : events_) {
    os << ",\n"
       << R"({"name":")" << escape(e.name) << R"(","cat":")" << e.category << R"(","ph":"X","pid":)" << rank
       << R"(,"tid":)" << e.lane << R"(,"ts":)" << e.begin_us << R"(,"dur":)" << (e.end_us - e.begin_us) << "}";
  }
  return os.str();
}

void checkTraceWritable(const std::string& path) {
  // Without creating it: an execution that fails later leaves no empty file behind.
  const std::filesystem::path file(path);
  const std::filesystem::path folder = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const bool writable = ::access(path.c_str(), F_OK) == 0 ? ::access(path.c_str(), W_OK) == 0
                                                          : ::access(folder.c_str(), W_OK | X_OK) == 0;
  std::error_code ignored;
  if (std::filesystem::is_directory(file, ignored))  // writable as a folder, but not a file to write
    throw UserError("cannot write the trace to " + path +
                    ": it is a directory (trace= or MESHFUSE_TRACE names the file)");
  if (!writable) throw UserError("cannot write the trace to " + path + " (trace= or MESHFUSE_TRACE)");
}

void writeTrace(const std::string& path, const std::vector<std::string>& per_rank_events) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write the trace to " + path);
  out << "{\"traceEvents\": [\n";
  for (size_t r = 0; r < per_rank_events.size(); ++r) out << (r ? ",\n" : "") << per_rank_events[r];
  out << "\n], \"displayTimeUnit\": \"ms\"}\n";
}

}  // namespace meshfuse
