#include "nxd/train_app/cli.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#ifdef NXD_TRAINER_WITH_MPI
#include <mpi.h>
#endif

#include "nxd/cli/exit.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/io/bounded_read.h"
#include "nxd/io/env_check.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/run_dir.h"
#include "nxd/trainer/preempt.h"

namespace nxd::train_app {

namespace {

const char* kNxdTrainDescription =
    "Trains a decoder language model (Llama or GPT-NeoX) on byte-level text, a token file or\n"
    "random tokens, writing DIR/metrics.csv, DIR/config.yaml and DIR/sample.txt. With no\n"
    "arguments it trains the default configuration on /usr/share/games/fortunes.\n";

std::string usage(const CliOptions& o) {
  return str(
      "usage: ", o.program, " [--config FILE] [--set dotted.key=value ...] [--out DIR]\n\n",
      o.description.empty() ? kNxdTrainDescription : o.description,
      "\n"
      "  --config FILE        YAML or JSON (.json) configuration; may be given more than once\n"
      "  --set KEY=VALUE      override one key (VALUE read as YAML: 3e-4, true, [0.9, 0.95])\n"
      "  --out DIR            output directory (exp_manager.exp_dir)\n"
      "  --eval               evaluate only (trainer.max_steps=0): the validation loss and\n"
      "                       perplexity of model.init_from's or the resumed checkpoint's weights\n"
      "                       over the whole validation split\n"
      "  --print-config       print the resolved configuration as YAML and exit\n"
      "  --help-config        print every key with its type, default and description\n"
      "  -h, --help           this text\n");
}

enum class Action { train, print_config, done };

// After a run: 0, or 128 + the signal that preempted it (preempt.h), saying where it stopped.
int preempted_exit(const CliOptions& o, const TrainConfig& tc, const TrainResult& res, bool print) {
  const int sig = trainer::preemption_signal();
  if (sig == 0) return 0;
  if (print) {
    const std::string tag = str(tc.exp.checkpoint.dirpath, "/step_", res.steps);
    std::error_code ec;
    const std::string where =
        std::filesystem::exists(tag + "/done", ec)
            ? str("checkpoint ", tag, " (resume with exp_manager.resume_if_exists=true)")
            : std::string("no checkpoint was written");
    std::fflush(stdout);
    std::fprintf(stderr, "%s: preempted by %s after step %lld: %s\n", o.program.c_str(),
                 trainer::signal_name(sig).c_str(), static_cast<long long>(res.steps),
                 where.c_str());
    std::fflush(stderr);
  }
  return 128 + sig;
}

// Locks --out and checks it holds no other run (run_dir.h); prints what it did.
std::unique_ptr<RunDir> open_run_dir(const CliOptions& o, const Config& cfg,
                                     const TrainConfig& tc) {
  // auto: the default folder is nxd-train's scratch space, set aside; a folder the user chose
  // is refused.
  std::string existing = cfg.get_string("exp_manager.existing_run");
  if (existing == "auto") existing = tc.out_dir == kDefaultRunDir ? "set_aside" : "refuse";
  auto rd = std::make_unique<RunDir>(RunDirOptions{.out_dir = tc.out_dir,
                                                   .checkpoint_dir = tc.exp.checkpoint.dirpath,
                                                   .resume_if_exists = tc.exp.resume_if_exists,
                                                   .resume_from = tc.exp.resume_from_checkpoint,
                                                   .existing_run = existing,
                                                   .program = o.program});
  for (const auto& n : rd->notes()) std::printf("%s: %s\n", o.program.c_str(), n.c_str());
  std::fflush(stdout);
  return rd;
}

// Reads the flags into cfg; prints --help / --help-config itself (Action::done).
Action parse_args(const std::vector<std::string>& args, const CliOptions& o, Config& cfg) {
  std::string out;
  bool eval = false;
  Action action = Action::train;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> std::string {
      const std::string pre = std::string(flag) + "=";
      if (a.rfind(pre, 0) == 0) return a.substr(pre.size());
      if (i + 1 >= args.size())
        throw ConfigError(str("[", o.program, "] ", flag, " needs a value"));
      return args[++i];
    };
    auto is = [&](const char* flag) {
      return a == flag || a.rfind(std::string(flag) + "=", 0) == 0;
    };
    if (a == "-h" || a == "--help") {
      std::fputs(usage(o).c_str(), stdout);
      return Action::done;
    } else if (a == "--help-config") {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return Action::done;
    } else if (a == "--print-config") {
      action = Action::print_config;
    } else if (is("--config")) {
      cfg.merge_file(value("--config"));
    } else if (is("--set")) {
      cfg.apply_override(value("--set"));
    } else if (is("--out")) {
      out = value("--out");
    } else if (a == "--eval") {
      eval = true;
    } else {
      throw ConfigError(
          str("[", o.program, "] unknown argument '", a, "' (", o.program, " --help lists them)"));
    }
  }
  if (!out.empty()) cfg.set("exp_manager.exp_dir", out, "--out");
  if (eval) cfg.set("trainer.max_steps", 0, "--eval");
  return action;
}

// One rank per process under mpirun (backend.kind=mpi).
int run_mpi(int argc, char** argv, const CliOptions& o, Config& cfg, TrainConfig tc) {
  if (!mpi::available())
    throw ConfigError(
        str("[", o.program, "] backend.kind=mpi but nxd was built without MPI (NXD_WITH_MPI=OFF)"));
  mpi::Session session(&argc, &argv, tc.seed);
  if (tc.dist.collective_timeout_s > 0) mpi::set_collective_timeout(tc.dist.collective_timeout_s);
  // errors every rank finds alike (the world does not fit the config): rank 0 prints, then all
  // leave together (a rank exiting first would make mpirun kill rank 0 before it printed)
  std::string world_error;
  try {
    if (tc.dist.world_size_from_launcher) {  // the checks that need the world run now
      cfg.set("backend.world_size", session.size(), "the MPI world");
      tc = resolve(cfg);
    }
    if (session.size() != tc.dist.world_size)
      throw ConfigError(str("[", o.program, "] backend.world_size=", tc.dist.world_size,
                            " but mpirun started ", session.size(), " process(es)"));
    check_world(tc.dist.world_size, tc.dist.tensor_model_parallel_size,
                tc.dist.pipeline_model_parallel_size, tc.dist.context_parallel_size);
  } catch (const UserError& e) {
    world_error = e.what();
  }
  // rank 0 locks --out and checks its contents; every rank learns whether that failed
  std::unique_ptr<RunDir> run_dir;
  if (world_error.empty()) {
    int32_t refused = 0;
    if (session.rank() == 0) try {
        run_dir = open_run_dir(o, cfg, tc);
      } catch (const UserError& e) {
        world_error = e.what(), refused = 1;
      }
    world().all_reduce(&refused, &refused, 1, DType::i32, ReduceOp::max);
    if (refused && world_error.empty()) world_error = "rank 0 refused the output directory";
  }
  if (!world_error.empty()) {
    if (session.rank() == 0) {
      std::fprintf(stderr, "%s: error: %s\n", o.program.c_str(), io::one_line(world_error).c_str());
      std::fflush(stderr);
    }
    world().barrier();
    // Only rank 0, which printed, carries the exit code: mpirun tears the job down at the first
    // non-zero exit, and rank 0's forwarded stderr could be lost if another rank got there first.
    return session.rank() == 0 ? 2 : 0;
  }
  int code = 0;
  std::string what;
  trainer::PreemptionGuard preemption;
  TrainResult res;
  try {
    res = train(tc, {}, o.make_module);
  } catch (const UserError& e) {
    code = 2, what = str("error: rank ", session.rank(), ": ", e.what());
  } catch (const OutOfDeviceMemory& e) {  // the config asks for more than the machine has
    code = 2, what = str("error: rank ", session.rank(), ": ", e.what());
  } catch (const std::exception& e) {
    code = 1, what = str("internal error: rank ", session.rank(), ": ", e.what());
  }
  if (code != 0) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", o.program.c_str(), io::one_line(what).c_str());
    std::fflush(stderr);
#ifdef NXD_TRAINER_WITH_MPI
    MPI_Abort(MPI_COMM_WORLD, code);  // the peers may be waiting in a collective
#endif
  }
  // preempted: every rank stopped after the same step; rank 0 says where the checkpoint is
  if (code == 0) code = preempted_exit(o, tc, res, session.rank() == 0);
  return code;
}

int run(int argc, char** argv, const CliOptions& o) {
  io::check_environment();
  Config cfg;
  if (o.defaults) o.defaults(cfg);
  const Action action = parse_args(std::vector<std::string>(argv + 1, argv + argc), o, cfg);
  if (action == Action::done) return 0;
  TrainConfig tc = resolve(cfg);
  if (action == Action::print_config) {
    std::fputs(tc.resolved.to_yaml().c_str(), stdout);
    return 0;
  }
  if (tc.dist.backend == "mpi") return run_mpi(argc, argv, o, cfg, std::move(tc));
  const std::unique_ptr<RunDir> run_dir = open_run_dir(o, cfg, tc);
  trainer::PreemptionGuard preemption;
  const TrainResult res = train(tc, {}, o.make_module);
  return preempted_exit(o, tc, res, /*print=*/true);
}

}  // namespace

int run_cli(int argc, char** argv, const CliOptions& opts) {
  return cli::run_main(opts.program.c_str(), [&] { return run(argc, argv, opts); },
                       {.quiet = cli::launcher_rank() != 0});
}

}  // namespace nxd::train_app
