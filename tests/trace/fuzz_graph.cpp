// Fuzz target for the trace graph reader (a saved rank<r>/bucket<b>.json's "graph"): any input
// must parse into a validated graph or throw TraceError; anything else (a crash, another
// exception, a sanitizer report) is a bug. Built as the libFuzzer entry point with -DNXD_FUZZ=ON
// (tests/trace/CMakeLists.txt: graph.cpp only, compiled by clang); every build drives it from
// fuzz_graph_replay.cpp, which also compiles each graph that parses.
#include <cstdint>
#include <string>

#include "nxd/trace/graph.h"

extern "C" int nxd_fuzz_trace_graph(const uint8_t* data, size_t size) {
  try {
    (void)nxd::trace::graph_from_json(std::string(reinterpret_cast<const char*>(data), size),
                                      "fuzz");
  } catch (const nxd::trace::TraceError&) {
  }
  return 0;
}

#ifdef NXD_FUZZ_TRACE_ENTRY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return nxd_fuzz_trace_graph(data, size);
}
#endif
