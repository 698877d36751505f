// One engine step: take new requests and cancels, schedule under the token budget (decode rows
// first, then chunked prefill of the running and the waiting), run the model through the paged
// cache, sample, apply the stop rules, report (docs/design/inference.md).
#include <algorithm>

#include "nxd/inference/engine_impl.h"
#include "nxd/runtime/gemv_f32.h"
#include "nxd/runtime/kernels/gemv_int4.h"
#include "nxd/runtime/kernels/gemv_int8.h"
#include "nxd/runtime/kernels/kv_cache.h"

namespace nxd::inference {

namespace {

// The one-token rows of one model call: as many as the few-rows kernels of the linear layers and
// the head take (f32, int8, int4), each of which gives a row the same bits for any row count up
// to it, so a request's decode logits do not depend on the rows beside it (docs/design/
// inference.md, "Batch invariance"). More rows run as further calls.
constexpr size_t kDecodeRowsPerCall = blas::detail::kSmallRows;
static_assert(kernels::kInt8GemvMaxRows >= blas::detail::kSmallRows &&
              kernels::kInt4GemvMaxRows >= blas::detail::kSmallRows);

// The prompt tokens one request may prefill in a step with `budget` tokens left.
int64_t prefill_cap(const EngineOptions& o, int64_t budget) {
  return o.chunked_prefill && o.long_prefill_token_threshold > 0
             ? std::min(budget, o.long_prefill_token_threshold)
             : budget;
}

}  // namespace

void Engine::Impl::take_incoming() {
  std::vector<int64_t> cancel_ids;
  {
    std::lock_guard<std::mutex> lock(mu);
    while (!incoming.empty()) {
      waiting.push_back(std::move(incoming.front()));
      incoming.pop_front();
    }
    cancel_ids.swap(cancels);
  }
  for (int64_t id : cancel_ids) {
    for (auto& s : waiting)
      if (s->id == id) s->cancel = true;
    for (auto& s : running)
      if (s->id == id) s->cancel = true;
  }
  for (auto& s : waiting)
    if (s->cancel) {
      Output o;
      finish(*s, o, FinishReason::cancelled);
    }
  for (auto& s : running)
    if (s->cancel) {
      Output o;
      finish(*s, o, FinishReason::cancelled);
    }
  drop_finished();
}

void Engine::Impl::preempt(std::unique_ptr<Seq> victim) {
  pool->release(victim->table);
  victim->computed = 0;
  victim->draft_computed = 0;
  victim->registered = 0;
  ++st.preemptions;
  waiting.push_front(std::move(victim));
}

bool Engine::Impl::admit(std::vector<Scheduled>& plan, int64_t& budget) {
  Seq& s = *waiting.front();
  const int64_t total = static_cast<int64_t>(s.tokens.size());
  std::vector<int64_t> hits = pool->lookup(s.tokens);
  const int64_t from = static_cast<int64_t>(hits.size()) * pool->block_size();
  const int64_t rest = total - from;
  // without chunked prefill a prompt is prefilled whole (submit checked it fits the budget); a
  // preempted request's recompute (prompt + generated) may not, and is chunked then
  const bool whole = !opts.chunked_prefill && rest <= opts.max_num_batched_tokens;
  const int64_t n = whole ? rest : std::min(rest, prefill_cap(opts, budget));
  if (n > budget || !pool->can_grow(s.table, hits, from + n)) return false;
  pool->take(s.table, hits);
  const bool ok = pool->grow(s.table, from + n);
  NXD_INTERNAL_CHECK(ok, "blocks checked by can_grow");
  s.computed = s.draft_computed = from;
  s.registered = static_cast<int64_t>(hits.size());
  if (opts.prefix_caching) {
    st.prefix_query_tokens += total;
    st.prefix_hit_tokens += from;
  }
  if (s.cached_prompt_tokens < 0) {
    s.cached_prompt_tokens = std::min(from, s.prompt_len);
    st.prompt_tokens += s.prompt_len;
  }
  budget -= n;
  running.push_back(std::move(waiting.front()));
  waiting.pop_front();
  plan.push_back({running.back().get(), n});
  return true;
}

std::vector<Scheduled> Engine::Impl::schedule() {
  std::vector<Scheduled> plan;
  int64_t budget = opts.max_num_batched_tokens;
  bool preempted = false;
  // the running, in admission order: a decode row (1 token) or the next prefill chunk; when the
  // pool is out of blocks the last admitted request is preempted (recomputed later)
  for (size_t i = 0; i < running.size() && budget > 0; ++i) {
    Seq& s = *running[i];
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.computed,
                                        prefill_cap(opts, budget));
    // a decode row with a draft model: 1 + the draft's tokens, when the blocks are there
    if (const int64_t k = speculation(s, budget);
        k > 0 && pool->grow(s.table, s.computed + 1 + k)) {
      plan.push_back({&s, 1 + k, k});
      budget -= 1 + k;
      continue;
    }
    while (!pool->grow(s.table, s.computed + n)) {
      preempted = true;
      std::unique_ptr<Seq> victim = std::move(running.back());
      running.pop_back();
      const bool self = victim.get() == &s;
      preempt(std::move(victim));
      if (self) break;
    }
    if (i >= running.size()) break;  // s itself was preempted
    plan.push_back({&s, n});
    budget -= n;
  }
  // then the waiting, first come first served, while the budget, max_num_seqs and the pool allow
  while (!preempted && budget > 0 && !waiting.empty() &&
         static_cast<int64_t>(running.size()) < opts.max_num_seqs)
    if (!admit(plan, budget)) break;
  return plan;
}

Tensor call_model(CausalLM& m, KVCache& cache, const ModelCall& c, bool all) {
  CacheStep step;
  step.seq_ids = zeros({c.B}, DType::i64);
  step.start = from_vector<int64_t>(c.start, {c.B});
  step.lengths = from_vector<int64_t>(c.lengths, {c.B});
  step.block_tables = from_vector<int64_t>(c.tables, {c.B, c.MB});
  const Tensor ids = from_vector<int64_t>(c.ids, {c.B, c.S});
  return all ? m.forward_cached_all(ids, step, cache) : m.forward_cached(ids, step, cache);
}

ModelCall make_call(const std::vector<CallRow>& rows) {
  ModelCall c;
  c.B = static_cast<int64_t>(rows.size());
  for (const auto& r : rows) {
    c.S = std::max<int64_t>(c.S, static_cast<int64_t>(r.ids.size()));
    c.MB = std::max<int64_t>(c.MB, static_cast<int64_t>(r.seq->table.size()));
  }
  c.ids.assign(c.B * c.S, 0);
  c.tables.assign(c.B * c.MB, -1);
  for (int64_t b = 0; b < c.B; ++b) {
    const CallRow& r = rows[b];
    std::copy(r.ids.begin(), r.ids.end(), c.ids.begin() + b * c.S);
    std::copy(r.seq->table.begin(), r.seq->table.end(), c.tables.begin() + b * c.MB);
    c.start.push_back(r.start);
    c.lengths.push_back(static_cast<int64_t>(r.ids.size()));
  }
  return c;
}

Tensor Engine::Impl::run_call(PlanMessage kind, const ModelCall& c) {
  const bool of_draft = kind == PlanMessage::draft;
  if (tp && tp_rank == 0 && (!of_draft || draft_sharded)) send_plan(*tp, kind, &c);
  ++st.model_calls;
  if (of_draft) {
    NXD_CHECK(draft != nullptr, "[Engine] a draft call on TP rank ", tp_rank,
              ", which runs no draft (the draft is at TP 1: rank 0 alone runs it)");
    return call_model(*draft, draft_cache, c);
  }
  return call_model(*model, cache, c, /*all=*/kind == PlanMessage::verify);
}

bool Engine::Impl::follow() {
  ModelCall c;
  const PlanMessage m = receive_plan(*tp, c);
  if (carries_call(m)) run_call(m, c);
  return m != PlanMessage::end;
}

void Engine::Impl::run_rows(const std::vector<Scheduled>& rows) {
  std::vector<CallRow> cr;
  for (const auto& r : rows) {
    const Seq& s = *r.seq;
    cr.push_back(
        {&s, s.computed,
         std::vector<int64_t>(s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + r.n)});
  }
  const ModelCall c = make_call(cr);
  const std::vector<double> all = run_call(PlanMessage::call, c).to_vector();
  for (const auto& r : rows) r.seq->computed += r.n;
  if (draft) draft_catch_up(rows);  // the draft's cache holds the same positions
  for (int64_t b = 0; b < c.B; ++b) {
    Seq& s = *rows[b].seq;
    settle(s);
    if (s.computed == static_cast<int64_t>(s.tokens.size()))
      advance(s, std::vector<double>(all.begin() + b * vocab, all.begin() + (b + 1) * vocab));
  }
}

void Engine::Impl::settle(Seq& s) {
  // a block is registered once both caches hold it (another request's prefix hit reads both)
  const int64_t valid = draft ? std::min(s.computed, s.draft_computed) : s.computed;
  s.registered = pool->register_full(s.table, s.tokens, valid, s.registered);
  // the next queries (the model's at position computed, the draft's at draft_computed, one
  // earlier after a round that accepted every proposal) and later ones read no earlier block
  if (window > 0)
    st.kv_blocks_rolled +=
        pool->release_before(s.table, kernels::first_key_needed(valid, window), s.registered);
}

void Engine::Impl::execute(const std::vector<Scheduled>& plan) {
  // the one-token rows (decode, and prefill chunks of one token) run as [n, 1] batches; longer
  // prefill chunks, longest first, each in a call of its own (PrefillCalls::per_request, the
  // default: a request's bits as alone) or, with PrefillCalls::batched, as padded [k, S] batches
  // of chunks whose padding stays within a quarter of their tokens (each weight read once per
  // batch, not per chunk)
  std::vector<Scheduled> singles, chunks, speculative;
  for (const auto& r : plan) (r.spec > 0 ? speculative : r.n == 1 ? singles : chunks).push_back(r);
  if (!speculative.empty()) run_speculative(speculative);
  // at most kDecodeRowsPerCall a call: every row then takes the few-rows kernels, bitwise as alone
  for (size_t i = 0; i < singles.size(); i += kDecodeRowsPerCall)
    run_rows(std::vector<Scheduled>(
        singles.begin() + i, singles.begin() + std::min(singles.size(), i + kDecodeRowsPerCall)));
  std::stable_sort(chunks.begin(), chunks.end(),
                   [](const Scheduled& a, const Scheduled& b) { return a.n > b.n; });
  for (size_t i = 0; i < chunks.size();) {
    size_t j = i + 1;
    int64_t tokens = chunks[i].n;
    while (j < chunks.size() && opts.prefill_calls == PrefillCalls::batched &&
           4 * int64_t(j + 1 - i) * chunks[i].n <= 5 * (tokens + chunks[j].n))
      tokens += chunks[j++].n;
    run_rows(std::vector<Scheduled>(chunks.begin() + i, chunks.begin() + j));
    i = j;
  }
}

void Engine::Impl::advance(Seq& s, const std::vector<double>& logits) {
  const SamplingParams& p = s.req.sampling;
  const RngStream rs{p.seed, stream.stream};
  accept(s, sample_next(logits, p, s.counts, rs.uniform_f64(uint64_t(s.generated))));
}

bool Engine::Impl::accept(Seq& s, const Sample& smp) {
  s.tokens.push_back(smp.id);
  s.counts.add_generated(smp.id);
  ++s.generated;
  ++st.generated_tokens;
  if (s.generated == 1)
    s.ttft_s = std::chrono::duration<double>(Clock::now() - s.submitted).count();
  Output o;
  o.request_id = s.id;
  o.ids = {smp.id};
  if (s.req.sampling.logprobs >= 0) {
    o.chosen = {smp.chosen};
    o.top = {smp.top};
  }
  const auto& eos = opts.eos_token_ids;
  const auto& stops = s.req.stop.stop_token_ids;
  FinishReason why = FinishReason::none;
  if (!s.req.stop.ignore_eos && std::find(eos.begin(), eos.end(), smp.id) != eos.end())
    why = FinishReason::eos;
  else if (std::find(stops.begin(), stops.end(), smp.id) != stops.end())
    why = FinishReason::stop_token;
  if (why == FinishReason::none) {
    o.text = s.text->push({smp.id});
    if (s.text->stopped())
      why = FinishReason::stop_string;
    else if (s.generated >= s.req.stop.max_tokens)
      why = FinishReason::length;
    else if (static_cast<int64_t>(s.tokens.size()) >= max_len)
      why = FinishReason::context_limit;
  }
  if (why != FinishReason::none)
    finish(s, o, why);
  else
    emit(s, o);
  return why != FinishReason::none;
}

void Engine::Impl::emit(Seq& s, const Output& o) {
  if (!s.cb) return;
  try {
    s.cb(o);
  } catch (...) {  // a callback must not stop the engine: the request is cancelled
    s.cb = nullptr;
    s.cancel = true;
  }
}

void Engine::Impl::finish(Seq& s, Output& o, FinishReason why, const std::string& error) {
  if (why != FinishReason::stop_string) o.text += s.text->flush();
  o.request_id = s.id;
  o.finish = why;
  o.error = error;
  o.prompt_tokens = s.prompt_len;
  o.completion_tokens = s.generated;
  o.cached_prompt_tokens = std::max<int64_t>(0, s.cached_prompt_tokens);
  o.ttft_s = s.ttft_s;
  pool->release(s.table);
  s.cancel = true;  // dropped from its list by drop_finished
  emit(s, o);
  s.cb = nullptr;
}

void Engine::Impl::drop_finished() {
  auto gone = [&](const std::unique_ptr<Seq>& s) {
    if (s->cancel) pool->release(s->table);  // a request whose callback threw
    return s->cancel;
  };
  waiting.erase(std::remove_if(waiting.begin(), waiting.end(), gone), waiting.end());
  running.erase(std::remove_if(running.begin(), running.end(), gone), running.end());
}

void Engine::Impl::publish() {
  st.waiting = static_cast<int64_t>(waiting.size());
  st.running = static_cast<int64_t>(running.size());
  st.kv_blocks_used = pool->used_blocks();
  std::lock_guard<std::mutex> lock(mu);
  waiting_count = st.waiting + static_cast<int64_t>(incoming.size());
  shown = st;
  shown.waiting = waiting_count;
}

bool Engine::Impl::step() {
  if (tp_rank != 0) return follow();
  take_incoming();
  if (waiting.empty() && running.empty()) {
    publish();
    return false;
  }
  std::vector<Scheduled> plan = schedule();
  NXD_INTERNAL_CHECK(!plan.empty(), "a step with ", waiting.size(), " waiting and ", running.size(),
                     " running requests scheduled nothing");
  try {
    execute(plan);
  } catch (const std::exception& e) {  // the step's requests fail; the engine goes on
    for (const auto& r : plan) {
      Output o;
      if (!r.seq->cancel) finish(*r.seq, o, FinishReason::error, e.what());
    }
  }
  drop_finished();
  ++st.steps;
  publish();
  return true;
}

}  // namespace nxd::inference
