// Speculative decoding with a draft model (speculative.h).
#include "nxd/layers/models/speculative.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "nxd/runtime/rng.h"

namespace nxd {

int64_t speculative_accept(const TokenDistribution& p, const TokenDistribution& q, int64_t d,
                           double u_accept, double u_residual, bool* accepted) {
  const double pd = p.prob(d), qd = q.prob(d);
  NXD_CHECK(qd > 0, "[speculative_accept] the proposed token ", d,
            " has probability 0 under the draft's distribution");
  if (u_accept * qd < pd) {  // u < p(d) / q(d), without dividing
    *accepted = true;
    return d;
  }
  *accepted = false;
  // max(0, p - q) over the ids either keeps, in increasing id order
  std::map<int64_t, double> r;
  for (size_t j = 0; j < p.ids.size(); ++j) r[p.ids[j]] += p.w[j] / p.z;
  for (size_t j = 0; j < q.ids.size(); ++j) r[q.ids[j]] -= q.w[j] / q.z;
  double z = 0;
  for (auto& [id, v] : r) z += v = std::max(0.0, v);
  if (!(z > 0)) return p.draw(u_residual);  // p == q up to rounding: rejection had probability 0
  double target = u_residual * z, c = 0;
  int64_t last = -1;
  for (const auto& [id, v] : r) {
    if (v <= 0) continue;
    c += v;
    last = id;
    if (target < c) return id;
  }
  return last;
}

namespace {

struct EvalModes {  // eval mode for the call, the previous modes restored
  Module *a, *b;
  bool was_a, was_b;
  EvalModes(Module* x, Module* y) : a(x), b(y), was_a(x->is_training()), was_b(y->is_training()) {
    a->eval();
    b->eval();
  }
  ~EvalModes() {
    a->train(was_a);
    b->train(was_b);
  }
};

void check_pair(const CausalLM& target, const CausalLM& draft, const std::vector<int64_t>& prompt,
                const GenerateOptions& o, const SpeculativeOptions& spec) {
  const ModelConfig &t = target.config(), &d = draft.config();
  NXD_CHECK(spec.k >= 1 && spec.k <= 64, "[speculative_generate] k must be in [1, 64], got ",
            spec.k);
  NXD_CHECK(t.vocab_size == d.vocab_size, "[speculative_generate] the draft's vocab_size ",
            d.vocab_size, " differs from the target's ", t.vocab_size,
            " (a draft model must share the target's tokenizer)");
  NXD_CHECK(target.is_whole() && draft.is_whole(),
            "[speculative_generate] needs whole models (not pipeline parts)");
  NXD_CHECK(target.tensor_parallel_size() == draft.tensor_parallel_size(),
            "[speculative_generate] the target runs at TP ", target.tensor_parallel_size(),
            ", the draft at TP ", draft.tensor_parallel_size(), ": build both on the same group");
  NXD_CHECK(!prompt.empty(), "[speculative_generate] empty prompt");
  NXD_CHECK(o.max_new_tokens >= 0, "[speculative_generate] max_new_tokens must be >= 0, got ",
            o.max_new_tokens);
  for (int64_t id : prompt)
    NXD_CHECK(id >= 0 && id < t.vocab_size, "[speculative_generate] prompt id ", id,
              " outside the vocabulary [0, ", t.vocab_size, ")");
}

// The running generation: the sequence, its stop reason, and the random streams.
struct Run {
  const GenerateOptions& o;
  int64_t max_pos;
  std::vector<int64_t> seq;
  int64_t generated = 0;
  std::string stop;
  RngStream draft_u, accept_u, target_u;

  Run(const GenerateOptions& opts, int64_t mp, const std::vector<int64_t>& prompt)
      : o(opts),
        max_pos(mp),
        seq(prompt),
        draft_u{opts.seed, stream_id("nxd.speculate.draft")},
        accept_u{opts.seed, stream_id("nxd.speculate.accept")},
        target_u{opts.seed, stream_id("nxd.generate")} {
    if (o.max_new_tokens == 0)
      stop = "max_new_tokens";
    else if (static_cast<int64_t>(seq.size()) >= max_pos)
      stop = "max_position_embeddings";
  }
  TokenDistribution dist(const double* logits, int64_t V) const {
    return token_distribution(std::vector<double>(logits, logits + V), o.temperature, o.top_k,
                              o.top_p);
  }
  double u(const RngStream& s, int64_t ahead = 0) const {
    return s.uniform_f64(static_cast<uint64_t>(generated + ahead));
  }
  void emit(int64_t id) {  // as advance_generation_row
    seq.push_back(id);
    ++generated;
    if (id == o.eos_token_id)
      stop = "eos";
    else if (generated >= o.max_new_tokens)
      stop = "max_new_tokens";
    else if (static_cast<int64_t>(seq.size()) >= max_pos)
      stop = "max_position_embeddings";
  }
  int64_t len() const { return static_cast<int64_t>(seq.size()); }
};

Tensor one_row(const std::vector<int64_t>& ids) {
  return from_vector<int64_t>(ids, {1, static_cast<int64_t>(ids.size())});
}

}  // namespace

SpeculativeResult speculative_generate(CausalLM& target, CausalLM& draft,
                                       const std::vector<int64_t>& prompt,
                                       const GenerateOptions& opts,
                                       const SpeculativeOptions& spec) {
  check_pair(target, draft, prompt, opts, spec);
  const auto t0 = std::chrono::steady_clock::now();
  NoGradGuard ng;
  EvalModes modes(&target, &draft);
  const int64_t V = target.config().vocab_size;
  const int64_t max_pos =
      std::min(target.config().max_position_embeddings, draft.config().max_position_embeddings);
  Run run(opts, max_pos, prompt);
  SpeculativeResult res;
  if (run.stop.empty()) {
    const int64_t P = run.len();
    const int64_t L = std::min(max_pos, P + opts.max_new_tokens + spec.k + 1);
    KVCache tc = target.make_kv_cache(1, L), dc = draft.make_kv_cache(1, L);
    // the target's prefill gives the first token
    std::vector<double> logits =
        target.forward_cached(one_row(prompt), make_cache_step({0}, {0}, {P}), tc).to_vector();
    run.emit(run.dist(logits.data(), V).draw(run.u(run.target_u)));
    int64_t dlen = 0;  // the draft cache's valid prefix (positions [0, dlen) match run.seq)
    while (run.stop.empty()) {
      // k shrinks near max_new_tokens (the round emits up to k + 1) and max_pos
      const int64_t k = std::max<int64_t>(
          0, std::min({spec.k, opts.max_new_tokens - run.generated - 1, max_pos - run.len()}));
      const int64_t n0 = run.len();
      std::vector<int64_t> proposal;
      std::vector<TokenDistribution> q;
      for (int64_t i = 0; i < k; ++i) {  // the draft proposes one token at a time
        std::vector<int64_t> feed =
            i == 0 ? std::vector<int64_t>(run.seq.begin() + dlen, run.seq.end())
                   : std::vector<int64_t>{proposal.back()};
        const int64_t start = i == 0 ? dlen : n0 + i - 1;
        const int64_t m = static_cast<int64_t>(feed.size());
        logits =
            draft.forward_cached(one_row(feed), make_cache_step({0}, {start}, {m}), dc).to_vector();
        ++res.draft_steps;
        q.push_back(run.dist(logits.data(), V));
        proposal.push_back(q.back().draw(run.u(run.draft_u, i)));
      }
      // the target scores the last token and the proposal in one step: row i predicts n0 + i
      std::vector<int64_t> feed{run.seq.back()};
      feed.insert(feed.end(), proposal.begin(), proposal.end());
      const int64_t m = static_cast<int64_t>(feed.size());
      logits = target.forward_cached_all(one_row(feed), make_cache_step({0}, {n0 - 1}, {m}), tc)
                   .to_vector();
      ++res.rounds;
      res.proposed += k;
      int64_t taken = 0;
      bool all = true;
      for (int64_t i = 0; i < k && run.stop.empty(); ++i) {
        const TokenDistribution p = run.dist(logits.data() + i * V, V);
        bool ok = false;
        const int64_t id =
            speculative_accept(p, q[i], proposal[i], run.u(run.accept_u), run.u(run.target_u), &ok);
        run.emit(id);
        if (!ok) {
          all = false;
          break;
        }
        ++taken;
      }
      res.accepted += taken;
      if (all && run.stop.empty())  // every proposal kept: the target's own next token
        run.emit(run.dist(logits.data() + k * V, V).draw(run.u(run.target_u)));
      if (k > 0) dlen = std::min(n0 + k - 1, n0 + taken);
    }
  }
  res.sequence = std::move(run.seq);
  res.stop = run.stop;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace nxd
