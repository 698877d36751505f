// Speculative decoding in the engine (docs/design/inference.md): per step each speculative decode
// row gets `spec` draft tokens (the draft model runs over the batch one position at a time), the
// model verifies all of them in one call through the paged cache, the acceptance rule keeps the
// longest acceptable prefix plus one token of the model's, and the rejected positions roll back
// without a copy (the computed count and the block table shrink).
#include <algorithm>

#include "nxd/inference/engine_impl.h"
#include "nxd/layers/models/speculative.h"

namespace nxd::inference {

namespace {

std::vector<double> row_of(const std::vector<double>& all, int64_t row, int64_t vocab) {
  return std::vector<double>(all.begin() + row * vocab, all.begin() + (row + 1) * vocab);
}

}  // namespace

int64_t Engine::Impl::speculation(const Seq& s, int64_t budget) const {
  if (!draft || s.generated == 0 || static_cast<int64_t>(s.tokens.size()) - s.computed != 1)
    return 0;
  // every token emitted stays within max_tokens and max_model_len; the call within the budget
  const int64_t k = std::min({opts.speculate_k, s.req.stop.max_tokens - s.generated - 1,
                              max_len - static_cast<int64_t>(s.tokens.size()) - 1, budget - 1});
  return std::max<int64_t>(0, k);
}

void Engine::Impl::draft_catch_up(const std::vector<Scheduled>& rows) {
  std::vector<CallRow> cr;
  for (const auto& r : rows) {
    Seq& s = *r.seq;
    if (s.draft_computed < s.computed)
      cr.push_back({&s, s.draft_computed,
                    std::vector<int64_t>(s.tokens.begin() + s.draft_computed,
                                         s.tokens.begin() + s.computed)});
    s.draft_computed = s.computed;
  }
  if (cr.empty()) return;
  run_call(PlanMessage::draft, make_call(cr));
}

void Engine::Impl::propose(const std::vector<Scheduled>& rows,
                           std::vector<std::vector<int64_t>>& prop,
                           std::vector<std::vector<TokenDistribution>>& q) {
  const auto B = static_cast<int64_t>(rows.size());
  const uint64_t draft_stream = stream_id("nxd.speculate.draft");
  // the first call catches the draft's cache up to the last token (1 or 2 positions), each call
  // proposes one token per row still short of its `spec`; proposal i of a request draws u
  // number (generated + i) of its seed's draft stream
  prop.assign(B, {});
  q.assign(B, {});
  std::vector<TokenCounts> counts;
  for (const auto& r : rows) counts.push_back(r.seq->counts);
  for (int64_t j = 0;; ++j) {
    std::vector<CallRow> cr;
    std::vector<int64_t> which;
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = *rows[b].seq;
      if (static_cast<int64_t>(prop[b].size()) >= rows[b].spec) continue;
      const auto last = static_cast<int64_t>(s.tokens.size()) - 1;
      if (j == 0)
        cr.push_back({&s, s.draft_computed,
                      std::vector<int64_t>(s.tokens.begin() + s.draft_computed, s.tokens.end())});
      else
        cr.push_back({&s, last + j, {prop[b].back()}});
      which.push_back(b);
    }
    if (cr.empty()) break;
    const std::vector<double> all = run_call(PlanMessage::draft, make_call(cr)).to_vector();
    for (size_t i = 0; i < which.size(); ++i) {
      const int64_t b = which[i];
      const Seq& s = *rows[b].seq;
      const SamplingParams& p = s.req.sampling;
      TokenDistribution qd = next_distribution(row_of(all, int64_t(i), vocab), p, counts[b]);
      const uint64_t g = uint64_t(s.generated) + prop[b].size();
      const int64_t d = qd.draw(RngStream{p.seed, draft_stream}.uniform_f64(g));
      prop[b].push_back(d);
      q[b].push_back(std::move(qd));
      counts[b].add_generated(d);
    }
  }
}

void Engine::Impl::run_speculative(const std::vector<Scheduled>& rows) {
  const auto B = static_cast<int64_t>(rows.size());
  const uint64_t accept_stream = stream_id("nxd.speculate.accept");
  // 1. the draft proposes
  std::vector<std::vector<int64_t>> prop;
  std::vector<std::vector<TokenDistribution>> q;
  propose(rows, prop, q);
  // 2. the model verifies [last, d_1 .. d_spec] of every row in one call
  std::vector<CallRow> cr;
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *rows[b].seq;
    std::vector<int64_t> ids{s.tokens.back()};
    ids.insert(ids.end(), prop[b].begin(), prop[b].end());
    cr.push_back({&s, s.computed, std::move(ids)});
    s.draft_computed = static_cast<int64_t>(s.tokens.size()) + rows[b].spec - 1;
  }
  const ModelCall c = make_call(cr);
  const std::vector<double> all = run_call(PlanMessage::verify, c).to_vector();
  // 3. per row, in order: accept d_i while the rule does, then one token of the model's; the stop
  // rules see each emitted token
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = *rows[b].seq;
    const SamplingParams& p = s.req.sampling;
    const int64_t k = rows[b].spec, base = s.computed;
    st.spec_proposed += k;
    bool done = false;
    for (int64_t i = 0; i <= k && !done; ++i) {
      const std::vector<double> logits = row_of(all, b * c.S + i, vocab);
      const TokenDistribution pd = next_distribution(logits, p, s.counts);
      const uint64_t g = uint64_t(s.generated);
      const double u = RngStream{p.seed, stream.stream}.uniform_f64(g);
      Sample smp;
      bool accepted = false;
      if (i == k)
        smp.id = pd.draw(u);
      else if (p.temperature == 0.0)  // greedy: the model's argmax, the draft's when they agree
        accepted = (smp.id = pd.ids[0]) == prop[b][i];
      else
        smp.id = speculative_accept(pd, q[b][i], prop[b][i],
                                    RngStream{p.seed, accept_stream}.uniform_f64(g), u, &accepted);
      add_logprobs(smp, logits, p.logprobs);
      st.spec_accepted += accepted;
      s.computed = base + i + 1;  // the token verified at position base + i is now in the cache
      done = accept(s, smp) || s.cancel || !accepted;
    }
    if (s.cancel) continue;  // finished: its blocks are back in the pool
    // roll back: positions past `computed` hold rejected K/V; blocks past the next position go
    s.draft_computed = std::min(s.draft_computed, s.computed);
    pool->truncate(s.table, static_cast<int64_t>(s.tokens.size()));
    settle(s);
  }
}

}  // namespace nxd::inference
