// The fine-tuning keys (NxD Training's SFT, DPO and ORPO keys) and their resolution.
#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"

namespace nxd::train_app {

using json = nlohmann::json;

namespace {

constexpr const char* kDpo = "data.alignment_strategy.dpo.";
constexpr const char* kDpoModel = "model_alignment_strategy.dpo.";
constexpr const char* kOrpo = "model_alignment_strategy.orpo.";
// DPO's settings, each under both of NxD Training's spellings: data.alignment_strategy.dpo.<data>
// and model_alignment_strategy.dpo.<model>.
struct DpoSetting {
  const char* data;
  const char* model;
};
constexpr DpoSetting kDpoSettings[] = {{"kl_beta", "kl_beta"},
                                       {"loss_type", "loss_type"},
                                       {"max_dpo_prompt_length", "max_prompt_length"},
                                       {"precompute_ref_log_probs", "precompute_ref_log_probs"},
                                       {"truncation_mode", "truncation_mode"}};
constexpr const char* kOrpoSettings[] = {"beta", "max_prompt_length", "truncation_mode"};
const char* const kPackingKeys[] = {"data.alignment_strategy.sft.packing",
                                    "model_alignment_strategy.sft.packing", "data.packing"};

KeySpec spec(std::string k, KeyType t, std::string doc, std::vector<std::string> choices = {}) {
  return KeySpec{std::move(k), t, json(), std::move(doc), std::move(choices), true, 0};
}

template <class... A>
[[noreturn]] void fail(A&&... a) {
  throw ConfigError(str("[config] ", std::forward<A>(a)...));
}

// The key that sets DPO's setting d ("" for neither); ConfigError when both spellings are set to
// different values.
std::string dpo_key(const Config& c, const DpoSetting& d) {
  const std::string a = str(kDpo, d.data), b = str(kDpoModel, d.model);
  if (c.is_null(a)) return c.is_null(b) ? "" : b;
  if (!c.is_null(b) && c.get(a) != c.get(b))
    fail(a, "=", c.get(a).dump(), " disagrees with ", b, "=", c.get(b).dump(),
         " (two spellings of one setting)");
  return a;
}

// The set key among `keys` under `prefix` ("" for none).
template <class Keys>
std::string first_set(const Config& c, const char* prefix, const Keys& keys) {
  for (const auto& k : keys)
    if (!c.is_null(str(prefix, k))) return str(prefix, k);
  return "";
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
           "a DPO or ORPO key set (data.alignment_strategy.dpo, model_alignment_strategy.dpo or "
           "model_alignment_strategy.orpo), preference rows {\"prompt\", \"chosen\", "
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
      spec(str(kDpo, "kl_beta"), K::number,
           "DPO (any data.alignment_strategy.dpo or model_alignment_strategy.dpo key set turns it "
           "on): beta of the loss (loss_type) and of the logged rewards beta (log pi - log ref), "
           "log-probabilities summed over the response tokens. null = 0.01."),
      spec(str(kDpo, "loss_type"), K::string,
           "DPO loss of h = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log "
           "ref(rejected)): `sigmoid` -log sigmoid(kl_beta h), `hinge` relu(1 - kl_beta h), `ipo` "
           "(h - 1 / (2 kl_beta))^2; NxD Training's bco_pair is refused. null = sigmoid.",
           {"sigmoid", "hinge", "ipo", "bco_pair"}),
      spec(str(kDpo, "max_dpo_prompt_length"), K::integer,
           "DPO: prompt tokens kept when a prompt and its longer response exceed data.seq_length "
           "(the responses get the rest). null = data.seq_length / 2."),
      spec(str(kDpo, "precompute_ref_log_probs"), K::boolean,
           "DPO: true: the reference model's (the initial weights') log-probabilities of every "
           "pair are computed once before the first step and the reference copy is freed; false: "
           "a frozen copy of the initial weights scores each batch. null = true."),
      spec(str(kDpo, "truncation_mode"), K::string,
           "DPO: when a prompt and its longer response exceed data.seq_length, the prompt keeps "
           "its first (`keep_start`) or last (`keep_end`) max_dpo_prompt_length tokens. null = "
           "keep_start.",
           {"keep_start", "keep_end"}),
      spec(str(kDpoModel, "kl_beta"), K::number,
           "Alias of data.alignment_strategy.dpo.kl_beta (both set: they must agree)."),
      spec(str(kDpoModel, "loss_type"), K::string,
           "Alias of data.alignment_strategy.dpo.loss_type.",
           {"sigmoid", "hinge", "ipo", "bco_pair"}),
      spec(str(kDpoModel, "max_prompt_length"), K::integer,
           "Alias of data.alignment_strategy.dpo.max_dpo_prompt_length."),
      spec(str(kDpoModel, "precompute_ref_log_probs"), K::boolean,
           "Alias of data.alignment_strategy.dpo.precompute_ref_log_probs."),
      spec(str(kDpoModel, "truncation_mode"), K::string,
           "Alias of data.alignment_strategy.dpo.truncation_mode.", {"keep_start", "keep_end"}),
      spec(str(kOrpo, "beta"), K::number,
           "ORPO (any model_alignment_strategy.orpo key set turns it on; no reference model): "
           "loss = NLL of the chosen responses - beta mean log sigmoid(log odds(chosen) - log "
           "odds(rejected)), odds of the mean response log-probability. null = 0.01."),
      spec(str(kOrpo, "max_prompt_length"), K::integer,
           "ORPO: prompt tokens kept when a prompt and its longer response exceed "
           "data.seq_length (the responses get the rest). null = data.seq_length / 2."),
      spec(str(kOrpo, "truncation_mode"), K::string,
           "ORPO: when a prompt and its longer response exceed data.seq_length, the prompt keeps "
           "its first (`keep_start`) or last (`keep_end`) max_prompt_length tokens. null = "
           "keep_start.",
           {"keep_start", "keep_end"}),
  };
}

namespace {

// a.packing from whichever packing keys are set (they must agree); the last one set, or "".
std::string resolve_packing(const Config& c, AlignmentSection& a) {
  std::string packing_key;
  for (const char* k : kPackingKeys) {
    if (c.is_null(k)) continue;
    const bool v = c.get_bool(k);
    if (!packing_key.empty() && v != a.packing)
      fail(k, "=", v, " disagrees with ", packing_key, "=", a.packing);
    a.packing = v;
    packing_key = k;
  }
  return packing_key;
}

// DPO's or ORPO's settings (a.kind chosen): prompt length, truncation, and ORPO's beta or DPO's
// kl_beta, loss_type and precompute_ref_log_probs.
void resolve_preference_settings(const Config& c, const TrainConfig& t, AlignmentSection& a) {
  // the key of each setting (DPO: whichever spelling is set)
  auto key = [&](const char* dpo_data, const char* dpo_model, const char* orpo) {
    if (a.kind == AlignmentSection::Kind::orpo) return str(kOrpo, orpo);
    const std::string k = dpo_key(c, {dpo_data, dpo_model});
    return k.empty() ? str(kDpo, dpo_data) : k;
  };
  const int64_t s = t.data.seq_length;
  const std::string mpl = key("max_dpo_prompt_length", "max_prompt_length", "max_prompt_length");
  a.max_prompt_length = c.is_null(mpl) ? s / 2 : c.get_int(mpl);
  if (a.max_prompt_length <= 0 || a.max_prompt_length >= s)
    fail(mpl, "=", a.max_prompt_length, " must be in [1, data.seq_length=", s,
         ") (the response needs a token)");
  const std::string tm = key("truncation_mode", "truncation_mode", "truncation_mode");
  if (!c.is_null(tm)) a.truncation_mode = c.get_string(tm);
  if (a.kind == AlignmentSection::Kind::orpo) {
    const std::string b = str(kOrpo, "beta");
    if (!c.is_null(b)) a.orpo_beta = c.get_double(b);
    if (!(a.orpo_beta > 0)) fail(b, "=", a.orpo_beta, " must be > 0");
    return;
  }
  const std::string kb = key("kl_beta", "kl_beta", "");
  if (!c.is_null(kb)) a.kl_beta = c.get_double(kb);
  if (!(a.kl_beta > 0)) fail(kb, " must be > 0, got ", a.kl_beta);
  const std::string lt = key("loss_type", "loss_type", "");
  if (!c.is_null(lt)) a.loss_type = c.get_string(lt);
  if (a.loss_type == "bco_pair")
    fail(lt, "=", a.loss_type, " is not supported (nxd implements sigmoid, hinge, ipo)");
  const std::string pr = key("precompute_ref_log_probs", "precompute_ref_log_probs", "");
  if (!c.is_null(pr)) a.precompute_ref_log_probs = c.get_bool(pr);
}

}  // namespace

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
  const std::string packing_key = resolve_packing(c, a);
  std::string dpo_set;  // a DPO key that is set
  for (const DpoSetting& d : kDpoSettings)
    if (const std::string k = dpo_key(c, d); !k.empty()) dpo_set = k;
  const std::string orpo_set = first_set(c, kOrpo, kOrpoSettings);
  if (!dpo_set.empty() && !orpo_set.empty())
    fail(dpo_set, " (DPO) and ", orpo_set, " (ORPO) are both set: choose one");
  const std::string pref_key = dpo_set.empty() ? orpo_set : dpo_set;
  const char* pref_name = dpo_set.empty() ? "ORPO" : "DPO";
  if (a.train_dir.empty()) {
    if (!packing_key.empty() && a.packing) fail(packing_key, "=true needs data.train_dir");
    if (!pref_key.empty()) fail(pref_key, " needs data.train_dir (", pref_name, " pairs in jsonl)");
    if (!a.val_dir.empty()) fail("data.val_dir needs data.train_dir");
    return a;
  }
  a.kind = !dpo_set.empty()    ? AlignmentSection::Kind::dpo
           : !orpo_set.empty() ? AlignmentSection::Kind::orpo
                               : AlignmentSection::Kind::sft;
  const auto& d = t.dist;
  const bool pref = !pref_key.empty();
  if ((a.packing || pref) && d.pipeline_model_parallel_size > 1)
    fail(pref ? pref_key : packing_key,
         " with distributed_strategy.pipeline_model_parallel_size=", d.pipeline_model_parallel_size,
         ": not supported (", pref ? pref_name : "packing",
         " runs the whole model on each rank: pipeline_model_parallel_size 1)");
  if ((a.packing || pref) && d.context_parallel_size > 1)
    fail(pref ? pref_key : packing_key,
         " with distributed_strategy.context_parallel_size=", d.context_parallel_size,
         ": not supported (context_parallel_size 1)");
  if (!pref) return a;
  if (a.packing)
    fail(packing_key, "=true with ", pref_name, " (", pref_key, "): ", pref_name,
         " rows are not packed");
  resolve_preference_settings(c, t, a);
  return a;
}

}  // namespace nxd::train_app
