#include "nxd/trainer/checkpointing.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions opts) : opts_(std::move(opts)) {
  auto fail = [](auto&&... a) { throw ConfigError(str("[ModelCheckpoint] ", a...)); };
  if (opts_.dirpath.empty()) fail("dirpath must not be empty");
  if (opts_.every_n_train_steps < 0)
    fail("every_n_train_steps must be >= 0, got ", opts_.every_n_train_steps);
  if (opts_.save_top_k < -1 || opts_.save_top_k == 0)
    fail("save_top_k must be -1 (keep all) or positive, got ", opts_.save_top_k);
  if (opts_.monitor != "" && opts_.monitor != "loss" && opts_.monitor != "val_loss")
    fail("monitor must be empty, loss or val_loss, got '", opts_.monitor, "'");
  if (opts_.mode != "min" && opts_.mode != "max")
    fail("mode must be min or max, got '", opts_.mode, "'");
}

void ModelCheckpoint::on_fit_start(Trainer& trainer, TrainingModule&) {
  if (opts_.monitor == "val_loss" && trainer.options().val_check_interval == 0)
    throw ConfigError(
        "[ModelCheckpoint] monitor=val_loss needs validation (val_check_interval > 0)");
  kept_.clear();
  last_saved_ = -1;
  start_step_ = trainer.global_step();  // the resumed step, or 0
  have_val_ = false;
  stall_ = 0;
}

void ModelCheckpoint::on_validation_end(Trainer&, TrainingModule&, int64_t, double val_loss) {
  last_val_ = val_loss;
  have_val_ = true;
}

void ModelCheckpoint::on_step_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) {
  last_loss_ = out.loss;
  const int64_t n = opts_.every_n_train_steps;
  if (n > 0 && out.step % n == 0) {
    if (out.skipped) {  // a non-finite step is never checkpointed (its update was not applied)
      trainer.message(str("checkpoint step_", out.step,
                          " not saved: the step's loss or gradient "
                          "norm is not finite"));
      return;
    }
    save(trainer, module, out.step, out.loss);
  }
}

void ModelCheckpoint::on_fit_end(Trainer& trainer, TrainingModule& module) {
  const int64_t step = trainer.global_step();
  const bool save = opts_.save_last || trainer.preempted_by() != 0;  // preemption: always
  if (save && step > 0 && last_saved_ != step) this->save(trainer, module, step, last_loss_);
  ckpt::finalize_checkpoint();
}

// The tag is a complete checkpoint this fit resumed from and has not trained past: saving would
// rewrite the same state.
bool ModelCheckpoint::holds_this_state(const Trainer& trainer, int64_t step,
                                       const std::string& tag) const {
  namespace fs = std::filesystem;
  const std::string& from = trainer.options().ckpt_path;
  if (from.empty() || step != start_step_) return false;
  std::error_code ec;
  const fs::path dir = fs::path(opts_.dirpath) / tag;
  if (!fs::exists(dir / "done", ec)) return false;
  const fs::path f = fs::weakly_canonical(from, ec);
  return f == fs::weakly_canonical(opts_.dirpath, ec) || f == fs::weakly_canonical(dir, ec);
}

void ModelCheckpoint::save(Trainer& trainer, TrainingModule& module, int64_t step, double loss) {
  const std::string tag = "step_" + std::to_string(step);
  if (holds_this_state(trainer, step, tag)) {
    last_saved_ = step;
    trainer.message(str("checkpoint ", tag,
                        " already holds this state (resumed from it): not "
                        "saved again"));
    return;
  }
  double value = 0;
  if (opts_.monitor == "loss") value = loss;
  if (opts_.monitor == "val_loss") value = have_val_ ? last_val_ : INFINITY;
  if (opts_.mode == "max" && !opts_.monitor.empty()) value = -value;  // kept_ ranks by min
  if (std::isnan(value)) value = INFINITY;  // a NaN monitor ranks worst, never best
  nlohmann::json user = {{"trainer", trainer.loop_state()}};
  if (!opts_.monitor.empty()) user[opts_.monitor] = opts_.mode == "max" ? -value : value;
  ckpt::SaveOptions so;
  so.num_kept_ckpts = opts_.monitor.empty() && opts_.save_top_k > 0 ? opts_.save_top_k : 0;
  so.async_save = opts_.async_save;
  so.compress = opts_.compress;
  so.down_cast_bf16 = opts_.save_bf16;
  so.zero3_files = opts_.zero3_files;
  so.step = step;
  const auto& sched = trainer.schedule();
  std::vector<const Module*> parts;
  for (Module* m : module.model_parts()) parts.push_back(m);
  const auto st = ckpt::save_checkpoint(opts_.dirpath, tag, parts, &trainer.optimizer(),
                                        sched ? &*sched : nullptr, user, so);
  stall_ += st.stall_seconds;
  last_saved_ = step;
  kept_.emplace_back(value, tag);
  trainer.message(str("checkpoint ", tag, opts_.async_save ? " (async)" : "", ": training stalled ",
                      static_cast<int64_t>(st.stall_seconds * 1e3), " ms"));
  if (opts_.monitor.empty()) {
    if (opts_.save_top_k > 0 && static_cast<int64_t>(kept_.size()) > opts_.save_top_k)
      kept_.erase(kept_.begin());  // the library's retention removed it
    return;
  }
  if (opts_.save_top_k < 0 || static_cast<int64_t>(kept_.size()) <= opts_.save_top_k) return;
  // the worst by the monitor goes (ties: the older one); completed first if it is this one
  auto worst = std::max_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second > b.second);
  });
  ckpt::finalize_checkpoint();
  if (current_context().rank() == 0) ckpt::remove_checkpoint(opts_.dirpath, worst->second);
  kept_.erase(worst);
}

}  // namespace nxd::trainer
