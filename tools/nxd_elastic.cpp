// nxd-elastic --hosts h1:2,h2:2 [--hostfile F] [--max-restarts N] [--mpirun-args '...']
//             [--mpirun PATH] [--train-bin PATH] [--stall-timeout S] [--keep-failed-slots]
//             [--restart-backoff S] [--restart-backoff-max S]
//             -- <nxd-train arguments>
// Runs nxd-train under mpirun over the hosts; when a rank or a host dies, relaunches on what is
// left with the largest layout keeping TP x PP and the global batch (DP shrinks, gradient
// accumulation grows), resuming from the newest complete checkpoint resharded to the new DP
// degree. Exit codes: 0 done, 2 a user mistake (bad flag, config, too few slots; or nxd-train's
// exit 2), 1 failed after the restarts, 128+n stopped by signal n. docs/design/run_safety.md, "Run
// safety".
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "elastic/launch.h"
#include "elastic/plan.h"
#include "elastic/supervisor.h"
#include "nxd/cli/exit.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"

namespace fs = std::filesystem;
using namespace nxd::elastic;

namespace {

const char* kUsage =
    "usage: nxd-elastic (--hosts h1:2,h2:2 | --hostfile F) [--max-restarts N (3)]\n"
    "                   [--mpirun-args '...'] [--mpirun PATH] [--train-bin PATH]\n"
    "                   [--stall-timeout S (0: off; at least 4 x the slowest step)]\n"
    "                   [--keep-failed-slots]\n"
    "                   [--restart-backoff S (1; doubled after each launch that trains no step)]\n"
    "                   [--restart-backoff-max S (60)]\n"
    "                   -- <nxd-train arguments>\n";

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> w;
  std::istringstream in(s);
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

double parse_number(const std::string& flag, const std::string& v, double lo, double hi) {
  size_t used = 0;
  double x = -1;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
  }
  if (used != v.size() || !(x >= lo && x <= hi))
    throw UsageError(flag + " must be a number from " + std::to_string(static_cast<long>(lo)) +
                     " to " + std::to_string(static_cast<long>(hi)) + ", got '" + v + "'");
  return x;
}

// nxd-train next to this program, else from PATH
std::string default_train_bin() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / "nxd-train", ec))
    return (self.parent_path() / "nxd-train").string();
  return "nxd-train";
}

// The configuration nxd-train will resolve (its --config, --set and --out), for TP, PP, the batch
// and the output folder.
nxd::train_app::Config train_config(const std::vector<std::string>& args) {
  nxd::train_app::Config cfg;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) {
      if (a.size() > flag.size() && a[flag.size()] == '=') return a.substr(flag.size() + 1);
      if (i + 1 >= args.size()) throw UsageError("nxd-train's " + flag + " needs a value");
      return args[++i];
    };
    auto is = [&](const std::string& flag) { return a == flag || a.rfind(flag + "=", 0) == 0; };
    if (is("--config"))
      cfg.merge_file(value("--config"));
    else if (is("--set"))
      cfg.apply_override(value("--set"));
    else if (is("--out"))
      cfg.set("exp_manager.exp_dir", value("--out"), "--out");
    else
      throw UsageError("nxd-train argument '" + a + "' is not --config, --set or --out");
  }
  cfg.set("backend.kind", "mpi", "nxd-elastic");
  return cfg;
}

SupervisorOptions parse(int argc, char** argv) {
  SupervisorOptions o;
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string hosts_spec, hostfile, mpirun = "mpirun", mpirun_args;
  size_t i = 0;
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    auto value = [&]() {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    if (a == "-h" || a == "--help")
      throw UsageError("");
    else if (a == "--hosts")
      hosts_spec = value();
    else if (a == "--hostfile")
      hostfile = value();
    else if (a == "--max-restarts")
      o.max_restarts = static_cast<int>(parse_number(a, value(), 0, 1000));
    else if (a == "--mpirun-args")
      mpirun_args = value();
    else if (a == "--mpirun")
      mpirun = value();
    else if (a == "--train-bin")
      o.train_bin = value();
    else if (a == "--stall-timeout")
      o.stall_timeout_s = parse_number(a, value(), 0, 1e6);
    else if (a == "--restart-backoff")
      o.restart_backoff_s = parse_number(a, value(), 0, 3600);
    else if (a == "--restart-backoff-max")
      o.restart_backoff_max_s = parse_number(a, value(), 0, 86400);
    else if (a == "--keep-failed-slots")
      o.keep_failed_slots = true;
    else
      throw UsageError("unknown argument '" + a + "'");
  }
  if (i >= args.size()) throw UsageError("missing '--' before the nxd-train arguments");
  o.train_args.assign(args.begin() + i + 1, args.end());
  if (hosts_spec.empty() == hostfile.empty())
    throw UsageError("give one of --hosts and --hostfile");
  o.hosts = hosts_spec.empty() ? read_hostfile(hostfile) : parse_hosts(hosts_spec);
  o.mpirun = {mpirun};
  for (auto& w : split_words(mpirun_args)) o.mpirun.push_back(w);
  if (o.train_bin.empty()) o.train_bin = default_train_bin();
  o.restart_backoff_max_s = std::max(o.restart_backoff_max_s, o.restart_backoff_s);
  return o;
}

int run(int argc, char** argv) {
  SupervisorOptions o = parse(argc, argv);
  nxd::train_app::Config cfg = train_config(o.train_args);
  const nxd::train_app::TrainConfig tc0 = nxd::train_app::resolve(cfg);
  o.request = {.tp = tc0.dist.tensor_model_parallel_size,
               .pp = tc0.dist.pipeline_model_parallel_size,
               .global_batch = tc0.data.global_batch_size};
  if (!cfg.is_null("data.micro_batch_size"))
    o.request.micro_batch = cfg.get_int("data.micro_batch_size");
  // a layout fits when nxd-train's whole configuration resolves with it (PP's micro batches, ...)
  o.fits = [cfg](const Layout& l) {
    nxd::train_app::Config c = cfg;
    try {
      c.set("backend.world_size", l.world(), "nxd-elastic");
      c.set("data.micro_batch_size", l.micro_batch, "nxd-elastic");
      c.set("backend.fail_rank", -1, "nxd-elastic");  // as relaunches run (checked once, below)
      nxd::train_app::resolve(c);
      return true;
    } catch (const nxd::UserError&) {
      return false;
    }
  };
  const int slots = total_slots(o.hosts);
  const auto layout = choose_layout(o.request, slots, o.fits);
  if (!layout) {
    if (const auto plain = choose_layout(o.request, slots)) {  // the configuration's own error
      cfg.set("backend.world_size", plain->world(), "nxd-elastic");
      cfg.set("data.micro_batch_size", plain->micro_batch, "nxd-elastic");
      nxd::train_app::resolve(cfg);
    }
    throw UsageError("the hosts give " + std::to_string(slots) +
                     " slots: TP x PP = " + std::to_string(o.request.tp * o.request.pp) +
                     " with a DP dividing the global batch " +
                     std::to_string(o.request.global_batch) + " does not fit");
  }
  // the first launch's full config must resolve (a mistake is reported here, once)
  cfg.set("backend.world_size", layout->world(), "nxd-elastic");
  cfg.set("data.micro_batch_size", layout->micro_batch, "nxd-elastic");
  const nxd::train_app::TrainConfig tc = nxd::train_app::resolve(cfg);
  o.exp_dir = tc.out_dir;
  o.checkpoint_dir = tc.exp.checkpoint.dirpath;
  if (!tc.exp.create_checkpoint_callback)
    std::fprintf(stderr,
                 "nxd-elastic: note: checkpointing is off "
                 "(exp_manager.create_checkpoint_callback=false): a restart trains from step 0\n");
  install_signal_handlers();
  return supervise(o);
}

}  // namespace

int main(int argc, char** argv) {
  return nxd::cli::run_main("nxd-elastic", [&] {
    try {
      return run(argc, argv);
    } catch (const UsageError& e) {
      if (*e.what()) std::fprintf(stderr, "nxd-elastic: error: %s\n", e.what());
      std::fputs(kUsage, *e.what() ? stderr : stdout);
      return *e.what() ? 2 : 0;
    }
  });
}
