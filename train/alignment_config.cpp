// The fine-tuning keys (NxD Training's SFT and DPO data keys) and their resolution.
#include "nxd/runtime/error.h"
#include "nxd/train/config.h"

namespace nxd::trainer {

using json = nlohmann::json;

namespace {

constexpr const char* kDpo = "data.alignment_strategy.dpo.";
const char* const kPackingKeys[] = {"data.alignment_strategy.sft.packing",
                                    "model_alignment_strategy.sft.packing", "data.packing"};

KeySpec spec(std::string k, KeyType t, std::string doc, std::vector<std::string> choices = {}) {
  return KeySpec{std::move(k), t, json(), std::move(doc), std::move(choices), true, 0};
}

template <class... A>
[[noreturn]] void fail(A&&... a) {
  throw ConfigError(str("[config] ", std::forward<A>(a)...));
}

}  // namespace

std::vector<KeySpec> alignment_keys() {
  using K = KeyType;
  const std::string packing_doc =
      "SFT: pack several examples into each row of data.seq_length tokens, each a document "
      "with its own positions that attends only to itself (false: one example per row, padded). "
      "NxD Training spells it three ways (data.alignment_strategy.sft.packing, "
      "model_alignment_strategy.sft.packing, data.packing); set any, they must agree. null = "
      "false.";
  return {
      spec("data.train_dir", K::string,
           "Fine-tuning data: a jsonl file, or a folder of *.jsonl files (sorted). SFT rows are "
           "{\"prompt\": ..., \"completion\": ...} (loss on the completion's tokens only); with "
           "any data.alignment_strategy.dpo key set, DPO rows {\"prompt\", \"chosen\", "
           "\"rejected\"}. Tokenized by data.tokenizer (null: UTF-8 bytes). data.kind and "
           "data.path are then not used. null = pre-training data (data.kind)."),
      spec("data.val_dir", K::string,
           "Validation rows in the format of data.train_dir. null = data.val_fraction of "
           "data.train_dir."),
      spec("data.dev_choose_samples", K::integer,
           "Use only this many rows from the start of data.train_dir (and of data.val_dir). null "
           "= every row."),
      spec(kPackingKeys[0], K::boolean, packing_doc),
      spec(kPackingKeys[1], K::boolean, "Alias of data.alignment_strategy.sft.packing."),
      spec(kPackingKeys[2], K::boolean, "Alias of data.alignment_strategy.sft.packing."),
      spec(
          str(kDpo, "kl_beta"), K::number,
          "DPO (any data.alignment_strategy.dpo key set turns it on): beta of the loss (loss_type) "
          "and of the logged rewards beta (log pi - log ref), log-probabilities summed over the "
          "response tokens. null = 0.01."),
      spec(str(kDpo, "loss_type"), K::string,
           "DPO loss of h = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log "
           "ref(rejected)): `sigmoid` -log sigmoid(kl_beta h), `hinge` relu(1 - kl_beta h), `ipo` "
           "(h - 1 / (2 kl_beta))^2; NxD Training's bco_pair is refused. null = sigmoid.",
           {"sigmoid", "hinge", "ipo", "bco_pair"}),
      spec(str(kDpo, "max_dpo_prompt_length"), K::integer,
           "DPO: prompt tokens kept (the response gets the rest of data.seq_length). null = "
           "data.seq_length / 2."),
      spec(str(kDpo, "precompute_ref_log_probs"), K::boolean,
           "DPO: true: the reference model's (the initial weights') log-probabilities of every "
           "pair are computed once before the first step and the reference copy is freed; false: "
           "a frozen copy of the initial weights scores each batch. null = true."),
      spec(str(kDpo, "truncation_mode"), K::string,
           "DPO: a prompt longer than max_dpo_prompt_length keeps its first (`keep_start`) or "
           "last (`keep_end`) tokens. null = keep_start.",
           {"keep_start", "keep_end"}),
  };
}

AlignmentSection resolve_alignment(const Config& c, const TrainConfig& t) {
  AlignmentSection a;
  auto text = [&](const std::string& k) { return c.is_null(k) ? "" : c.get_string(k); };
  a.train_dir = text("data.train_dir");
  a.val_dir = text("data.val_dir");
  if (!c.is_null("data.dev_choose_samples")) {
    a.dev_choose_samples = c.get_int("data.dev_choose_samples");
    if (a.dev_choose_samples <= 0)
      fail("data.dev_choose_samples must be positive, got ", a.dev_choose_samples);
  }
  std::string packing_key;
  for (const char* k : kPackingKeys) {
    if (c.is_null(k)) continue;
    const bool v = c.get_bool(k);
    if (!packing_key.empty() && v != a.packing)
      fail(k, "=", v, " disagrees with ", packing_key, "=", a.packing);
    a.packing = v;
    packing_key = k;
  }
  std::string dpo_key;
  for (const char* k : {"kl_beta", "loss_type", "max_dpo_prompt_length", "precompute_ref_log_probs",
                        "truncation_mode"})
    if (!c.is_null(str(kDpo, k))) dpo_key = str(kDpo, k);
  if (a.train_dir.empty()) {
    if (!packing_key.empty() && a.packing) fail(packing_key, "=true needs data.train_dir");
    if (!dpo_key.empty()) fail(dpo_key, " needs data.train_dir (DPO pairs in jsonl)");
    if (!a.val_dir.empty()) fail("data.val_dir needs data.train_dir");
    return a;
  }
  a.kind = dpo_key.empty() ? AlignmentSection::Kind::sft : AlignmentSection::Kind::dpo;
  const auto& d = t.dist;
  const bool dpo = a.kind == AlignmentSection::Kind::dpo;
  if ((a.packing || dpo) && d.pipeline_model_parallel_size > 1)
    fail(dpo ? dpo_key : packing_key,
         " with distributed_strategy.pipeline_model_parallel_size=", d.pipeline_model_parallel_size,
         ": not supported (", dpo ? "DPO" : "packing",
         " runs the whole model on each rank: pipeline_model_parallel_size 1)");
  if ((a.packing || dpo) && d.context_parallel_size > 1)
    fail(dpo ? dpo_key : packing_key,
         " with distributed_strategy.context_parallel_size=", d.context_parallel_size,
         ": not supported (context_parallel_size 1)");
  if (!dpo) return a;
  if (a.packing) fail(packing_key, "=true with DPO (", dpo_key, "): DPO rows are not packed");
  const std::string p = kDpo;
  if (!c.is_null(p + "kl_beta")) a.kl_beta = c.get_double(p + "kl_beta");
  if (!(a.kl_beta > 0)) fail(p, "kl_beta must be > 0, got ", a.kl_beta);
  if (!c.is_null(p + "loss_type")) a.loss_type = c.get_string(p + "loss_type");
  if (a.loss_type == "bco_pair")
    fail(p, "loss_type=", a.loss_type, " is not supported (nxd implements sigmoid, hinge, ipo)");
  const int64_t s = t.data.seq_length;
  a.max_prompt_length =
      c.is_null(p + "max_dpo_prompt_length") ? s / 2 : c.get_int(p + "max_dpo_prompt_length");
  if (a.max_prompt_length <= 0 || a.max_prompt_length >= s)
    fail(p, "max_dpo_prompt_length=", a.max_prompt_length, " must be in [1, data.seq_length=", s,
         ") (the response needs a token)");
  if (!c.is_null(p + "precompute_ref_log_probs"))
    a.precompute_ref_log_probs = c.get_bool(p + "precompute_ref_log_probs");
  if (!c.is_null(p + "truncation_mode")) a.truncation_mode = c.get_string(p + "truncation_mode");
  return a;
}

}  // namespace nxd::trainer
