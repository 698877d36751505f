// nxd-plan --search (nxd_plan.h): the layouts of the world that fit, fastest first, each with why
// it won over the choices it was compared with.
//
// A layout is TP x PP x DP x CP, EP (mixture-of-experts models) and a micro batch; its choices
// of ZeRO-1 and activation checkpointing are planned cheapest in time first (no ZeRO-1 and less
// recomputation first), and the first that fits is timed: the ones after it only trade time for
// memory. Context parallelism is for sequences whose activations do not fit: CP 2, 4, ... is
// tried for a TP x PP only while no layout of the smaller CP fits (a larger CP adds ring
// exchanges and nothing else) and while it lowers the least memory needed. Expert parallelism
// is tried at every size dividing DP x CP (parallel_state folds it over both) and the expert
// count: it trades the experts' memory and gradient reduction for the all-to-all, which the
// modeled step weighs.
//
// The search's work is bounded (docs/design/input_limits.md): a layout whose parameters alone
// cannot fit a NeuronCore (train_app::min_parameter_bytes_per_rank, closed form) is skipped
// unplanned; of a layout's choices the one needing the least memory (ZeRO-1, full checkpointing)
// is planned first and, when it does not fit, the others are skipped; when its resident state
// (parameters, gradients, optimizer state: the same at every micro batch and CP) alone is over
// HBM, the layout's smaller micro batches and larger CPs are skipped too; and at most
// Args::max_plans plans are made (the search says when it stopped there). Each planned candidate
// is printed to stderr as it finishes.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>

#include "nxd/runtime/error.h"
#include "nxd_plan.h"

namespace nxd::plan_tool {

namespace {

using train_app::Config;
using train_app::TrainConfig;

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

struct Layout {
  int64_t tp = 1, pp = 1, cp = 1, ep = 1, mb = 1;
  auto key() const { return std::tie(tp, pp, cp, mb); }  // a layout but its EP
};

// One layout's outcome: the prediction of its first choice that fits, or the least total of
// the choices that do not.
struct Tried {
  Layout l;
  bool fits = false;
  Prediction p;
  int64_t least = kNone;  // the smallest worst-rank total of a choice that does not fit
  int over = 0;           // the choices before the winner (none fit)
  std::string cheapest;   // the first of them and its total
};

std::string choice_name(const TrainConfig& c) {
  return str(c.dist.zero1() ? "ZeRO-1" : "no ZeRO-1", ", checkpointing ",
             checkpoint_granularity_name(c.model.activations_checkpoint_granularity));
}

std::vector<TrainConfig> choices(const Args& a, const sim::MachineSpec& m, const Layout& l) {
  const int64_t dp = m.world_size() / (l.tp * l.pp * l.cp);
  std::vector<TrainConfig> out;
  for (bool z : {false, true})
    for (const char* ck : {"null", "selective", "full"}) {
      if (z && dp == 1) continue;
      Config c = make_config(a, m);
      c.apply_override(str("distributed_strategy.tensor_model_parallel_size=", l.tp));
      c.apply_override(str("distributed_strategy.pipeline_model_parallel_size=", l.pp));
      c.apply_override(str("distributed_strategy.context_parallel_size=", l.cp));
      c.apply_override(str("distributed_strategy.expert_model_parallel_size=", l.ep));
      c.apply_override(str("data.micro_batch_size=", l.mb));
      c.apply_override(str("distributed_strategy.zero1=", z ? "true" : "false"));
      c.apply_override(str("model.activations_checkpoint_granularity=", ck));
      try {
        out.push_back(train_app::resolve(c));
      } catch (const UserError&) {  // a layout the model or batch does not allow
      }
    }
  return out;
}

// What the search has spent: plans made, and layouts or choices skipped unplanned.
struct Budget {
  int max_plans = 0;
  int planned = 0, skipped = 0;
  bool exhausted = false;  // stopped at max_plans
  bool take() {
    if (planned >= max_plans) exhausted = true;
    if (exhausted) return false;
    ++planned;
    return true;
  }
};

void progress(const Budget& b, const Layout& l, const TrainConfig& c, const std::string& what) {
  std::fprintf(stderr,
               "nxd-plan --search: [%d/%d] TP %lld x PP %lld x CP %lld, EP %lld, micro "
               "batch %lld, %s: %s\n",
               b.planned, b.max_plans, static_cast<long long>(l.tp), static_cast<long long>(l.pp),
               static_cast<long long>(l.cp), static_cast<long long>(l.ep),
               static_cast<long long>(l.mb), choice_name(c).c_str(), what.c_str());
  std::fflush(stderr);
}

// `resident_over`: set when even the least-memory choice's resident state (parameters,
// gradients, optimizer state) is over HBM, so that no micro batch or CP of the layout fits.
Tried try_layout(const std::vector<TrainConfig>& cs, const Layout& l, const sim::MachineSpec& m,
                 Budget& budget, bool& resident_over) {
  Tried t{l};
  resident_over = false;
  const double hbm = static_cast<double>(m.core.hbm_bytes);
  if (train_app::min_parameter_bytes_per_rank(cs.front()) > hbm) {  // any choice: the same weights
    const double need = train_app::min_parameter_bytes_per_rank(cs.front());
    t.least = static_cast<int64_t>(std::min(need, 9e18));
    t.over = static_cast<int>(cs.size());
    t.cheapest = str("parameters alone, at least ", train_app::format_bytes(t.least));
    budget.skipped += static_cast<int>(cs.size());
    resident_over = true;
    return t;
  }
  // the choice needing the least memory (the last: ZeRO-1, full checkpointing) first
  if (budget.take()) {
    const train_app::RankMemory w = train_app::plan_memory(cs.back()).worst();
    progress(budget, l, cs.back(),
             str("needs ", train_app::format_bytes(w.total()),
                 w.total() > m.core.hbm_bytes ? " (does not fit)" : ""));
    if (w.total() > m.core.hbm_bytes) {
      t.least = w.total();
      t.over = static_cast<int>(cs.size());
      t.cheapest = str(choice_name(cs.back()), ", needs ", train_app::format_bytes(w.total()));
      budget.skipped += static_cast<int>(cs.size()) - 1;
      resident_over = w.parameters + w.gradients + w.optimizer_state > m.core.hbm_bytes;
      return t;
    }
  }
  for (const TrainConfig& c : cs) {
    if (!budget.take()) break;
    const int64_t total = train_app::plan_memory(c).worst().total();
    if (total > m.core.hbm_bytes) {
      progress(budget, l, c, str("needs ", train_app::format_bytes(total), " (does not fit)"));
      t.least = std::min(t.least, total);
      if (t.over++ == 0)
        t.cheapest = str(choice_name(c), ", needs ", train_app::format_bytes(total));
      continue;
    }
    t.p = predict(c, m, "");
    t.fits = true;
    progress(budget, l, c, str("fits, ", static_cast<int64_t>(t.p.tokens_s), " tokens/s"));
    break;
  }
  return t;
}

// Why t won: what its layout's cheaper choices needed, why its CP and EP.
std::string why(const Tried& t, const std::vector<Tried>& all,
                const std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t>& least_at_cp) {
  std::vector<std::string> w;
  if (t.over > 0)
    w.push_back(str(t.over, " cheaper choice(s) over HBM (the cheapest, ", t.cheapest, ")"));
  if (t.l.cp > 1)
    w.push_back(str("CP ", t.l.cp / 2, " does not fit TP ", t.l.tp, " x PP ", t.l.pp,
                    " at any micro batch (at least ",
                    train_app::format_bytes(least_at_cp.at({t.l.tp, t.l.pp, t.l.cp / 2})), ")"));
  if (t.l.ep > 1) {
    const auto one = std::find_if(all.begin(), all.end(), [&](const Tried& o) {
      return o.l.ep == 1 && o.l.key() == t.l.key();
    });
    if (one == all.end())
      w.push_back("EP 1 is not a layout of this model");
    else if (!one->fits)
      w.push_back(str("EP 1 does not fit (at least ", train_app::format_bytes(one->least), ")"));
    else
      w.push_back(str("EP 1 ", one->p.tokens_s < t.p.tokens_s ? "is slower" : "is faster", ": ",
                      static_cast<int64_t>(one->p.tokens_s), " tokens/s"));
  }
  if (w.empty()) w.push_back("the cheapest choice of its layout fits");
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : "; ") + x;
  return s;
}

}  // namespace

int search(const Args& a, const sim::MachineSpec& m) {
  const TrainConfig base = train_app::resolve(make_config(a, m));
  const int64_t W = m.world_size(), E = base.model.moe.num_experts;
  std::vector<Tried> all;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> least_at_cp;  // (tp, pp, cp)
  Budget budget{.max_plans = a.max_plans};
  for (int64_t tp = 1; tp <= std::min<int64_t>(W, 32); tp *= 2)
    for (int64_t pp = 1; tp * pp <= W && pp <= base.model.num_layers; pp *= 2) {
      if (W % (tp * pp) != 0) continue;
      int64_t prev_least = kNone;
      bool resident_over = false;  // at every CP alike: larger CPs are not tried
      for (int64_t cp = 1; (W / (tp * pp)) % cp == 0 && !resident_over; cp *= 2) {
        const int64_t dp = W / (tp * pp * cp);
        bool fits = false;
        int64_t least = kNone;
        bool all_resident_over = true;  // over every EP tried
        for (int64_t ep = 1; ep <= std::max<int64_t>(E, 1) && (dp * cp) % ep == 0; ep *= 2) {
          if (ep > 1 && E % ep != 0) break;
          bool over_here = false;
          for (int64_t mb = base.data.micro_batch_size; mb >= 1 && !over_here; mb /= 2) {
            const Layout l{tp, pp, cp, ep, mb};
            const std::vector<TrainConfig> cs = choices(a, m, l);
            if (cs.empty()) continue;
            all.push_back(try_layout(cs, l, m, budget, over_here));
            fits = fits || all.back().fits;
            least = std::min(least, all.back().least);
          }
          all_resident_over = all_resident_over && over_here;
        }
        resident_over = all_resident_over;
        least_at_cp[{tp, pp, cp}] = least;
        // CP only while nothing fits and a larger CP still lowers the memory needed
        if (fits || least == kNone || least >= prev_least) break;
        prev_least = least;
      }
    }
  const int planned = budget.planned;
  std::vector<const Tried*> fit;
  for (const Tried& t : all)
    if (t.fits) fit.push_back(&t);
  std::stable_sort(fit.begin(), fit.end(),
                   [](const Tried* x, const Tried* y) { return x->p.tokens_s > y->p.tokens_s; });
  std::printf(
      "nxd-plan --search: %zu TP x PP x DP x CP%s x micro batch layouts of %s on %s (%d choices "
      "of ZeRO-1 and checkpointing planned, %d skipped by memory unplanned), %zu fit; the "
      "fastest:\n",
      all.size(), E > 0 ? " x EP" : "", a.model.empty() ? "the model" : a.model.c_str(),
      m.name.c_str(), planned, budget.skipped, fit.size());
  if (fit.empty()) {  // what the closest layout needed
    const Tried* best = nullptr;
    for (const Tried& t : all)
      if (t.least != kNone && (!best || t.least < best->least)) best = &t;
    if (best)
      std::printf(
          "none fits: the least any layout needs is %s (TP %lld x PP %lld x CP %lld, EP "
          "%lld, micro batch %lld: %s) of %s HBM per core\n",
          train_app::format_bytes(best->least).c_str(), static_cast<long long>(best->l.tp),
          static_cast<long long>(best->l.pp), static_cast<long long>(best->l.cp),
          static_cast<long long>(best->l.ep), static_cast<long long>(best->l.mb),
          best->cheapest.c_str(), train_app::format_bytes(m.core.hbm_bytes).c_str());
  }
  if (budget.exhausted)
    std::printf(
        "nxd-plan --search: stopped after %d plans (--max-plans): layouts after them were "
        "not tried\n",
        budget.max_plans);
  for (size_t i = 0; i < fit.size() && i < 10; ++i) {
    const Prediction& p = fit[i]->p;
    std::printf(
        "%2zu. %s: %.3f seq/s, %.0f tokens/s, MFU %.3f, step %.4f s, memory %.2f GiB; why: %s\n",
        i + 1, layout(p.cfg).c_str(), p.seq_s, p.tokens_s, p.mfu, p.step,
        static_cast<double>(p.plan.worst().total()) / (1024.0 * 1024 * 1024),
        why(*fit[i], all, least_at_cp).c_str());
  }
  if (fit.size() > 1) {  // the winner against the runner-up, by the parts of their steps
    const train_app::RankMemory &x = *fit[0]->p.slowest, &y = *fit[1]->p.slowest;
    std::printf(
        "1 over 2: step %.4f s against %.4f s: compute %.4f / %.4f s, exposed communication "
        "%.4f / %.4f s, pipeline bubble %.4f / %.4f s\n",
        x.step_seconds, y.step_seconds, x.compute_seconds, y.compute_seconds,
        x.exposed_comm_seconds(), y.exposed_comm_seconds(), x.bubble_seconds, y.bubble_seconds);
  }
  return fit.empty() ? 3 : 0;
}

}  // namespace nxd::plan_tool
