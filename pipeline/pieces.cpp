#include "nxd/pipeline/pieces.h"

#include "nxd/autograd/graph.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd::pipeline {

PieceSize& PieceSize::operator+=(const PieceSize& o) {
  parameters += o.parameters;
  bytes += o.bytes;
  seconds += o.seconds;
  return *this;
}

PieceSize ModelPieces::part_size(const ModelPart& part) const {
  PieceSize s;
  const int64_t end = part.layer_end < 0 ? num_layers() : part.layer_end;
  for (int64_t l = part.layer_begin; l < end; ++l) s += layers.at(l);
  if (part.embedding) s += embedding;
  if (part.head) s += head;
  if (part.embedding && part.head) {  // one copy of the tied weights
    s.parameters -= tied_size.parameters;
    s.bytes -= tied_size.bytes;
  }
  return s;
}

std::shared_ptr<CausalLM> build_part(const PartBuilder& build, const ModelConfig& cfg,
                                     uint64_t seed, const ModelPart& part) {
  std::shared_ptr<CausalLM> m = build ? build(cfg, seed, part) : make_causal_lm(cfg, seed, part);
  if (!m)
    throw ConfigError(str("[pipeline] the part builder returned no model for ", part.str(cfg)));
  const ModelPart& got = m->part();
  if (got.layer_begin != part.layer_begin || got.end(cfg) != part.end(cfg) ||
      got.embedding != part.embedding || got.head != part.head)
    throw ConfigError(str("[pipeline] asked for ", part.str(cfg), ", the part builder built ",
                          m->type_name(), " of ", got.str(cfg),
                          ": a pipelined CausalLM passes the ModelPart it is given to CausalLM's "
                          "constructor and builds only that part"));
  return m;
}

namespace {

// One piece of the model on its own: decoder layer l, the input embedding, or the output head
// (after the L layers).
ModelPart layer_piece(int64_t l) {
  return {.layer_begin = l, .layer_end = l + 1, .embedding = false, .head = false};
}
ModelPart embedding_piece() {
  return {.layer_begin = 0, .layer_end = 0, .embedding = true, .head = false};
}
ModelPart head_piece(int64_t L) {
  return {.layer_begin = L, .layer_end = L, .embedding = false, .head = true};
}

struct Counted {
  PieceSize size;
  std::vector<std::string> names;
  std::vector<PieceSize> sizes;          // of each name
  std::vector<std::string> typed;        // modules of PieceOptions::layer_type
  std::vector<std::string> other_types;  // every module type it holds (for messages)
};

Counted count(const PartBuilder& build, const ModelConfig& meta, const ModelPart& part,
              const std::string& layer_type) {
  Counted c;
  std::shared_ptr<CausalLM> m = build_part(build, meta, 0, part);
  if (!layer_type.empty())
    for (const auto& [name, mod] : m->named_modules()) {
      if (mod->type_name() == layer_type) c.typed.push_back(name);
      c.other_types.push_back(mod->type_name());
    }
  for (const auto& [name, t] : m->named_parameters()) {
    PieceSize s;
    s.parameters = t.numel();
    s.bytes = t.nbytes();
    c.size += s;
    c.names.push_back(name);
    c.sizes.push_back(s);
  }
  return c;
}

// The module of decoder layer l named by one of its parameters: the components up to the first
// one that is l ("model.layers.3.mlp.up_proj.weight" -> "model.layers.3"); "" when none is.
std::string layer_module(const std::string& param, int64_t l) {
  const std::string index = std::to_string(l);
  for (size_t start = 0;;) {
    const size_t dot = param.find('.', start);
    if (dot == std::string::npos) return "";  // the last component names the tensor itself
    if (param.compare(start, dot - start, index) == 0 && dot - start == index.size())
      return param.substr(0, dot);
    start = dot + 1;
  }
}

// The prefix of layer l's module from its parameter names (every one must be under it).
std::string layer_prefix_of(const std::vector<std::string>& names, int64_t l) {
  if (names.empty()) return "";
  const std::string module = layer_module(names.front(), l);
  for (const std::string& n : names)
    if (module.empty() || n.rfind(module + ".", 0) != 0)
      throw ConfigError(
          str("[pipeline] decoder layer ", l, "'s part holds '", n, "', which is not under ",
              module.empty() ? str("a module named by its index ", l) : "'" + module + "'",
              ": a part's layers keep the whole model's names (ModuleList(part.layer_begin))"));
  return module.substr(0, module.size() - std::to_string(l).size());
}

// With a declared layer type: the one module of that type in layer l's piece, named by l.
void check_layer_type(const Counted& c, const std::string& type, int64_t l,
                      const std::string& prefix) {
  if (type.empty()) return;
  std::string held;
  for (const std::string& t : c.other_types) held += (held.empty() ? "" : ", ") + t;
  if (c.typed.size() != 1)
    throw ConfigError(str("[pipeline] the model declares its transformer layers as '", type,
                          "', but decoder layer ", l, "'s part holds ", c.typed.size(),
                          " module(s) of that type (it holds: ", held, ")"));
  if (!prefix.empty() && c.typed.front() != prefix + std::to_string(l))
    throw ConfigError(str("[pipeline] decoder layer ", l, "'s ", type, " is '", c.typed.front(),
                          "', not '", prefix, l, "' where its parameters are"));
}

void count_pieces(const ModelConfig& cfg, const PieceOptions& o, ModelPieces& p) {
  const PartBuilder& build = o.build;
  ModelConfig meta = cfg;
  meta.device = Device::meta;
  const int64_t L = cfg.num_layers;
  int64_t named = -1;  // the first layer with parameters
  for (int64_t l = 0; l < L; ++l) {
    Counted c = count(build, meta, layer_piece(l), o.layer_type);
    p.layers.push_back(c.size);
    const std::string prefix = layer_prefix_of(c.names, l);
    check_layer_type(c, o.layer_type, l, prefix);
    if (prefix.empty()) continue;
    if (named >= 0 && prefix != p.layer_prefix)
      throw ConfigError(str("[pipeline] decoder layer ", l, " is named '", prefix, l,
                            "' but layer ", named, " '", p.layer_prefix, named,
                            "': the layers need one prefix for pipeline_cuts"));
    if (named < 0) named = l, p.layer_prefix = prefix;
  }
  const Counted emb = count(build, meta, embedding_piece(), "");
  const Counted head = count(build, meta, head_piece(L), "");
  p.embedding = emb.size;
  p.head = head.size;
  if (!cfg.tie_word_embeddings) return;
  // the tied weights: what the head piece holds of the embedding piece
  for (size_t i = 0; i < emb.names.size(); ++i)
    for (const std::string& h : head.names)
      if (h == emb.names[i]) {
        p.tied.push_back(h);
        p.tied_size += emb.sizes[i];
      }
}

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

// Forward and backward of every piece on meta inputs, priced by a scratch SimClock.
void price_pieces(const ModelConfig& cfg, const PieceOptions& o, ModelPieces& p) {
  const sim::SimClock* current = sim::current_sim_clock();
  const sim::MachineSpec machine = current ? current->machine() : sim::machine("trn1.32xlarge");
  const int64_t B = o.micro_batch_size;
  const int64_t S = o.seq_length > 0 ? o.seq_length : cfg.max_position_embeddings;
  ContextOptions co;
  co.name = "pipeline cost model";
  Context scratch(co);
  ContextGuard guard(scratch);
  GradOn grad;
  ModelConfig meta = cfg;
  meta.device = Device::meta;
  const int64_t L = cfg.num_layers;
  auto timed = [&](const ModelPart& part, auto&& run) {
    std::shared_ptr<CausalLM> m = build_part(o.build, meta, 0, part);
    m->train(true);
    auto clock = std::make_shared<sim::SimClock>(machine, 0);  // from 0: equal pieces, equal times
    scratch.set_cost_model(clock);
    run(*m);
    scratch.set_cost_model(nullptr);
    return clock->compute_seconds();
  };
  const Tensor ids = zeros({B, S}, DType::i64, Device::meta);
  Tensor hidden;  // the embedding's output: every stage's input
  p.embedding.seconds = timed(embedding_piece(), [&](CausalLM& m) {
    Tensor h = m.decoder_layers(m.embed(ids));
    hidden = empty(h.shape(), h.dtype(), Device::meta);
    backward(h, empty_like(h));
  });
  auto input = [&] {
    Tensor h = empty(hidden.shape(), hidden.dtype(), Device::meta);
    h.set_requires_grad(true);
    return h;
  };
  for (int64_t l = 0; l < L; ++l)
    p.layers.at(l).seconds = timed(layer_piece(l), [&](CausalLM& m) {
      Tensor h = m.decoder_layers(input());
      backward(h, empty_like(h));
    });
  p.head.seconds = timed(
      head_piece(L), [&](CausalLM& m) { backward(m.head_loss(m.decoder_layers(input()), ids)); });
  p.cost_model = str("forward + backward of one [", B, ", ", S, "] microbatch on the ",
                     machine.core.name, " roofline (", machine.name, ") at tensor parallel 1");
}

}  // namespace

ModelPieces measure_pieces(const ModelConfig& cfg, const PieceOptions& opts) {
  cfg.validate();
  if (opts.micro_batch_size < 1)
    throw ConfigError(
        str("[pipeline] the modeled microbatch has micro_batch_size=", opts.micro_batch_size));
  if (opts.seq_length < 0 || opts.seq_length > cfg.max_position_embeddings)
    throw ConfigError(str("[pipeline] the modeled microbatch's seq_length=", opts.seq_length,
                          " is not in [0, max_position_embeddings=", cfg.max_position_embeddings,
                          "]"));
  ModelPieces p;
  count_pieces(cfg, opts, p);
  price_pieces(cfg, opts, p);
  return p;
}

}  // namespace nxd::pipeline
