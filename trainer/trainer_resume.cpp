// The trainer's loop state in a checkpoint (trainer/trainer.h): what loop_state() saves beside the
// model and optimizer (step, RNG, data position, manual optimization's counters, every pipeline
// stage's RNG counter), how restore_loop_state() takes it back (at another data-parallel size
// too), and resume() (load_checkpoint, then the loop state).
#include <filesystem>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

nlohmann::json Trainer::loop_state() const {
  nlohmann::json s = {{"step", step_},
                      {"rng_seed", current_context().rng().seed()},
                      {"rng_counter", current_context().rng().counter()},
                      {"dp_size", dp_},
                      {"data", nullptr}};
  if (data_)
    if (auto d = data_->state()) s["data"] = {{"epoch", d->epoch}, {"position", d->position}};
  if (manual_) {  // manual optimization: the batch index and the scheduler's position
    s["batches"] = batches_;
    if (lr_scheduler_) s["lr_scheduler_steps"] = lr_scheduler_->last_step();
  }
  if (pipeline_ && parallel_state::get_pipeline_model_parallel_size() > 1) {
    // stages draw different numbers of dropout masks: every stage's counter (collective)
    Communicator& g = parallel_state::get_pipeline_model_parallel_group();
    std::vector<double> c(static_cast<size_t>(g.size()), 0.0);
    c[static_cast<size_t>(g.rank())] = static_cast<double>(current_context().rng().counter());
    g.all_reduce(c.data(), c.data(), static_cast<int64_t>(c.size()), DType::f64, ReduceOp::sum);
    s["rng_counter_per_stage"] = c;
  }
  return s;
}

void Trainer::restore_loop_state(const nlohmann::json& s) {
  try {
    const int64_t step = s.at("step").get<int64_t>();
    if (step < 0) throw ConfigError(str("[trainer] checkpoint step ", step, " is negative"));
    Generator& g = current_context().rng();
    g.set_seed(s.at("rng_seed").get<uint64_t>());
    g.set_counter(s.at("rng_counter").get<uint64_t>());
    if (s.contains("rng_counter_per_stage") && pipeline_) {
      const auto c = s["rng_counter_per_stage"].get<std::vector<double>>();
      const int r = parallel_state::get_pipeline_model_parallel_rank();
      if (static_cast<int>(c.size()) == parallel_state::get_pipeline_model_parallel_size())
        g.set_counter(static_cast<uint64_t>(c[static_cast<size_t>(r)]));
    }
    if (data_ && !s.at("data").is_null()) {
      // Positions count this rank's micro batches: at another DP size the same number of
      // samples taken is position * saved_dp / dp (the epoch's sample order is the same).
      const int64_t saved_dp = s.value("dp_size", int64_t{dp_});
      int64_t pos = s["data"].at("position").get<int64_t>();
      if (saved_dp != dp_) {
        if (pos * saved_dp % dp_ != 0)
          throw ConfigError(str("[trainer] cannot resume at data parallel size ", dp_,
                                ": the checkpoint was saved at ", saved_dp, " after ", pos,
                                " micro batches per rank in its epoch, not a whole number at ",
                                dp_));
        pos = pos * saved_dp / dp_;
      }
      data_->set_state(DataState{s["data"].at("epoch").get<int64_t>(), pos});
    }
    if (manual_) {
      batches_ = s.value("batches", int64_t{0});
      if (lr_scheduler_) lr_scheduler_->set_last_step(s.value("lr_scheduler_steps", step));
    }
    step_ = step;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[trainer] checkpoint trainer state ", s.dump(), ": ", e.what()));
  }
}

// Model, optimizer (its steps and state) and the loop's state from a checkpoint (collective).
void Trainer::resume(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path root = path;
  std::string tag;
  if (fs::exists(root / "checkpoint")) {  // a checkpoint folder itself
    tag = root.filename().string();
    root = root.parent_path();
  } else if (auto newest = ckpt::newest_checkpoint(root)) {
    tag = *newest;
  }
  const nlohmann::json user =
      ckpt::load_checkpoint(root, nxd_model_->local_modules(), &optimizer(), nullptr, {.tag = tag});
  if (!user.is_object() || !user.contains("trainer"))
    throw ConfigError(str("[trainer] ", path,
                          " holds no trainer state (not saved by the trainer's "
                          "ModelCheckpoint)"));
  restore_loop_state(user["trainer"]);
  message(str("resumed from ", (root / tag).string(), " at step ", step_));
}

}  // namespace nxd::trainer
