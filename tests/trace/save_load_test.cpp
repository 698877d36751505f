// Saved-then-loaded equals traced bitwise (shared and inlined weights, TP 1 and 2, and under
// mpirun -np 2); damaged trace folders are refused naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "nxd/trace/save_load.h"
#include "support/compare.h"
#include "support/files.h"
#include "trace_util.h"

using namespace nxd;
using namespace nxd::testing;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const trace::TraceError& e) {
    return e.what();
  }
  return "no error";
}

void flip_byte(const fs::path& p, int64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp(at);
  f.write(&c, 1);
}

std::shared_ptr<trace::TensorParallelModel> traced(int tp, bool inl, const std::string& backend) {
  const ModelConfig cfg = trace_config("llama", tp);
  trace::TraceOptions o{.tp_degree = tp,
                        .bucket_config = trace::BucketConfig::explicit_shapes({{1, 8}, {2, 16}}),
                        .inline_weights = inl,
                        .backend = backend};
  return trace::parallel_model_trace(causal_lm_fn(cfg), {trace_ids(1, 8, cfg.vocab_size)}, o);
}

}  // namespace

TEST(TraceSaveLoad, LoadedEqualsTracedBitwise) {
  if (under_mpi()) {
    const fs::path dir = fs::temp_directory_path() / "nxd_trace_save_mpi";
    run_ranks(2, [&] {
      if (world().rank() == 0) fs::remove_all(dir);
      world().barrier();
      auto m = traced(2, false, "mpi");
      const Tensor ids = trace_ids(2, 11, 64, 3);
      const Tensor want = m->forward({ids})[0];
      trace::parallel_model_save(*m, dir);
      auto l = trace::parallel_model_load(dir, {.backend = "mpi"});
      EXPECT_BITWISE_EQ(l->forward({ids})[0], want);
    });
    return;
  }
  for (int tp : {1, 2})
    for (bool inl : {false, true}) {
      SCOPED_TRACE(str("tp=", tp, " inline=", inl));
      const fs::path dir = test_temp_dir("nxd_trace_") / "model";
      auto m = traced(tp, inl, "sim");
      const Tensor ids = trace_ids(2, 11, 64, 3);
      const Tensor want = m->forward({ids})[0];
      trace::parallel_model_save(*m, dir);
      auto l = trace::parallel_model_load(dir);
      EXPECT_EQ(l->tp_degree(), tp);
      EXPECT_EQ(l->buckets().size(), 2u);
      // the same weights, constants, graph and plan
      for (size_t i = 0; i < l->ranks()[0].params[1].size(); ++i)
        EXPECT_BITWISE_EQ(l->ranks()[0].params[1][i], m->ranks()[0].params[1][i]) << i;
      for (size_t i = 0; i < l->ranks()[0].constants[1].size(); ++i)
        EXPECT_BITWISE_EQ(l->ranks()[0].constants[1][i], m->ranks()[0].constants[1][i]) << i;
      EXPECT_EQ(l->ranks()[0].graphs[1]->plan.arena_bytes,
                m->ranks()[0].graphs[1]->plan.arena_bytes);
      EXPECT_EQ(trace::graph_to_json(l->ranks()[0].graphs[1]->graph),
                trace::graph_to_json(m->ranks()[0].graphs[1]->graph));
      EXPECT_BITWISE_EQ(l->forward({ids})[0], want);
      // shared weights: one copy for both buckets; inlined: one per bucket
      const int64_t w = l->resident_bytes();
      EXPECT_EQ(inl, w > m->resident_bytes() + 1000) << w << " vs " << m->resident_bytes();
      EXPECT_THROW(trace::parallel_model_save(*m, dir), InvalidArgument);  // never overwrites
    }
}

TEST(TraceSaveLoad, DamagedFilesAreRefusedNamingTheFile) {
  if (under_mpi()) GTEST_SKIP() << "sim only";
  const fs::path base = test_temp_dir("nxd_trace_");
  auto m = traced(2, false, "sim");
  auto fresh = [&](const std::string& name) {
    const fs::path d = base / name;
    trace::parallel_model_save(*m, d);
    return d;
  };
  {  // truncated
    const fs::path d = fresh("trunc");
    fs::resize_file(d / "rank1/weights.safetensors",
                    fs::file_size(d / "rank1/weights.safetensors") - 5);
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("rank1/weights.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  }
  {  // a flipped byte in a graph
    const fs::path d = fresh("flip");
    flip_byte(d / "rank0/bucket1.json", 40);
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("rank0/bucket1.json"), std::string::npos) << e;
    EXPECT_NE(e.find("corrupt"), std::string::npos) << e;
  }
  {  // another format version
    const fs::path d = fresh("version");
    std::string man = slurp(d / "manifest.json");
    const auto at = man.find("\"version\": 2");
    ASSERT_NE(at, std::string::npos);
    man.replace(at, 12, "\"version\": 7");
    std::ofstream(d / "manifest.json") << man;
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("manifest.json has format version 7"), std::string::npos) << e;
  }
  // Issue 34, case 13: two ranks' files swapped with the manifest rewritten to match gave other
  // tokens; an edited manifest loaded; a version-1 trace (without either) is refused clearly
  {
    const fs::path d = fresh("swap");
    const std::string a = "rank0/weights.safetensors", b = "rank1/weights.safetensors";
    fs::rename(d / a, d / "tmp");
    fs::rename(d / b, d / a);
    fs::rename(d / "tmp", d / b);
    nlohmann::json man = nlohmann::json::parse(slurp(d / "manifest.json"));
    std::swap(man["files"][a], man["files"][b]);
    man["checksum"] = trace::manifest_checksum(man);
    std::ofstream(d / "manifest.json", std::ios::trunc) << man.dump(1);
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("rank0/weights.safetensors: records nxd.trace_rank=1 but its name says 0"),
              std::string::npos)
        << e;
    // a graph file of the other rank (its entry fixed too)
    const fs::path d2 = fresh("swap_graph");
    fs::copy_file(d2 / "rank1/bucket0.json", d2 / "rank0/bucket0.json",
                  fs::copy_options::overwrite_existing);
    nlohmann::json m2 = nlohmann::json::parse(slurp(d2 / "manifest.json"));
    m2["files"]["rank0/bucket0.json"] = m2["files"]["rank1/bucket0.json"];
    m2["checksum"] = trace::manifest_checksum(m2);
    std::ofstream(d2 / "manifest.json", std::ios::trunc) << m2.dump(1);
    const std::string e2 = error_of([&] { trace::parallel_model_load(d2); });
    EXPECT_NE(e2.find("rank0/bucket0.json: records rank=1 but its name says 0"), std::string::npos)
        << e2;
  }
  {  // an edited manifest (its metadata is covered by no file's checksum)
    const fs::path d = fresh("edited");
    nlohmann::json man = nlohmann::json::parse(slurp(d / "manifest.json"));
    man["metadata"]["note"] = "edited";
    std::ofstream(d / "manifest.json", std::ios::trunc) << man.dump(1);
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("manifest.json was edited or is corrupt: its CRC-32C is "), std::string::npos)
        << e;
    man["version"] = 1;
    man.erase("checksum");
    std::ofstream(d / "manifest.json", std::ios::trunc) << man.dump(1);
    const std::string v1 = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(v1.find("has format version 1, saved before traces recorded their ranks"),
              std::string::npos)
        << v1;
  }
  {  // a missing rank
    const fs::path d = fresh("missing");
    fs::remove_all(d / "rank1");
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("rank1/weights.safetensors is missing"), std::string::npos) << e;
  }
  {  // the wrong TP degree
    const fs::path d = fresh("tp");
    const std::string e = error_of([&] { trace::parallel_model_load(d, {.expect_tp_degree = 4}); });
    EXPECT_NE(e.find("traced at TP 2, expected TP 4"), std::string::npos) << e;
  }
  {  // no manifest
    const std::string e = error_of([&] { trace::parallel_model_load(base / "none"); });
    EXPECT_NE(e.find("manifest.json is missing"), std::string::npos) << e;
  }
  // a FIFO as the manifest or a weight file is refused at once (it hung in open before)
  for (const char* f : {"manifest.json", "rank1/weights.safetensors"}) {
    SCOPED_TRACE(f);
    const fs::path d = fresh(std::string("fifo_") + (f[0] == 'm' ? "m" : "w"));
    fs::remove(d / f);
    ASSERT_EQ(::mkfifo((d / f).c_str(), 0600), 0);
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("is a FIFO, not a regular file"), std::string::npos) << e;
  }
  {  // a manifest nested 100,000 deep is refused before parsing (it crashed the parser before)
    const fs::path d = fresh("deep");
    std::ofstream(d / "manifest.json") << std::string(100000, '[') << std::string(100000, ']');
    const std::string e = error_of([&] { trace::parallel_model_load(d); });
    EXPECT_NE(e.find("nested deeper than 64 levels"), std::string::npos) << e;
  }
}
