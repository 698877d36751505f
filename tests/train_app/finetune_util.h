#pragma once
// Shared by the fine-tuning tests: jsonl fixtures, a tiny nxd-train configuration and the message
// of a user error.
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"
#include "support/errors.h"

namespace nxd::testing::finetune {

namespace fs = std::filesystem;
using nxd::train_app::Config;
using nxd::train_app::TrainConfig;

inline fs::path write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream f(p);
  for (const auto& l : lines) f << l << "\n";
  return p;
}

// The message of the UserError fn throws ("no error" if none).
inline std::string message_of(const std::function<void()>& fn) {
  return nxd::testing::user_error_message(fn);
}

inline fs::path dpo_fixture(const fs::path& d) {
  std::vector<std::string> rows;
  for (int i = 0; i < 24; ++i)
    rows.push_back(str(R"({"prompt": "Q)", i % 5, R"(: the sky is", "chosen": " blue)",
                       std::string(static_cast<size_t>(i % 3), '!'),
                       R"(", "rejected": " green and)", i % 4, R"("})"));
  return write_lines(d / "pairs.jsonl", rows);
}

inline TrainConfig tiny_run(const fs::path& out, std::vector<std::string> extra) {
  Config c;
  for (std::string s :
       {"backend.world_size=1", "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.sequence_parallel=false", "trainer.max_steps=4",
        "trainer.log_every_n_steps=1", "trainer.val_check_interval=0", "trainer.num_threads=1",
        "data.seq_length=48", "data.micro_batch_size=4", "data.global_batch_size=4",
        "model.num_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
        "model.optim.lr=1e-2", "model.optim.sched.warmup_steps=1", "generation.max_new_tokens=0",
        "data.val_fraction=0", "trainer.matmul_precision=fp32"})
    c.apply_override(s);
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (auto& s : extra) c.apply_override(s);
  return nxd::train_app::resolve(c);
}

}  // namespace nxd::testing::finetune
