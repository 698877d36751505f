// GGUF (io/gguf.h, checkpoint/gguf_llama.h): ggml's codecs on hand-checked values, the rotary
// permutation against the formula of llama.cpp's converter, export -> import of a Llama
// checkpoint (bitwise for f32, the type's rounding for f16/bf16, exact blocks for q8_0/q4_0: a
// second export writes the same bytes), the model's logits through each type, TP 2 imports, and
// hostile files (truncated, bad counts, overlapping or misaligned tensors, mutated bytes)
// refused with an nxd error naming the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/io/gguf.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/rng.h"
#include "support/files.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace nxd;
using io::GgmlType;

namespace {

ModelConfig gguf_model() {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.hidden_size = 64;  // rows of 64 (q8_0/q4_0 blocks) except the FFN's down_proj (48: kept f16)
  c.ffn_hidden_size = 48;
  c.init_std = 0.05;  // logits that respond smoothly to the weights' rounding
  return c;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

std::vector<float> logits(CausalLM& m, const std::vector<int64_t>& ids) {
  NoGradGuard g;
  return m.forward(from_vector(ids, {1, static_cast<int64_t>(ids.size())})).to_vector_as<float>();
}

}  // namespace

TEST(Gguf, CodecsMatchGgmlOnHandCheckedValues) {
  EXPECT_EQ(io::f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(io::f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(io::f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(io::f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(io::f32_to_f16(65520.0f), 0x7C00);  // the tie rounds to even: infinity
  EXPECT_EQ(io::f32_to_f16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(io::f32_to_f16(0x1p-25f), 0x0000);  // its half: a tie to even (zero)
  EXPECT_EQ(io::f32_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(io::f32_to_f16(1.0f + 0x1p-11f), 0x3C00);  // tie: even
  EXPECT_EQ(io::f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  for (uint32_t h = 0; h < 0x7C00; ++h)  // every finite half survives the round trip
    ASSERT_EQ(io::f32_to_f16(io::f16_to_f32(static_cast<uint16_t>(h))), h) << h;
  // q8_0: d = amax / 127 (as f16), q = round(x / d)
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = (j - 16) * 0.25f;  // amax 4 at j = 0
  auto q8 = io::ggml_encode(GgmlType::q8_0, x.data(), 32);
  ASSERT_EQ(q8.size(), 34u);
  uint16_t d;
  std::memcpy(&d, q8.data(), 2);
  EXPECT_EQ(d, io::f32_to_f16(4.0f / 127));
  EXPECT_EQ(static_cast<int8_t>(q8[2]), -127);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 24]), static_cast<int8_t>(std::roundf(2.0f * (127 / 4.0f))));
  // q4_0: d = (the value of largest magnitude) / -8; x = -4 -> code 0 (value -8 d = -4)
  auto q4 = io::ggml_encode(GgmlType::q4_0, x.data(), 32);
  ASSERT_EQ(q4.size(), 18u);
  std::memcpy(&d, q4.data(), 2);
  EXPECT_EQ(d, io::f32_to_f16(0.5f));
  EXPECT_EQ(q4[2] & 15, 0);        // x[0] = -4
  EXPECT_EQ(q4[2] >> 4, 8);        // x[16] = 0
  EXPECT_EQ(q4[2 + 15] >> 4, 15);  // x[31] = 3.75 -> 7.5 + 8.5 = 16 -> min(15, 16)
  std::vector<float> back(32);
  io::ggml_decode(GgmlType::q4_0, q4.data(), 32, back.data());
  EXPECT_EQ(back[0], -4.0f);
  EXPECT_EQ(back[31], 3.5f);
}

// llama.cpp's converter: w.reshape(heads, 2, rows / heads / 2, cols).swapaxes(1, 2).reshape(...)
TEST(Gguf, RotaryPermutationIsTheConvertersAndItsInverse) {
  const int64_t heads = 3, hd = 8, cols = 5;
  std::vector<float> v(heads * hd * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const Tensor w = from_vector(v, {heads * hd, cols});
  const Tensor p = ckpt::permute_rotary_to_ggml(w, heads);
  const auto pv = p.to_vector_as<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < hd / 2; ++b)
        for (int64_t c = 0; c < cols; ++c)  // out[h, b, a, c] = in[h, a, b, c]
          ASSERT_EQ(pv[((h * (hd / 2) + b) * 2 + a) * cols + c],
                    v[((h * 2 + a) * (hd / 2) + b) * cols + c]);
  EXPECT_EQ(ckpt::permute_rotary_from_ggml(p, heads).to_vector_as<float>(), v);
}

TEST(Gguf, ExportImportRoundTripsEveryType) {
  nxd::testing::ScratchDir dir("nxd_gguf_");
  const ModelConfig c = gguf_model();
  auto model = make_causal_lm(c, 5);
  ckpt::save_checkpoint(dir.path / "run", "step_1", model.get(), nullptr, nullptr);
  const fs::path tag = dir.path / "run/step_1";
  const auto ids = nxd::testing::id_sequence(12, c.vocab_size, 3);
  const auto want = logits(*model, ids);
  std::map<std::string, Tensor> orig;
  for (auto& [n, t] : ckpt::read_merged_model(tag)) orig[n] = t;
  for (GgmlType type :
       {GgmlType::f32, GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_0}) {
    const std::string name = io::ggml_type_name(static_cast<uint32_t>(type));
    SCOPED_TRACE(name);
    const fs::path file = dir.path / (name + ".gguf");
    const auto rep = ckpt::export_gguf(tag, file, {.type = type});
    EXPECT_EQ(rep.tensors, 2 + 9 * c.num_layers + 1);
    const bool blocks = type == GgmlType::q8_0 || type == GgmlType::q4_0;
    EXPECT_EQ(rep.kept_f16, blocks ? c.num_layers : 0);  // down_proj's rows of 48
    const ckpt::GgufModel g = ckpt::read_gguf_model(file);
    EXPECT_EQ(g.cfg.vocab_size, c.vocab_size);
    EXPECT_EQ(g.cfg.num_kv_heads, c.num_kv_heads);
    ASSERT_EQ(g.full.size(), orig.size());
    double worst = 0;
    for (auto& [n, t] : orig) {
      const auto a = t.to_vector_as<float>(), b = g.full.at(n).to_vector_as<float>();
      ASSERT_EQ(a.size(), b.size()) << n;
      for (size_t i = 0; i < a.size(); ++i) {
        float expect = a[i];
        if (type == GgmlType::f16 ||
            (blocks && t.dim() == 2 && n.find("down_proj") != std::string::npos))
          expect = io::f16_to_f32(io::f32_to_f16(a[i]));
        if (type == GgmlType::bf16) {
          float r;
          io::ggml_decode(GgmlType::bf16, io::ggml_encode(GgmlType::bf16, &a[i], 1).data(), 1, &r);
          expect = t.dim() == 1 ? a[i] : r;
        }
        if (blocks && t.dim() == 2 && n.find("down_proj") == std::string::npos) {
          worst = std::max(worst, std::abs(double(b[i]) - a[i]));
          continue;
        }
        ASSERT_EQ(b[i], expect) << n << "[" << i << "]";
      }
    }
    // a block type's values: another export of the imported model writes the same bytes
    ckpt::import_gguf(file, dir.path / ("imported_" + name), "step_1", 1, 1);
    const fs::path again = dir.path / (name + "_again.gguf");
    ckpt::export_gguf(dir.path / ("imported_" + name) / "step_1", again, {.type = type});
    EXPECT_EQ(slurp(again), slurp(file)) << "export(import(file)) differs from file";
    auto back = make_causal_lm(c, 99);
    ckpt::load_full_tensors({back.get()}, g.full, file.string());
    const auto got = logits(*back, ids);
    double diff = 0, mx = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, std::abs(double(got[i]) - want[i]));
      mx = std::max(mx, std::abs(double(want[i])));
    }
    std::printf("    %s: %lld bytes, largest weight change %.3g, logits change %.3g (max %.3g)\n",
                name.c_str(), (long long)rep.bytes, worst, diff, mx);
    if (type == GgmlType::f32) {
      EXPECT_EQ(diff, 0.0);
    }
    EXPECT_LT(diff, type == GgmlType::q4_0 ? 0.25 * mx : 0.02 * mx);
  }
}

TEST(Gguf, RefusesWhatTheMappingDoesNotCoverAndNeverOverwrites) {
  nxd::testing::ScratchDir dir("nxd_gguf_");
  ModelConfig neox = nxd::testing::tiny_model("gpt_neox");
  auto m = make_causal_lm(neox, 1);
  ckpt::save_checkpoint(dir.path / "neox", "step_1", m.get(), nullptr, nullptr);
  try {
    ckpt::export_gguf(dir.path / "neox/step_1", dir.path / "x.gguf", {});
    FAIL() << "gpt_neox exported";
  } catch (const ckpt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("architecture 'gpt_neox'"), std::string::npos) << e.what();
  }
  auto l = make_causal_lm(gguf_model(), 1);
  ckpt::save_checkpoint(dir.path / "llama", "step_1", l.get(), nullptr, nullptr);
  spit(dir.path / "taken.gguf", "mine");
  EXPECT_THROW(ckpt::export_gguf(dir.path / "llama/step_1", dir.path / "taken.gguf", {}),
               ckpt::CheckpointError);
  EXPECT_EQ(slurp(dir.path / "taken.gguf"), "mine");
}

// Hostile files: each damage an IoError/CheckpointError naming the file; 1,500 random byte
// mutations of a valid file never crash or throw anything but nxd's errors.
TEST(Gguf, HostileFilesAreRefusedNamingTheFile) {
  nxd::testing::ScratchDir dir("nxd_gguf_");
  auto l = make_causal_lm(gguf_model(), 1);
  ckpt::save_checkpoint(dir.path / "llama", "step_1", l.get(), nullptr, nullptr);
  const fs::path good = dir.path / "good.gguf";
  ckpt::export_gguf(dir.path / "llama/step_1", good, {.type = GgmlType::q8_0});
  const std::string bytes = slurp(good);
  const fs::path bad = dir.path / "bad.gguf";
  const auto refused = [&](const std::string& content, const std::string& msg) {
    spit(bad, content);
    try {
      ckpt::read_gguf_model(bad);
      ADD_FAILURE() << "accepted: " << msg;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  };
  refused(bytes.substr(0, bytes.size() / 2), "lies past the data section");
  refused(bytes.substr(0, 30), "truncated");
  refused("GGUX" + bytes.substr(4), "not a GGUF file");
  std::string s = bytes;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(s.data() + 8, &huge, 8);  // the tensor count
  refused(s, "tensors and");
  s = bytes;
  std::memcpy(s.data() + 16, &huge, 8);  // the metadata count
  refused(s, "metadata entries");
  s = bytes;
  std::memcpy(s.data() + 24, &huge, 8);  // the first key's length
  refused(s, "has length");
  spit(bad, "");
  EXPECT_THROW(ckpt::read_gguf_model(bad), UserError);
  fs::create_directory(dir.path / "dir.gguf");
  EXPECT_THROW(ckpt::read_gguf_model(dir.path / "dir.gguf"), UserError);
  RngStream r{7, 1};
  int refusals = 0;
  for (int i = 0; i < 1500; ++i) {
    s = bytes;
    const int edits = 1 + static_cast<int>(r.uniform_f64(4 * i) * 4);
    for (int e = 0; e < edits; ++e) {
      // mostly the header and metadata (the first 4 KiB), where the structure is
      const size_t at = static_cast<size_t>(r.uniform_f64(4 * i + 1 + e) *
                                            std::min<size_t>(s.size(), e == 0 ? 4096 : s.size()));
      s[at] = static_cast<char>(r.uniform_f64(4 * i + 3 + e) * 256);
    }
    spit(bad, s);
    try {
      ckpt::read_gguf_model(bad);
    } catch (const UserError&) {
      ++refusals;
    }
  }
  std::printf("    1500 mutated files: %d refused, the rest read as (different) models\n",
              refusals);
  EXPECT_GT(refusals, 50);
}
