// nxd-generate's end-to-end tests' helpers: tiny byte-vocabulary models saved as a Llama
// checkpoint and a GPT-NeoX transformers folder, the tool run as a process (under mpirun when
// MPIEXEC is defined), and its `tokens:` line read back.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/files.h"
#include "support/proc.h"
#include "support/tiny_models.h"

namespace nxd::testing::generate_tool {
namespace fs = std::filesystem;
using nxd::testing::run_process;

inline ModelConfig byte_model(const std::string& arch) {
  ModelConfig c = nxd::testing::tiny_model(arch);
  c.vocab_size = 256;
  c.ffn_hidden_size = 48;
  c.max_position_embeddings = 48;
  c.init_std = 0.3;
  return c;
}

inline nxd::testing::ProcResult generate(const std::vector<std::string>& args,
                                         const fs::path& dir) {
  std::vector<std::string> argv;
#ifdef MPIEXEC
  argv = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", "-np", "2"};
#endif
  argv.push_back(NXD_GENERATE_BIN);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, dir, std::chrono::seconds(120));
}

// The ids of the `tokens:` line.
inline std::vector<int64_t> tokens_of(const std::string& out) {
  const auto p = out.find("\ntokens:");
  if (p == std::string::npos) return {};
  std::istringstream s(out.substr(p + 8, out.find('\n', p + 1) - p - 8));
  std::vector<int64_t> v;
  for (int64_t x; s >> x;) v.push_back(x);
  return v;
}

inline std::vector<int64_t> bytes(const std::string& s) {
  std::vector<int64_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

// A saved Llama checkpoint (d/run) and a GPT-NeoX transformers folder (d/hf), and the models.
// A fresh scratch folder, removed at the end (the pid keeps other worktrees' runs apart).
struct Scratch {
  fs::path path = nxd::testing::test_temp_dir("nxd_generate_" + std::to_string(::getpid()) + "_");
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Fixture {
  Scratch dir;
  std::shared_ptr<CausalLM> llama = make_causal_lm(byte_model("llama"), 7);
  std::shared_ptr<CausalLM> neox = make_causal_lm(byte_model("gpt_neox"), 8);
  Fixture() {
    ckpt::save_checkpoint(dir.path / "run", "step_1", llama.get(), nullptr, nullptr);
    ckpt::save_checkpoint(dir.path / "neox", "step_1", neox.get(), nullptr, nullptr);
    ckpt::export_hf(dir.path / "neox/step_1", dir.path / "hf");
  }
};

}  // namespace nxd::testing::generate_tool
