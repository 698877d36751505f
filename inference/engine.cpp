// The engine's public side: options, request validation, submit/cancel, the serving loop
// (scheduler.cpp runs a step).
#include <algorithm>
#include <cmath>

#include "nxd/collectives/parallel_state.h"
#include "nxd/inference/engine_impl.h"
#include "nxd/io/bounded_read.h"

namespace nxd::inference {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::none:
      return "none";
    case FinishReason::eos:
      return "eos";
    case FinishReason::stop_token:
      return "stop_token";
    case FinishReason::stop_string:
      return "stop_string";
    case FinishReason::length:
      return "length";
    case FinishReason::context_limit:
      return "context_limit";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::error:
      return "error";
  }
  return "?";
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::eos:
    case FinishReason::stop_token:
    case FinishReason::stop_string:
      return "stop";
    case FinishReason::length:
    case FinishReason::context_limit:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
    case FinishReason::error:
      return "error";
    case FinishReason::none:
      return "";
  }
  return "";
}

namespace {

// eos_token_id of one JSON file: an int, a list of ints, or absent/null (empty).
std::vector<int64_t> eos_of(const nlohmann::json& j, const std::string& file) {
  std::vector<int64_t> ids;
  if (!j.is_object() || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) return ids;
  const auto& v = j["eos_token_id"];
  auto one = [&](const nlohmann::json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw ConfigError(str("[read_eos_ids] ", file, ": eos_token_id must be a non-negative ",
                            "integer or a list of them, got ", x.dump().substr(0, 80)));
    ids.push_back(x.get<int64_t>());
  };
  if (v.is_array())
    for (const auto& x : v) one(x);
  else
    one(v);
  return ids;
}

}  // namespace

std::vector<int64_t> read_eos_ids(const std::filesystem::path& hf_dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    const auto p = hf_dir / name;
    if (!std::filesystem::is_regular_file(p)) continue;
    auto ids = eos_of(io::read_json_file(p.string(), name, "read_eos_ids"), p.string());
    if (!ids.empty()) return ids;
  }
  return {};
}

namespace {

int64_t block_bytes(const CausalLM& m, int64_t block_size) {
  const ModelConfig& c = m.config();
  return 2 * c.num_layers * m.cache_kv_heads() * block_size * c.head_dim() * dtype_size(c.dtype);
}

void check_options(const EngineOptions& o, const CausalLM& m) {
  auto bad = [](const char* field, int64_t v, const char* want) {
    throw InvalidArgument(str("[Engine] ", field, "=", v, " must be ", want));
  };
  if (o.max_num_seqs < 1) bad("max_num_seqs", o.max_num_seqs, ">= 1");
  if (o.max_num_batched_tokens < 1) bad("max_num_batched_tokens", o.max_num_batched_tokens, ">= 1");
  if (o.block_size < 1 || o.block_size > 4096) bad("block_size", o.block_size, "in [1, 4096]");
  if (o.kv_blocks < 0) bad("kv_blocks", o.kv_blocks, ">= 0 (0: from kv_memory_bytes)");
  if (o.kv_memory_bytes < 0) bad("kv_memory_bytes", o.kv_memory_bytes, ">= 0");
  if (o.max_waiting < 1) bad("max_waiting", o.max_waiting, ">= 1");
  if (o.long_prefill_token_threshold < 0)
    bad("long_prefill_token_threshold", o.long_prefill_token_threshold, ">= 0 (0: no limit)");
  const int64_t mp = m.config().max_position_embeddings;
  if (o.max_model_len < 0 || o.max_model_len > mp)
    throw InvalidArgument(str("[Engine] max_model_len=", o.max_model_len,
                              " must be in [0, max_position_embeddings=", mp, "] (0: that)"));
  for (int64_t id : o.eos_token_ids)
    if (id < 0 || id >= m.config().vocab_size)
      throw InvalidArgument(str("[Engine] eos_token_ids has ", id, ", outside the vocabulary [0, ",
                                m.config().vocab_size, ")"));
}

void check_model(const CausalLM& m) {
  NXD_CHECK(m.is_whole(), "[Engine] needs the whole model, not a pipeline part");
  NXD_CHECK(!m.sequence_parallel(), "[Engine] needs a model built without sequence parallelism");
  NXD_CHECK(m.context_parallel_size() == 1, "[Engine] needs context parallel size 1, got ",
            m.context_parallel_size());
  NXD_CHECK(m.decoder_stack() != nullptr, "[Engine] the model family ", m.type_name(),
            " has no KV-cache path (a built-in family is needed)");
  NXD_CHECK(m.config().device == Device::host, "[Engine] needs a model on the host");
}

// Speculative decoding's draft (opts.draft_model): InvalidArgument naming the mismatch.
void check_draft(const EngineOptions& o, const CausalLM& m, int64_t max_len) {
  const CausalLM& d = *o.draft_model;
  check_model(d);
  if (o.speculate_k < 1 || o.speculate_k > 64)
    throw InvalidArgument(str("[Engine] speculate_k=", o.speculate_k, " must be in [1, 64]"));
  if (d.config().vocab_size != m.config().vocab_size)
    throw InvalidArgument(str("[Engine] the draft model's vocab_size is ", d.config().vocab_size,
                              ", the model's ", m.config().vocab_size,
                              " (a draft must share the model's vocabulary)"));
  // a draft at TP 1 runs on rank 0 alone, one at the model's TP over the same group
  if (d.tensor_parallel_size() != 1 && d.tensor_parallel_size() != m.tensor_parallel_size())
    throw InvalidArgument(str("[Engine] the draft model runs at TP 1 or at the model's TP ",
                              m.tensor_parallel_size(), "; it is built at TP ",
                              d.tensor_parallel_size()));
  if (d.config().max_position_embeddings < max_len)
    throw InvalidArgument(str(
        "[Engine] the draft model's max_position_embeddings=", d.config().max_position_embeddings,
        " is below max_model_len=", max_len));
}

}  // namespace

Engine::Engine(std::shared_ptr<CausalLM> model, std::shared_ptr<const io::Tokenizer> tokenizer,
               EngineOptions opts)
    : impl_(std::make_unique<Impl>()) {
  NXD_CHECK(model != nullptr, "[Engine] model is null");
  check_model(*model);
  check_options(opts, *model);
  Impl& I = *impl_;
  I.model = std::move(model);
  I.tokenizer = std::move(tokenizer);
  I.opts = std::move(opts);
  I.max_len =
      I.opts.max_model_len > 0 ? I.opts.max_model_len : I.model->config().max_position_embeddings;
  I.vocab = I.model->config().vocab_size;
  I.window = I.model->config().sliding_window;
  if (I.opts.draft_model) {
    check_draft(I.opts, *I.model, I.max_len);
    // the cache rolls only past what both models' later queries read
    const int64_t dw = I.opts.draft_model->config().sliding_window;
    I.window = I.window > 0 && dw > 0 ? std::max(I.window, dw) : 0;
  }
  // a block holds K and V of the model and, with speculative decoding, of the draft
  const int64_t bytes =
      block_bytes(*I.model, I.opts.block_size) +
      (I.opts.draft_model ? block_bytes(*I.opts.draft_model, I.opts.block_size) : 0);
  int64_t blocks = I.opts.kv_blocks;
  if (blocks == 0 && I.opts.kv_memory_bytes > 0) blocks = I.opts.kv_memory_bytes / bytes;
  if (blocks == 0)  // every running request at the full length
    blocks = I.opts.max_num_seqs * ((I.max_len + I.opts.block_size - 1) / I.opts.block_size);
  NXD_CHECK(blocks >= 1, "[Engine] kv_memory_bytes=", I.opts.kv_memory_bytes,
            " holds no KV block of ", bytes, " bytes");
  if (I.model->tensor_parallel_size() > 1) {
    I.tp = parallel_state::get_tensor_model_parallel_group_ptr();
    NXD_CHECK(I.tp && I.tp->size() == I.model->tensor_parallel_size(), "[Engine] the model is ",
              "built at TP ", I.model->tensor_parallel_size(), " but the current TP group has ",
              I.tp ? I.tp->size() : 0, " ranks (build the Engine on the model's rank thread)");
    I.tp_rank = I.tp->rank();
  }
  I.model->eval();
  I.cache = I.model->make_paged_kv_cache(blocks, I.opts.block_size);
  if (I.opts.draft_model) {  // the same block ids index both caches
    I.draft_sharded = I.opts.draft_model->tensor_parallel_size() > 1;
    if (I.tp_rank == 0 || I.draft_sharded) {  // a draft at TP 1 runs on rank 0 alone
      I.draft = I.opts.draft_model;
      I.draft->eval();
      I.draft_cache = I.draft->make_paged_kv_cache(blocks, I.opts.block_size);
    }
  }
  I.pool = std::make_unique<BlockPool>(blocks, I.opts.block_size, I.opts.prefix_caching);
  I.stream = RngStream{0, stream_id("nxd.generate")};
  I.st.kv_blocks_total = blocks;
  I.shown = I.st;
}

Engine::~Engine() = default;

std::vector<int64_t> Engine::eos_ids() const {
  return impl_->opts.eos_token_ids;
}
int64_t Engine::max_model_len() const {
  return impl_->max_len;
}
const EngineOptions& Engine::options() const {
  return impl_->opts;
}

void Engine::Impl::validate(const Request& r) const {
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  if (P == 0) throw InvalidArgument("[Engine] prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab)
      throw InvalidArgument(str("[Engine] prompt[", i, "]=", r.prompt[i],
                                " is outside the vocabulary [0, ", vocab, ")"));
  if (P >= max_len)
    throw InvalidArgument(str("[Engine] prompt has ", P, " tokens; max_model_len=", max_len,
                              " leaves no room for a new token"));
  check_sampling(r.sampling, vocab);
  if (r.stop.max_tokens < 1)
    throw InvalidArgument(str("[Engine] stop.max_tokens=", r.stop.max_tokens, " must be >= 1"));
  for (const std::string& s : r.stop.stop)
    if (s.empty()) throw InvalidArgument("[Engine] stop has an empty string");
  if (!r.stop.stop.empty() && !tokenizer)
    throw InvalidArgument("[Engine] stop strings need a tokenizer; the engine has none");
  for (int64_t id : r.stop.stop_token_ids)
    if (id < 0 || id >= vocab)
      throw InvalidArgument(
          str("[Engine] stop_token_ids has ", id, ", outside the vocabulary [0, ", vocab, ")"));
  if (!opts.chunked_prefill && P > opts.max_num_batched_tokens)
    throw InvalidArgument(str("[Engine] prompt has ", P, " tokens, more than ",
                              "max_num_batched_tokens=", opts.max_num_batched_tokens,
                              " without chunked prefill"));
  // positions the cache must hold at most: all tokens but the last generated one
  const int64_t positions = std::min(P + std::min(r.stop.max_tokens, max_len), max_len) - 1;
  const int64_t need = pool->blocks_for(positions);
  if (need > pool->num_blocks())
    throw InvalidArgument(str("[Engine] the request needs ", need, " KV blocks of ",
                              pool->block_size(), " positions (prompt ", P, " + max_tokens ",
                              r.stop.max_tokens, ", capped at max_model_len ", max_len,
                              "), the cache has ", pool->num_blocks()));
}

void Engine::Impl::check_rank0(const char* what) const {
  NXD_CHECK(tp_rank == 0, "[Engine] ", what, " on TP rank ", tp_rank,
            ": requests go to rank 0 (the other ranks follow its steps)");
}

int64_t Engine::submit(Request r, OutputCallback cb) {
  Impl& I = *impl_;
  I.check_rank0("submit");
  I.validate(r);
  auto s = std::make_unique<Seq>();
  s->tokens = r.prompt;
  s->prompt_len = static_cast<int64_t>(r.prompt.size());
  for (int64_t id : r.prompt) s->counts.add_prompt(id);
  s->text = std::make_unique<TextStream>(I.tokenizer, r.stop.stop);
  s->req = std::move(r);
  s->cb = std::move(cb);
  s->submitted = Clock::now();
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(I.mu);
    if (I.waiting_count >= I.opts.max_waiting)
      throw QueueFull(str("[Engine] ", I.waiting_count,
                          " requests wait (max_waiting=", I.opts.max_waiting, ")"));
    id = s->id = I.next_id++;
    ++I.waiting_count;
    ++I.shown.waiting;
    I.incoming.push_back(std::move(s));
  }
  I.wake.notify_all();
  return id;
}

void Engine::cancel(int64_t request_id) {
  impl_->check_rank0("cancel");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancels.push_back(request_id);
  }
  impl_->wake.notify_all();
}

bool Engine::step() {
  return impl_->step();
}

void Engine::run_until_idle() {
  while (impl_->step()) {
  }
  if (impl_->tp && impl_->tp_rank == 0) send_plan(*impl_->tp, PlanMessage::end);
}

void Engine::run(std::stop_token st) {
  Impl& I = *impl_;
  if (I.tp_rank != 0) {  // a follower: until rank 0's run ends
    while (I.follow()) {
    }
    return;
  }
  while (!st.stop_requested()) {
    if (I.step()) continue;
    std::unique_lock<std::mutex> lock(I.mu);
    // TP: the followers wait in a broadcast, which has a deadline; an idle message every few
    // seconds keeps them within it
    const bool woke = I.wake.wait_for(lock, st, std::chrono::seconds(5),
                                      [&] { return !I.incoming.empty() || !I.cancels.empty(); });
    lock.unlock();
    if (!woke && I.tp && !st.stop_requested()) send_plan(*I.tp, PlanMessage::idle);
  }
  if (I.tp) send_plan(*I.tp, PlanMessage::end);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->shown;
}

}  // namespace nxd::inference
