// Drives the metadata.json fuzz target without libFuzzer (fuzz_metadata.cpp): byte mutations of a
// real ZeRO-1 checkpoint's metadata.json, and structural ones (a value of another type or size, a
// key removed), must parse or throw CheckpointError; those that parse are loaded as that
// checkpoint's metadata, which must load or throw CheckpointError leaving the target untouched
// (and the same for a ZeRO-3 checkpoint in per-DP-rank blocks).
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "ckpt_util.h"
#include "support/mutate.h"
#include "support/ranks.h"
#include "zero1_util.h"

extern "C" int nxd_fuzz_metadata(const uint8_t* data, size_t size);

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
using nxd::testing::mutate_bytes;

// A ZeRO-1 checkpoint at TP 2 x DP 2 (splits, per-DP-rank optimizer files) to mutate; at stage
// three also the model in per-DP-rank blocks (format 3).
fs::path zero1_checkpoint(const fs::path& root, optim::ZeroStage stage = optim::ZeroStage::one) {
  nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(2);
    nxd::testing::Zero1Trainee t(2, {.zero1 = true, .stage = stage, .root = true});
    t.step(0, nxd::testing::shards_of(parallel_state::get_data_parallel_rank(), 2));
    save_checkpoint(root, "t", t.model.get(), t.opt.get(), t.sched.get());
  });
  return root / "t";
}

TEST(FuzzMetadata, ByteMutationsParseOrThrowCheckpointError) {
  const nxd::testing::ScratchDir scratch("nxd_fuzz_");
  const std::string good = nxd::testing::slurp(zero1_checkpoint(scratch.path) / "metadata.json");
  ASSERT_EQ(nxd_fuzz_metadata(reinterpret_cast<const uint8_t*>(good.data()), good.size()), 1);
  std::mt19937_64 g(7);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = good;
    mutate_bytes(s, g);
    parsed += nxd_fuzz_metadata(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("    %d of 3000 byte-mutated metadata.json parsed\n", parsed);
}

// Every value of the document by JSON pointer.
void pointers(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
              std::vector<nlohmann::json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object())
    for (const auto& [k, v] : j.items()) pointers(v, at / k, out);
  if (j.is_array())
    for (size_t i = 0; i < j.size(); ++i) pointers(j[i], at / i, out);
}

// One structural edit: a value replaced by one of another type or size, an integer moved by one
// or doubled, or a key removed.
void mutate_json(nlohmann::json& doc, std::mt19937_64& g) {
  std::vector<nlohmann::json::json_pointer> ps;
  pointers(doc, {}, ps);
  const auto& at = ps[1 + g() % (ps.size() - 1)];
  nlohmann::json& v = doc[at];
  const nlohmann::json others[] = {nullptr,
                                   true,
                                   -1,
                                   0,
                                   1,
                                   3,
                                   int64_t{1} << 40,
                                   1.5,
                                   "x",
                                   nlohmann::json::array(),
                                   nlohmann::json::object(),
                                   nlohmann::json::array({0}),
                                   1e300};
  switch (g() % 4) {
    case 0:
      v = others[g() % std::size(others)];
      break;
    case 1:
      if (v.is_number_integer()) v = v.get<int64_t>() + (g() % 2 ? 1 : -1);
      break;
    case 2:
      if (v.is_number_integer()) v = v.get<int64_t>() * 2;
      break;
    default:
      doc[at.parent_pointer()].erase(doc[at.parent_pointer()].is_object()
                                         ? nlohmann::json(at.back())
                                         : nlohmann::json(std::stoul(at.back())));
  }
}

// Structural mutations of the metadata.json of the checkpoint scratch/t loaded into AdamW on one
// rank: each parses and loads, or is refused with CheckpointError leaving the target untouched.
void structural_mutations(const fs::path& scratch, int count) {
  const fs::path dir = scratch / "t";
  const nlohmann::json good = nlohmann::json::parse(nxd::testing::slurp(dir / "metadata.json"));
  // the target: AdamW on one rank (TP resharding and the DP files' assembly)
  nxd::testing::Zero1Trainee t(1, {.seed = 5});
  const auto before = nxd::testing::snapshot(*t.model, t.opt.get());
  std::mt19937_64 g(11);
  int parsed = 0, loaded = 0;
  for (int i = 0; i < count; ++i) {
    nlohmann::json doc = good;
    for (int e = 1 + static_cast<int>(g() % 3); e > 0; --e) {
      try {
        mutate_json(doc, g);
      } catch (const nlohmann::json::exception&) {  // an edit that no longer applies
      }
    }
    const std::string text = doc.dump(1);
    if (!nxd_fuzz_metadata(reinterpret_cast<const uint8_t*>(text.data()), text.size())) continue;
    ++parsed;
    std::ofstream(dir / "metadata.json", std::ios::trunc) << text;
    try {
      load_checkpoint(scratch, t.model.get(), t.opt.get(), t.sched.get(), {.tag = "t"});
      ++loaded;  // an edit that changes nothing the load needs (or a value it takes as it is)
      for (const auto& [n, x] : t.model->state_dict()) x.detach().copy_(before.at("m:" + n));
      for (const auto& [n, x] : t.opt->state_tensors()) x.copy_(before.at("o:" + n));
    } catch (const CheckpointError&) {
      nxd::testing::expect_same(nxd::testing::snapshot(*t.model, t.opt.get()), before,
                                "after a refused load: " + text.substr(0, 200));
    }
  }
  std::printf("    %d structural mutations: %d parsed, %d of them loaded\n", count, parsed, loaded);
  EXPECT_GT(parsed, count / 15);
}

TEST(FuzzMetadata, StructuralMutationsLoadOrThrowCheckpointErrorAndNeverHalfLoad) {
  const nxd::testing::ScratchDir scratch("nxd_fuzz_");
  zero1_checkpoint(scratch.path);
  structural_mutations(scratch.path, 1500);
}

// The same over a ZeRO-3 checkpoint whose model is in per-DP-rank blocks ("zero3": true).
TEST(FuzzMetadata, StructuralMutationsOfAZero3BlockCheckpointNeverHalfLoad) {
  const nxd::testing::ScratchDir scratch("nxd_fuzz_z3_");
  zero1_checkpoint(scratch.path, optim::ZeroStage::three);
  ASSERT_TRUE(read_metadata(scratch.path / "t")["parallel"].value("zero3", false));
  structural_mutations(scratch.path, 1000);
}

}  // namespace
}  // namespace nxd::ckpt
