// LoRA checkpoints outside training (checkpoint/lora_files.h): a TP 2 model with adapters saved,
// exported with its adapters merged (export-hf --merge-lora) and loaded as a plain model at TP 1
// gives the adapted model's logits; the adapters alone round-trip through PEFT's folder; and a
// PEFT-layout adapter read by a plain-PyTorch LoRA reference (lora_reference.py, Debian's
// python3-torch) gives nxd's logits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/lora_files.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/lora.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

namespace fs = std::filesystem;
using namespace nxd;

namespace {

LoraConfig lora() {
  return nxd::testing::every_projection_lora();
}

ModelConfig model(int tp) {
  ModelConfig mc = nxd::testing::tiny_gqa_llama(2);
  mc.kv_size_multiplier = std::max(1, tp / 2);
  return mc;
}

// The adapted model of `tp` ranks (adapters initialized from seed 5, B random): its full logits
// of `ids` on every rank.
std::shared_ptr<CausalLM> adapted(int tp) {
  parallel_state::initialize_model_parallel(tp);
  auto m = make_causal_lm(model(tp), 3);
  apply_lora(*m, lora(), 5);
  nxd::testing::randomize_lora_b(*m);
  m->eval();
  return m;
}

Tensor ids() {
  return nxd::testing::random_ids(31, 0, 64);
}

Tensor logits_of_plain(const std::map<std::string, Tensor>& full) {
  Tensor out;
  nxd::testing::run_ranks(1, [&] {
    parallel_state::initialize_model_parallel(1);
    auto m = make_causal_lm(model(1), 0);
    ckpt::load_full_tensors({m.get()}, full, "merged export");
    NoGradGuard ng;
    out = m->forward(ids());
  });
  return out;
}

}  // namespace

TEST(LoraExport, MergedExportGivesTheAdaptedModelsLogits) {
  const fs::path d = nxd::testing::test_temp_dir("nxd_lora_export_");
  Tensor adapted_logits;
  nxd::testing::run_ranks(2, [&] {
    auto m = adapted(2);
    {
      NoGradGuard ng;
      Tensor l = m->forward(ids());
      if (current_context().rank() == 0) adapted_logits = l.clone();
    }
    ckpt::save_checkpoint(d / "ckpt", "t", m.get(), nullptr, nullptr);
  });
  const fs::path tag = d / "ckpt" / "t";
  EXPECT_TRUE(ckpt::read_metadata(tag).contains("lora"));
  EXPECT_THROW(ckpt::export_hf(tag, d / "refused"), ckpt::CheckpointError);
  ckpt::export_hf(tag, d / "hf", {.merge_lora = true});
  std::map<std::string, Tensor> merged;
  for (auto& [n, t] : io::SafetensorsReader(d / "hf" / "model.safetensors").read_all()) {
    EXPECT_FALSE(is_lora_name(n)) << n;
    merged[n] = t;
  }
  const Tensor plain = logits_of_plain(merged);
  const auto diff = nxd::testing::diff(plain, adapted_logits);
  std::printf(
      "    merged export (TP 1) vs the adapted TP 2 model: largest logit difference %.3g "
      "(relative %.3g)\n",
      diff.max_abs, diff.rel());
  EXPECT_LE(diff.max_abs, 1e-5);
  // the adapters change the model: the base alone differs
  ckpt::PeftAdapter a;
  const auto base = ckpt::read_model_and_adapter(tag, &a);
  EXPECT_GT(nxd::testing::diff(logits_of_plain(base), adapted_logits).max_abs, 1e-3);
  // the adapters alone, as PEFT writes them, read back bitwise
  ckpt::export_lora(tag, d / "peft");
  io::SafetensorsReader peft(d / "peft" / "adapter_model.safetensors");
  for (const auto& t : peft.header().tensors)
    EXPECT_EQ(t.name.rfind("base_model.model.model.layers.", 0), 0u) << t.name;
  const ckpt::PeftAdapter back = ckpt::read_peft_adapter(d / "peft");
  EXPECT_EQ(back.config.lora_rank, 4);
  EXPECT_EQ(back.config.lora_alpha, 8.0);
  ASSERT_EQ(back.tensors.size(), a.tensors.size());
  EXPECT_EQ(back.tensors.size(), 2u * 7u * 2u);  // A and B of 7 projections in 2 layers
  for (const auto& [n, t] : a.tensors) EXPECT_BITWISE_EQ(back.tensors.at(n), t) << n;
}

// nxd's adapted model (TP 1) against lora_reference.py: Llama in plain PyTorch (float64) from
// config.json and model.safetensors, with y = x W^T + (alpha / r) (x A^T) B^T on every layer that
// adapter_model.safetensors names.
TEST(LoraExport, PeftAdapterInPlainPyTorchGivesNxdsLogits) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "Debian's python3-torch is not installed (apt-get install python3-torch): "
                    "the PyTorch reference cannot run";
  const fs::path d = nxd::testing::test_temp_dir("nxd_lora_torch_");
  nxd::testing::run_ranks(1, [&] {
    auto m = adapted(1);
    std::vector<std::pair<std::string, Tensor>> base;
    ckpt::PeftAdapter a;
    a.config = lora();
    for (auto& [n, t] : m->state_dict())
      if (is_lora_name(n))
        a.tensors[n] = t;
      else
        base.emplace_back(n, t);
    fs::create_directories(d / "base");
    io::write_safetensors(d / "base" / "model.safetensors", base);
    std::ofstream(d / "base" / "config.json") << ckpt::hf_config_json(m->config()).dump(2);
    ckpt::write_peft_adapter(d / "adapter", a);
    NoGradGuard ng;
    const Tensor x = ids();
    io::write_safetensors(d / "nxd.safetensors", {{"ids", x}, {"logits", m->forward(x)}});
  });
  const std::string cmd =
      "/usr/bin/python3 " + std::string(NXD_LORA_REFERENCE) + " " + d.string() + " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  std::printf("    %s", out.c_str());
  EXPECT_EQ(rc, 0) << out;
}
