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
#include "support/mutate.h"
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

void mutate_json_bytes(std::string& s, std::mt19937_64& g) {
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
    mutate_json_bytes(s, g);
    check_one(s);
  }
  const json base = json::parse(good);
  for (int i = 0; i < 1500; ++i) {
    json j = base;
    nxd::testing::mutate_json_tree(j, g);
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
      mutate_json_bytes(s, g);
      std::ofstream(d / "manifest.json", std::ios::binary) << s;
    } else {
      json gj = json::parse(graph);
      nxd::testing::mutate_json_tree(gj, g);
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

// The trace manifest's fuzz target (issue 34): 2,000 deterministic mutations of a saved TP2
// trace's manifest.json, byte edits and structural edits of its tree, each with its checksum made
// to match (so the reader behind the check is reached), must load or throw TraceError: never a
// crash, a hang or another exception. The seed is the manifest of the trace saved here.
TEST(FuzzTraceGraph, MutatedManifestsLoadOrThrowTraceError) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  namespace fs = std::filesystem;
  const fs::path base = test_temp_dir("nxd_trace_");
  const ModelConfig cfg = trace_config("llama", 2);
  auto m = trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 4, cfg.vocab_size)},
                                       {.tp_degree = 2});
  trace::parallel_model_save(*m, base / "good");
  const std::string man = slurp(base / "good/manifest.json");
  std::mt19937_64 g(34);
  int loaded = 0, refused = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string s = man;
    if (i % 2 == 0) {
      nxd::testing::mutate_bytes(s, g);
      try {  // still JSON: its checksum made to match
        json j = json::parse(s);
        if (j.is_object()) {
          j["checksum"] = trace::manifest_checksum(j);
          s = j.dump(1);
        }
      } catch (const json::exception&) {
      }
    } else {
      json j = json::parse(man);
      for (int k = 1 + static_cast<int>(g() % 3); k > 0; --k) nxd::testing::mutate_json_tree(j, g);
      if (j.is_object()) j["checksum"] = trace::manifest_checksum(j);
      s = j.dump(1);
    }
    std::ofstream(base / "good/manifest.json", std::ios::binary | std::ios::trunc) << s;
    try {
      trace::parallel_model_load(base / "good");
      ++loaded;
    } catch (const trace::TraceError&) {
      ++refused;
    }
  }
  std::printf("manifest.json: %d of 2000 mutations loaded, %d refused\n", loaded, refused);
  EXPECT_EQ(loaded + refused, 2000);
  EXPECT_LT(loaded, 2000);
}
