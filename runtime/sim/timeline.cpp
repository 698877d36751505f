#include "nxd/runtime/sim/timeline.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "nxd/runtime/error.h"

namespace nxd::sim {
namespace {
void escape(std::ostream& os, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\')
      os << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      os << buf;
    } else
      os << c;
  }
}
}  // namespace

std::string Timeline::chrome_trace_json() const {
  std::ostringstream os;
  os.precision(15);
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  for (int r = 0; r < ranks(); ++r) {
    os << (first ? "" : ",")
       << "\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << 2 * r
       << ",\"args\":{\"name\":\"rank " << r << "\"}},\n"
       << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << 2 * r + 1
       << ",\"args\":{\"name\":\"rank " << r << " async comm\"}},\n"
       << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << 2 * ranks() + r
       << ",\"args\":{\"name\":\"rank " << r << " phases\"}}";
    first = false;
    for (const TraceEvent& e : lanes_[r]) {
      os << ",\n{\"name\":\"";
      escape(os, e.name);
      const std::string cat = e.category;
      const int tid = cat == "phase" ? 2 * ranks() + r : 2 * r + (cat == "comm-async" ? 1 : 0);
      os << "\",\"cat\":\"" << e.category << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << tid
         << ",\"ts\":" << e.start * 1e6 << ",\"dur\":" << e.duration * 1e6;
      if (!e.args.empty()) {
        os << ",\"args\":{\"info\":\"";
        escape(os, e.args);
        os << "\"}";
      }
      os << "}";
    }
  }
  os << "\n]}\n";
  return os.str();
}

void Timeline::write_chrome_trace(const std::string& path) const {
  std::ofstream f(path);
  NXD_CHECK_T(IoError, f.good(), "[sim::Timeline] cannot open '", path, "' for writing");
  f << chrome_trace_json();
  NXD_CHECK_T(IoError, f.good(), "[sim::Timeline] write to '", path, "' failed");
}

}  // namespace nxd::sim
