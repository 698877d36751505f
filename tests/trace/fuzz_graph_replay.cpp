// Drives the trace graph fuzz target without libFuzzer: deterministic byte mutations (bit flips,
// byte changes, truncations, insertions, erasures) and structural ones (a number changed, a key
// removed, a value of another type) of a real traced Llama graph must each parse or throw
// TraceError; each graph that parses must compile or throw TraceError. Saved folders with a
// mutated manifest or graph must load or throw TraceError.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "nxd/io/crc32c.h"
#include "nxd/trace/save_load.h"
#include "support/files.h"
#include "trace_util.h"

extern "C" int nxd_fuzz_trace_graph(const uint8_t* data, size_t size);

using namespace nxd;
using namespace nxd::testing;
using nlohmann::json;

namespace {

std::string real_graph() {
  const ModelConfig cfg = trace_config("llama", 1);
  auto rm = causal_lm_fn(cfg)();
  return trace::graph_to_json(
      trace::trace_graph(rm.forward, {rm.params, {trace_ids(1, 4, cfg.vocab_size)}, {}}).graph);
}

void mutate_bytes(std::string& s, std::mt19937_64& g) {
  const int edits = 1 + static_cast<int>(g() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = g() % s.size();
    switch (g() % 5) {
      case 0:
        s[at] = static_cast<char>(s[at] ^ (1 << (g() % 8)));
        break;
      case 1:
        s[at] = static_cast<char>("0123456789-[]{},:\"e"[g() % 19]);
        break;
      case 2:
        s.resize(at);
        break;
      case 3:
        s.insert(at, 1 + g() % 3, static_cast<char>("0123456789-"[g() % 11]));
        break;
      default:
        s.erase(at, 1 + g() % 16);
    }
  }
}

// One structural edit somewhere in the JSON tree.
void mutate_tree(json& j, std::mt19937_64& g) {
  json* at = &j;
  for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty(); ++depth) {
    auto it = at->begin();
    std::advance(it, static_cast<long>(g() % at->size()));
    if (g() % 3 == 0 && depth > 0) {
      if (at->is_object())
        at->erase(it.key());
      else
        at->erase(g() % at->size());
      return;
    }
    at = &*it;
  }
  switch (g() % 5) {
    case 0:
      *at = static_cast<int64_t>(g() % 200) - 100;
      break;
    case 1:
      *at = -1;
      break;
    case 2:
      *at = "linear";
      break;
    case 3:
      *at = json::array({g() % 7, -3});
      break;
    default:
      *at = int64_t{1} << (40 + g() % 23);
  }
}

void check_one(const std::string& s) {
  nxd_fuzz_trace_graph(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  trace::Graph gr;
  try {
    gr = trace::graph_from_json(s, "fuzz");
  } catch (const trace::TraceError&) {
    return;
  }
  try {
    (void)trace::compile(gr, {});
  } catch (const trace::TraceError&) {
  }
}

}  // namespace

TEST(FuzzTraceGraph, MutationsParseOrThrowTraceError) {
  const std::string good = real_graph();
  std::mt19937_64 g(7);
  for (int i = 0; i < 1500; ++i) {
    std::string s = good;
    mutate_bytes(s, g);
    check_one(s);
  }
  const json base = json::parse(good);
  for (int i = 0; i < 1500; ++i) {
    json j = base;
    mutate_tree(j, g);
    check_one(j.dump());
  }
}

// Whole folders: mutations of manifest.json, and of a graph file whose size and checksum are then
// fixed in the manifest (so the parser behind the checks is reached), must load or throw
// TraceError.
TEST(FuzzTraceGraph, MutatedFoldersLoadOrThrowTraceError) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  namespace fs = std::filesystem;
  const fs::path base = test_temp_dir("nxd_trace_");
  const ModelConfig cfg = trace_config("llama", 1);
  auto m = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 4, cfg.vocab_size)}, {});
  trace::parallel_model_save(*m, base / "good");
  const std::string man = slurp(base / "good/manifest.json");
  const std::string graph = slurp(base / "good/rank0/bucket0.json");
  std::mt19937_64 g(11);
  int loaded = 0;
  for (int i = 0; i < 300; ++i) {
    const fs::path d = base / "m";
    fs::remove_all(d);
    fs::copy(base / "good", d, fs::copy_options::recursive);
    if (i % 2 == 0) {
      std::string s = man;
      mutate_bytes(s, g);
      std::ofstream(d / "manifest.json", std::ios::binary) << s;
    } else {
      json gj = json::parse(graph);
      mutate_tree(gj, g);
      const std::string s = gj.dump(1);
      std::ofstream(d / "rank0/bucket0.json", std::ios::binary) << s;
      json mj = json::parse(man);
      mj["files"]["rank0/bucket0.json"] = {{"bytes", s.size()},
                                           {"crc32c", io::crc_hex(io::crc32c(s.data(), s.size()))}};
      mj["checksum"] = trace::manifest_checksum(mj);
      std::ofstream(d / "manifest.json", std::ios::binary) << mj.dump(1);
    }
    try {
      trace::parallel_model_load(d);
      ++loaded;
    } catch (const trace::TraceError&) {
    }
  }
  EXPECT_LT(loaded, 300);
}
