// The generation loop shared by the eager and the traced decoder (decode_loop.h).
#include "nxd/layers/models/decode_loop.h"

#include <algorithm>
#include <chrono>

#include "nxd/runtime/rng.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd {

namespace decode_detail {

double wall() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double modeled() {
  const sim::SimClock* c = sim::current_sim_clock();
  return c ? c->now() : 0.0;
}

GenerateResult finish(std::vector<GenerationRow>& rows, GenerateResult r) {
  for (auto& row : rows) {
    r.sequences.push_back(std::move(row.seq));
    r.stop_reasons.push_back(row.stop);
  }
  return r;
}

}  // namespace decode_detail

namespace {
std::vector<double> row_of(const std::vector<double>& all, int64_t row, int64_t V) {
  return std::vector<double>(all.begin() + row * V, all.begin() + (row + 1) * V);
}
}  // namespace

using decode_detail::finish;
using decode_detail::modeled;
using decode_detail::wall;

GenerateResult decode_loop(const std::vector<std::vector<int64_t>>& prompts,
                           const GenerateOptions& opts, const DecodeLoopOptions& lo,
                           const CachedStepFn& step) {
  const int64_t B = static_cast<int64_t>(prompts.size()), max_pos = lo.max_pos;
  const int64_t R = std::max(B, lo.prefill_rows);
  const RngStream stream{opts.seed, stream_id("nxd.generate")};
  std::vector<GenerationRow> rows(B);
  int64_t S = 0;
  GenerateResult res;
  for (int64_t b = 0; b < B; ++b) {
    rows[b].seq = prompts[b];
    const int64_t P = static_cast<int64_t>(prompts[b].size());
    S = std::max(S, P);
    res.prefill_tokens += P;
    if (opts.max_new_tokens == 0)
      rows[b].stop = "max_new_tokens";
    else if (P >= max_pos)
      rows[b].stop = "max_position_embeddings";
  }
  auto running = [](const GenerationRow& r) { return r.stop.empty(); };
  if (std::none_of(rows.begin(), rows.end(), running)) return finish(rows, res);
  // prefill: every prompt, right-padded to the longest
  std::vector<int64_t> ids(R * S, 0), seq_ids(R), start(R, 0), len(R);
  for (int64_t b = 0; b < R; ++b) {
    const auto& p = prompts[b < B ? b : 0];
    std::copy(p.begin(), p.end(), ids.begin() + b * S);
    seq_ids[b] = b;
    len[b] = static_cast<int64_t>(p.size());
  }
  double t0 = wall(), m0 = modeled();
  int64_t V = 0;
  std::vector<double> logits;
  {
    Tensor l = step(from_vector<int64_t>(ids, {R, S}), make_cache_step(seq_ids, start, len));
    V = l.size(1);
    logits = l.to_vector();
  }
  for (int64_t b = 0; b < B; ++b)
    if (running(rows[b]))
      advance_generation_row(rows[b], row_of(logits, b, V), opts, stream, max_pos);
  res.prefill_seconds = wall() - t0;
  res.modeled_prefill_seconds = modeled() - m0;
  t0 = wall(), m0 = modeled();
  // decode: the rows still running feed their last token at its position
  while (true) {
    std::vector<int64_t> active;
    for (int64_t b = 0; b < B; ++b)
      if (running(rows[b])) active.push_back(b);
    if (active.empty()) break;
    const int64_t n = static_cast<int64_t>(active.size());
    std::vector<int64_t> tok(n), sid(n), st(n), one(n, 1);
    for (int64_t i = 0; i < n; ++i) {
      const GenerationRow& r = rows[active[i]];
      tok[i] = r.seq.back();
      sid[i] = active[i];
      st[i] = static_cast<int64_t>(r.seq.size()) - 1;
    }
    logits = step(from_vector<int64_t>(tok, {n, 1}), make_cache_step(sid, st, one)).to_vector();
    ++res.decode_steps;
    res.decode_tokens += n;
    for (int64_t i = 0; i < n; ++i)
      advance_generation_row(rows[active[i]], row_of(logits, i, V), opts, stream, max_pos);
  }
  res.decode_seconds = wall() - t0;
  res.modeled_decode_seconds = modeled() - m0;
  return finish(rows, res);
}

}  // namespace nxd
