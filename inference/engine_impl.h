#pragma once
// The engine's internal state (engine.cpp: requests, validation; scheduler.cpp: the step).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "nxd/inference/engine.h"
#include "nxd/inference/kv_blocks.h"
#include "nxd/inference/sampling.h"
#include "nxd/inference/text_stream.h"
#include "nxd/inference/tp_plan.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/rng.h"

namespace nxd::inference {

using Clock = std::chrono::steady_clock;

// One request in the engine.
struct Seq {
  int64_t id = 0;
  Request req;
  OutputCallback cb;
  std::vector<int64_t> tokens;  // prompt + generated
  int64_t prompt_len = 0;
  int64_t generated = 0;
  int64_t computed = 0;        // positions whose K/V are in the cache
  int64_t draft_computed = 0;  // ... in the draft model's cache (speculative decoding)
  int64_t registered = 0;      // full blocks registered in the prefix cache
  std::vector<int64_t> table;  // block table
  TokenCounts counts;
  std::unique_ptr<TextStream> text;
  int64_t cached_prompt_tokens = -1;  // prefix hits at the first admission (-1: not yet)
  Clock::time_point submitted;
  double ttft_s = 0;
  bool cancel = false;
};

// What one step runs for a request: `n` tokens from position seq->computed.
struct Scheduled {
  Seq* seq;
  int64_t n;
  int64_t spec = 0;  // > 0: a speculative decode row, the draft proposes `spec` tokens
};

// One row of a model call: `ids` from position `start`, over seq's block table.
struct CallRow {
  const Seq* seq;
  int64_t start;
  std::vector<int64_t> ids;
};
ModelCall make_call(const std::vector<CallRow>& rows);
// The model over `c` through `cache`: the last position's logits [B, V], or every one's
// [B, S, V] with `all`.
Tensor call_model(CausalLM& m, KVCache& cache, const ModelCall& c, bool all = false);

struct Engine::Impl {
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<const io::Tokenizer> tokenizer;
  EngineOptions opts;
  int64_t max_len = 0, vocab = 0;
  // The sliding window the cache rolls at (0: it does not): the model's, with a draft the larger
  // of both windows (0 when either has none, since that model reads every position)
  int64_t window = 0;
  KVCache cache;
  // Speculative decoding: the draft on the ranks that run it (rank 0; every rank when it is
  // sharded at the model's TP); its cache shares the block tables
  std::shared_ptr<CausalLM> draft;
  bool draft_sharded = false;  // the draft at the model's TP > 1: its calls are broadcast too
  KVCache draft_cache;
  std::unique_ptr<BlockPool> pool;
  RngStream stream;
  std::shared_ptr<Communicator> tp;  // TP > 1: the group rank 0 broadcasts each model call to
  int tp_rank = 0;

  // shared with submit/cancel/stats (under mu)
  mutable std::mutex mu;
  std::condition_variable_any wake;
  std::deque<std::unique_ptr<Seq>> incoming;
  std::vector<int64_t> cancels;
  int64_t next_id = 1;
  int64_t waiting_count = 0;  // incoming + waiting
  EngineStats shown;

  // the engine thread's
  std::deque<std::unique_ptr<Seq>> waiting;
  std::vector<std::unique_ptr<Seq>> running;  // in admission order
  EngineStats st;

  void validate(const Request& r) const;
  void check_rank0(const char* what) const;
  bool step();
  void take_incoming();
  std::vector<Scheduled> schedule();
  bool admit(std::vector<Scheduled>& plan, int64_t& budget);
  void preempt(std::unique_ptr<Seq> victim);
  void execute(const std::vector<Scheduled>& plan);
  void run_rows(const std::vector<Scheduled>& rows);
  // One call on this rank's shard and cache: the model (call: the last position's logits, verify:
  // every position's) or the draft; rank 0 broadcasts it first when the callee is sharded
  Tensor run_call(PlanMessage kind, const ModelCall& c);
  bool follow();  // a follower's step: false at the end message
  void advance(Seq& s, const std::vector<double>& logits);
  bool accept(Seq& s, const Sample& smp);  // appends one token, stop rules; true: finished
  int64_t speculation(const Seq& s, int64_t budget) const;   // draft tokens for a decode row
  void run_speculative(const std::vector<Scheduled>& rows);  // speculate.cpp
  // the draft's tokens per row and the distributions they were drawn from
  void propose(const std::vector<Scheduled>& rows, std::vector<std::vector<int64_t>>& prop,
               std::vector<std::vector<TokenDistribution>>& q);
  void draft_catch_up(const std::vector<Scheduled>& rows);  // the draft over computed positions
  void settle(Seq& s);  // after a call: registers full blocks, rolls a sliding window
  void finish(Seq& s, Output& o, FinishReason why, const std::string& error = {});
  void emit(Seq& s, const Output& o);
  void drop_finished();
  void publish();
};

}  // namespace nxd::inference
