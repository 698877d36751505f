// The configuration key registry (every key nxd-train accepts, as data) and key lookup.
#include "nxd/train_app/config.h"

#include <algorithm>
#include <climits>
#include <concepts>

#include "nxd/runtime/error.h"

namespace nxd::train_app {

using json = nlohmann::json;

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::string:
      return "string";
    case KeyType::number_list:
      return "list of numbers";
    case KeyType::string_list:
      return "list of strings";
  }
  return "?";
}

namespace {

// A key whose default is null is nullable: null means "derive it" (the doc says from what).
KeySpec key(std::string k, KeyType t, json def, std::string doc,
            std::vector<std::string> choices = {}, int64_t list_size = 0) {
  const bool nullable = def.is_null();
  return KeySpec{std::move(k),       t,        std::move(def), std::move(doc),
                 std::move(choices), nullable, list_size};
}
// The former trailing `nullable` flag: a key written as key(..., {}, true) stops here instead of
// reading `true` as list_size 1. Give the key a null default instead.
KeySpec key(std::string k, KeyType t, json def, std::string doc, std::vector<std::string> choices,
            std::same_as<bool> auto nullable) = delete;

std::vector<KeySpec> make_registry() {
  using K = KeyType;
  return {
      key("seed", K::integer, 1234,
          "Seed of everything random: parameter init, data shuffling and split, sampling."),
      key("exp_manager.exp_dir", K::string, "runs/nxd_train",
          "Output directory (config.yaml, metrics.csv, tensorboard/, sample.txt); `--out DIR` "
          "sets it. The default is under `runs/`, which git ignores."),
      key("exp_manager.create_tensorboard_logger", K::boolean, true,
          "Write TensorBoard event files to `<exp_dir>/tensorboard/` (loss, val_loss, lr per "
          "parameter group, grad_norm, tokens/s, modeled step time, HBM peak, the config)."),
      key("exp_manager.create_early_stopping_callback", K::boolean, false,
          "Stop when the monitored loss stops improving (early_stopping_callback_params)."),
      key("exp_manager.early_stopping_callback_params.monitor", K::string, "val_loss",
          "What early stopping watches: `val_loss` (each validation) or `loss` (the training "
          "loss at each logged step).",
          {"val_loss", "loss"}),
      key("exp_manager.early_stopping_callback_params.patience", K::integer, 3,
          "Checks without improvement before stopping."),
      key("exp_manager.early_stopping_callback_params.min_delta", K::number, 0.0,
          "Smallest change that counts as an improvement."),
      key("exp_manager.early_stopping_callback_params.mode", K::string, "min",
          "`min`: lower is better; `max`: higher is better.", {"min", "max"}),
      key("exp_manager.create_checkpoint_callback", K::boolean, nullptr,
          "Save checkpoints to `<exp_dir>/checkpoints/step_<N>/` (checkpoint_callback_params). "
          "null = true when every_n_train_steps > 0."),
      key("exp_manager.checkpoint_callback_params.every_n_train_steps", K::integer, 0,
          "Save every N optimizer steps; 0 = only at the end of training."),
      key("exp_manager.checkpoint_callback_params.save_top_k", K::integer, 2,
          "Checkpoints kept: the newest N, or the best N by `monitor`; -1 = all."),
      key("exp_manager.checkpoint_callback_params.monitor", K::string, "step",
          "What save_top_k ranks by: `step` (the newest are kept, whatever the mode), `loss` "
          "(the step's training loss) or `val_loss` (the latest validation loss).",
          {"step", "loss", "val_loss"}),
      key("exp_manager.checkpoint_callback_params.mode", K::string, "min",
          "`min`: lower monitor values are better; `max`: higher.", {"min", "max"}),
      key("exp_manager.checkpoint_callback_params.save_last", K::boolean, true,
          "Also save at the end of training."),
      key("exp_manager.save_bf16", K::boolean, false,
          "Write the model's weights in bf16 (half the bytes of f32 weights); the optimizer state, "
          "f32 master weights included, is written as held. Such a checkpoint loads into f32 and "
          "bf16 runs (its weights converted)."),
      key("exp_manager.zero3_checkpoint_format", K::string, "per_rank",
          "How a stage-3 run (distributed_strategy.zero_stage=3) writes the model: `per_rank`: "
          "every DP rank its block of each layer's sharded weights (no gather, no host copy of "
          "the model; format 3, which loads at any stage and DP, TP, PP or EP degree; under "
          "expert parallelism the experts' blocks are over expert-DP); `gathered`: each layer "
          "gathered in turn and DP rank 0 writing whole tensors (format 1/2, for an nxd that "
          "predates format 3).",
          {"per_rank", "gathered"}),
      key("exp_manager.async_checkpointing", K::boolean, false,
          "Write checkpoints on a background thread (the tensors are copied first: the stall "
          "is printed per checkpoint)."),
      key("exp_manager.resume_from_checkpoint", K::string, nullptr,
          "Resume from this checkpoint (a `step_<N>` folder or a folder of checkpoints: its newest "
          "complete one): model, optimizer, step, data order and RNG, so later steps are bitwise "
          "those of an uninterrupted run."),
      key("exp_manager.resume_if_exists", K::boolean, false,
          "Resume from the newest complete checkpoint in `<exp_dir>/checkpoints/` if there is one "
          "(resume_from_checkpoint wins when set)."),
      key("exp_manager.existing_run", K::string, "auto",
          "When `exp_dir` holds another run's outputs (metrics.csv with a row, checkpoints/, "
          "sample.txt) and this run does not resume it: `refuse` (exit 2), or `set_aside`: move "
          "them (and tensorboard/, config.yaml) to `<exp_dir>/previous_runs/<k>/` first; `auto`: "
          "`set_aside` in the default folder `runs/nxd_train` (so the quick start can run again), "
          "`refuse` in any other. Nothing is deleted either way.",
          {"auto", "refuse", "set_aside"}),
      // trainer
      key("trainer.max_steps", K::integer, 700,
          "Optimizer steps to run; 0 = evaluate only (`--eval`): the validation loss and "
          "perplexity of model.init_from's or the resumed weights over the whole validation "
          "split."),
      key("trainer.max_epochs", K::integer, nullptr,
          "Stop after the optimizer step that finishes this many passes over the training data "
          "(whichever of max_steps and max_epochs comes first); null = no limit."),
      key("trainer.log_every_n_steps", K::integer, 10,
          "A metrics.csv row and progress update every N steps (and at the last step)."),
      key("trainer.val_check_interval", K::integer, 100,
          "Validation loss every N steps, and at the last step; 0 = never."),
      key("trainer.limit_val_batches", K::integer, 8,
          "Micro batches per validation (a fixed set, the same every time); capped by the "
          "validation split's size."),
      key("trainer.gradient_clip_val", K::number, 1.0,
          "Clip the global L2 gradient norm to this value; 0 = no clipping."),
      key("trainer.on_nonfinite", K::string, "stop",
          "A step whose loss or gradient norm is NaN or infinite never updates the model; then "
          "`stop`: the run ends with an error (exit 2) naming the step, or `skip`: training goes "
          "on with the next batch (the step is counted, not checkpointed). Either way no "
          "checkpoint is saved from a non-finite step.",
          {"stop", "skip"}),
      key("trainer.num_threads", K::integer, 0,
          "Compute (BLAS) threads; 0 = NXD_NUM_THREADS if set, else every core. The sim backend "
          "with several ranks runs each rank's BLAS on one thread (the ranks are the threads)."),
      key("trainer.matmul_precision", K::string, nullptr,
          "Deprecated alias of precision.type from before it existed: `bf16` = `autocast`, "
          "`fp32` = `fp32`. null = not used; when both are set they must agree.",
          {"fp32", "bf16"}),
      // data
      key("data.kind", K::string, "text",
          "`text`: byte-level tokens (vocab 256) of a text file or of every text file under a "
          "folder; `tokens`: a pre-tokenized binary file; `random`: uniform random tokens "
          "(benchmarks).",
          {"text", "tokens", "random"}),
      key("data.path", K::string, "/usr/share/games/fortunes",
          "The text file or folder (`text`), or the token file (`tokens`). Folders are read "
          "recursively in sorted order; files that are not text (NUL bytes, invalid UTF-8) are "
          "skipped with a note."),
      key("data.tokenizer", K::string, nullptr,
          "`text`: a Hugging Face tokenizer.json (or its folder) with a BPE model, byte-level "
          "(GPT-2, GPT-NeoX, Llama 3, Qwen2 pre-tokenizers) or SentencePiece-style with "
          "byte_fallback (Llama 2, Mistral, Mixtral), that tokenizes the text and the generation "
          "prompt and decodes the sample; its ids are the `tokenizers` library's (without special "
          "tokens). model.vocab_size must cover its ids. null = byte-level tokens (vocab 256)."),
      key("data.token_dtype", K::string, "uint16",
          "Element type of a `tokens` file (little-endian).", {"uint16", "uint32"}),
      key("data.seq_length", K::integer, 128, "Tokens per sample."),
      key("data.micro_batch_size", K::integer, nullptr,
          "Samples per forward/backward pass on one rank. null = global_batch_size / data-parallel "
          "size (no gradient accumulation)."),
      key("data.global_batch_size", K::integer, 16,
          "Samples per optimizer step: micro_batch_size x gradient-accumulation steps x "
          "data-parallel size."),
      key("data.val_fraction", K::number, 0.05,
          "Fraction of the samples held out for validation (chosen by the seed)."),
      key("data.shuffle", K::boolean, true,
          "Shuffle the training samples every epoch (deterministically from the seed)."),
      key("data.random_num_samples", K::integer, 65536,
          "`random`: number of samples in the synthetic dataset."),
      // model
      key("model.arch", K::string, "llama",
          "Model family: `llama`, `gpt_neox`, `mixtral`, `qwen2`, `qwen3` or `mistral` (built in; "
          "the last three take their biases, q/k norms and sliding window from model.init_from or "
          "model.model_config, else transformers' defaults: Qwen2's q/k/v biases, Qwen3's q/k "
          "norms, Mistral's window of 4096), or the name a program's own module builds "
          "(examples/new_model trains `gpt2`)."),
      key("model.init_from", K::string, nullptr,
          "Fine-tuning: start from these weights (a transformers folder with config.json, an nxd "
          "checkpoint of any TP/PP/DP/EP degree or a run folder, or a file of `nxd-ckpt export`), "
          "resharded to this run's layout, with a fresh optimizer at step 0. The model.* keys "
          "left at their defaults take the source's values; one set otherwise is an error. null "
          "= initialize as model.init_method says."),
      key("model.model_config", K::string, nullptr,
          "NxD Training's architecture source: a transformers config.json (or its folder; "
          "model_type llama, mixtral, qwen2, qwen3, mistral or gpt_neox) whose model sets the "
          "model.* keys left at their defaults, without weights; keys this configuration sets "
          "win. What no key says (head_dim, biases, qk_norm, sliding_window) comes from it too."),
      key("model.vocab_size", K::integer, 256,
          "Vocabulary size; at least 256 for byte-level text, above every id of a token file."),
      key("model.num_layers", K::integer, 4, "Decoder layers."),
      key("model.hidden_size", K::integer, 192, "Model width."),
      key("model.num_attention_heads", K::integer, 4, "Attention heads; must divide hidden_size."),
      key("model.num_kv_heads", K::integer, nullptr,
          "Key/value heads (grouped-query attention, llama); must divide num_attention_heads. "
          "null = num_attention_heads."),
      key("model.ffn_hidden_size", K::integer, nullptr,
          "MLP width. null = llama: 8/3 x hidden rounded up to a multiple of 256; any other arch: "
          "4 x hidden."),
      key("model.max_position_embeddings", K::integer, nullptr,
          "Longest sequence the model accepts. null = data.seq_length."),
      key("model.rotary_pct", K::number, 0.25,
          "gpt_neox: fraction of each head's features that get rotary embeddings (llama: all)."),
      key("model.rope_theta", K::number, 10000.0, "Rotary base."),
      key("model.norm_eps", K::number, 1e-5, "RMSNorm (llama) / LayerNorm (gpt_neox) epsilon."),
      key("model.init_method", K::string, "nxd",
          "Initialization. `nxd`: PyTorch's and NxD's layer defaults (weights and biases "
          "uniform(+-1/sqrt(fan_in)) = kaiming_uniform_(a=sqrt(5)), embeddings normal(0, 1)); "
          "`normal`: Hugging Face's normal(0, init_std) weights and embeddings, zero biases; "
          "`scaled_normal`: normal with the attention and MLP output projections at init_std / "
          "sqrt(2 num_layers) (GPT-2, Megatron-LM). Norms start at weight 1, bias 0.",
          {"nxd", "normal", "scaled_normal"}),
      key("model.init_std", K::number, 0.02,
          "Std of the normal init (init_method normal or scaled_normal)."),
      key("model.dropout", K::number, 0.0, "Dropout on attention and MLP outputs (training)."),
      key("model.tie_word_embeddings", K::boolean, false,
          "The output head reuses the input embedding."),
      key("model.activations_checkpoint_granularity", K::string, nullptr,
          "Activation checkpointing: null keeps every activation; `full` recomputes each decoder "
          "layer in backward; `selective` recomputes only the attention core (scores, softmax, "
          "PV). Gradients are bitwise those of null.",
          {"full", "selective"}),
      // mixture of experts (NxD Training's model.moe section)
      key("model.moe.num_experts", K::integer, 0,
          "Mixture of experts: experts per MoE layer (0 = dense). The MLP of every "
          "`frequency`-th decoder layer becomes a router and this many SwiGLU experts (Mixtral's "
          "block_sparse_moe); model.arch=mixtral needs it. llama/mixtral only."),
      key("model.moe.top_k", K::integer, 2, "Experts each token is routed to (<= num_experts)."),
      key("model.moe.frequency", K::integer, 1,
          "Every how many decoder layers the MLP is a MoE layer (layer l when l % frequency == "
          "0; 1 = every layer)."),
      key("model.moe.capacity_factor", K::number, 1.0,
          "Without dropless: each expert takes at most ceil(capacity_factor x tokens x top_k / "
          "num_experts) of a rank's token assignments, first come in token order; the rest are "
          "dropped (counted in moe_metrics.csv)."),
      key("model.moe.dropless", K::boolean, true,
          "Every token reaches its top_k experts (no capacity)."),
      key("model.moe.router_aux_loss_coef", K::number, 0.02,
          "Coefficient of the load-balancing loss E/k x sum_e f_e P_e (f_e: share of the "
          "assignments routed to expert e, P_e: its mean router probability; 1 when balanced), "
          "added to the training loss."),
      key("model.moe.router_z_loss_coef", K::number, 0.0,
          "Coefficient of the router z-loss (mean squared logsumexp of the router logits; "
          "ST-MoE); 0 = off."),
      key("model.moe.normalize_top_k_affinities", K::boolean, true,
          "Renormalize the top_k router probabilities of a token to sum to 1 (Mixtral)."),
      // optimizer
      key("model.optim.name", K::string, "adamw",
          "Optimizer (`adamw_fp32OptState` is NxD Training's name for AdamW; `lion`: Lion, one "
          "moment per parameter, half of AdamW's state).",
          {"adamw", "adamw_fp32OptState", "sgd", "lion"}),
      key("model.optim.lr", K::number, 3e-3, "Peak learning rate."),
      key("model.optim.weight_decay", K::number, 0.01,
          "Decoupled weight decay; biases and norm weights get none (NxD's grouping)."),
      key("model.do_layer_norm_weight_decay", K::boolean, false,
          "Apply model.optim.weight_decay to norm weights too (NxD Training's key); biases get "
          "none either way."),
      key("model.optim.betas", K::number_list, json::array({0.9, 0.99}),
          "AdamW and Lion (beta1, beta2).", {}, /*list_size=*/2),
      key("model.optim.eps", K::number, 1e-8, "AdamW epsilon (added to sqrt(v_hat))."),
      key("model.optim.momentum", K::number, 0.0, "SGD momentum."),
      key("model.optim.nesterov", K::boolean, false, "SGD Nesterov momentum."),
      key("model.optim.sched.name", K::string, "cosine",
          "LR schedule after the warmup: constant, linear or cosine decay to min_lr "
          "(NxD Training's `LinearAnnealingWithWarmUp` and `CosineAnnealing` are accepted).",
          {"constant", "linear", "cosine", "LinearAnnealingWithWarmUp", "CosineAnnealing"}),
      key("model.optim.sched.warmup_steps", K::integer, nullptr,
          "Linear warmup from 0 to lr over this many steps. null = min(50, max_steps / 10)."),
      key("model.optim.sched.max_steps", K::integer, nullptr,
          "Step where the decay reaches min_lr. null = trainer.max_steps."),
      key("model.optim.sched.min_lr", K::number, 1e-4, "Floor of the decay."),
      // parallelism
      key("distributed_strategy.tensor_model_parallel_size", K::integer, 2,
          "Tensor-parallel degree: attention heads, kv heads x kv_replicator, ffn size and vocab "
          "must divide by it. Data-parallel degree = world size / (this x "
          "pipeline_model_parallel_size)."),
      key("distributed_strategy.pipeline_model_parallel_size", K::integer, 1,
          "Pipeline-parallel degree: the decoder layers are cut into this many stages (times "
          "virtual_pipeline_model_parallel_size), balanced as pipeline_partition says; each step's "
          "global_batch_size / (micro_batch_size x data-parallel size) micro batches are the "
          "pipeline's microbatches."),
      key("distributed_strategy.context_parallel_size", K::integer, 1,
          "Context-parallel degree (Megatron-core's CP; NxD's context_parallel_size): each "
          "sequence "
          "is split over this many ranks, each holding chunks r and 2 CP - 1 - r of 2 CP equal "
          "chunks; attention is ring attention, every other layer runs on the rank's tokens. "
          "data.seq_length must divide by 2 x it (and by 2 x it x tensor_model_parallel_size "
          "with sequence_parallel). Data-parallel degree = world / (tp x pp x this). With "
          "model.moe: dropless only."),
      key("distributed_strategy.virtual_pipeline_model_parallel_size", K::integer, 1,
          "Model chunks per pipeline rank (interleaved schedule; > 1 needs pipeline_schedule "
          "interleaved and microbatches a multiple of pipeline_model_parallel_size)."),
      key("distributed_strategy.pipeline_schedule", K::string, "1f1b",
          "gpipe (all forwards, then all backwards), 1f1b (NxD's one-forward-one-backward) or "
          "interleaved (virtual stages).",
          {"gpipe", "1f1b", "interleaved"}),
      key("distributed_strategy.pipeline_partition", K::string, "parameters",
          "How the decoder layers are split into stages (nxd's key; NxD splits evenly): "
          "contiguous runs minimizing the largest stage's parameters (`parameters`, the embedding "
          "counted on the first stage and the head on the last) or its modeled time "
          "(`modeled_cost`: each piece's forward and backward of one micro batch of "
          "data.micro_batch_size x data.seq_length on the sim NeuronCore's roofline).",
          {"parameters", "modeled_cost"}),
      key("distributed_strategy.zero1", K::boolean, false,
          "ZeRO-1: the optimizer's state (AdamW's exp_avg and exp_avg_sq, Lion's exp_avg, SGD's "
          "momentum, and the f32 master weights of bf16 parameters) sharded over the "
          "data-parallel ranks; gradients are reduce-scattered, each rank steps its shard of the "
          "parameters, and the parameters are all-gathered. Checkpoints hold the unsharded "
          "optimizer's layout. The same as zero_stage: 1."),
      key("distributed_strategy.zero_stage", K::integer, nullptr,
          "What is sharded over the data-parallel ranks (docs/design/fsdp.md): 0 nothing, 1 the "
          "optimizer state (= zero1: true), 2 also the gradients (each bucket reduce-scattered "
          "into the rank's shard, the full-size gradients freed), 3 also the parameters (each "
          "decoder layer's gathered before its forward and its backward and freed after, the "
          "embedding, final norm and head around the forward and the head's backward; over DP x "
          "CP with context parallelism; with MoE at EP > 1 each layer's experts over expert-DP, "
          "gathered around their GEMMs; under PP per pipeline chunk). null: zero1 decides. A "
          "value other than 1 with zero1: true is an error naming both."),
      key("distributed_strategy.reshard_after_forward", K::boolean, true,
          "ZeRO-3 (FSDP's reshard_after_forward): a layer's parameters are freed after its "
          "forward and gathered again for its backward; false keeps them from the forward to "
          "the end of the layer's backward (less communication, more memory)."),
      key("distributed_strategy.zero3_prefetch", K::boolean, true,
          "ZeRO-3 (FSDP's forward_prefetch and backward_prefetch): gathering a layer starts the "
          "all-gather of the next one of its pass (the next layer's in forward, the previous "
          "one's in backward), which runs under this layer's compute; false gathers each layer "
          "when it is needed (every gather exposed, one layer gathered at a time)."),
      key("distributed_strategy.optimizer_offload", K::boolean, false,
          "Optimizer offload (with zero_stage 1, 2 or 3): the sharded optimizer state and f32 "
          "master weights live in host memory, accounted apart from HBM by the sim device, and the "
          "update runs there; nxd-train prints the HBM peak against the host's. Losses are "
          "unchanged (the same update); the sim clock and nxd-plan charge each bucket's PCIe "
          "round trip and the host's update (docs/design/fsdp.md)."),
      key("distributed_strategy.expert_model_parallel_size", K::integer, 1,
          "Expert-parallel degree: the experts of each MoE layer are split over this many "
          "data-parallel (or data x context-parallel) ranks (it divides data-parallel size x "
          "context_parallel_size and model.moe.num_experts); "
          "tokens reach their experts by all-to-all, and the experts' gradients are averaged "
          "over the expert-data-parallel group (with zero1 their optimizer state is sharded "
          "over it too). At tensor_model_parallel_size > 1 each expert's intermediate dimension "
          "is split over TP as well."),
      key("distributed_strategy.sequence_parallel", K::boolean, true,
          "Split activations along the sequence between the tensor-parallel regions (TP > 1)."),
      key("model_alignment_strategy.peft.lora_rank", K::integer, nullptr,
          "LoRA (NxD Training's peft): the adapters' rank r. null = full fine-tuning; set, every "
          "layer target_modules selects gets y += (lora_alpha / r) B A x, everything else is "
          "frozen (no gradient, no optimizer state), and the run prints trainable vs total "
          "parameters, its memory plan and allocator peak against the plan of full fine-tuning."),
      key("model_alignment_strategy.peft.lora_alpha", K::number, 32.0,
          "LoRA scale numerator: the adapter's output is multiplied by lora_alpha / lora_rank."),
      key("model_alignment_strategy.peft.lora_dropout", K::number, 0.05,
          "Dropout on the adapters' input while training (0: none)."),
      key("model_alignment_strategy.peft.target_modules", K::string_list, json::array({"qkv_proj"}),
          "The linear layers that get adapters: a list of names, each matching a layer whose "
          "name is it or ends with `.name` (`qkv_proj`: q_proj, k_proj and v_proj; also "
          "o_proj, gate_proj, up_proj, down_proj; GPT-NeoX query_key_value, dense, "
          "dense_h_to_4h, dense_4h_to_h), or one string: a regular expression the full name "
          "matches (PEFT's forms)."),
      key("model_alignment_strategy.peft.merge_lora", K::boolean, false,
          "Recorded in the checkpoints: `nxd-ckpt export-hf` then merges the adapters into the "
          "base weights (as with --merge-lora). Adapters alone: `nxd-ckpt export-lora`."),
      key("distributed_strategy.kv_replicator", K::integer, nullptr,
          "K/V heads replicated this many times so TP can exceed model.num_kv_heads "
          "(NxD's kv_size_multiplier). null = max(1, TP / num_kv_heads)."),
      key("distributed_strategy.grad_bucket_mb", K::number, 25.0,
          "Data-parallel gradient bucket size in MiB: the buckets are the parameters' gradients, "
          "all-reduced (or reduce-scattered with ZeRO-1) as they fill during the last micro "
          "batch's backward."),
      // precision
      key("precision.type", K::string, nullptr,
          "NxD Training's precision: `fp32`; `autocast`: f32 parameters, matrix products with "
          "inputs rounded to bf16 and f32 accumulation (neuronx-cc's default `--auto-cast "
          "matmult`); `mixed_precision`: bf16 parameters and activations, f32 master weights in "
          "the optimizer, f32 gradient accumulation and reduction; `bf16SR`: pure bf16, "
          "parameter updates rounded stochastically (counter-based: runs stay reproducible). "
          "null = autocast, or what trainer.matmul_precision says.",
          {"fp32", "autocast", "mixed_precision", "bf16SR"}),
      key("precision.master_weights", K::boolean, nullptr,
          "bf16 parameters: keep f32 master weights in the optimizer. null = true for "
          "mixed_precision, false for bf16SR."),
      key("precision.fp32_grad_acc", K::boolean, nullptr,
          "bf16 parameters: accumulate and reduce their gradients in f32. null = true for "
          "mixed_precision, false for bf16SR."),
      // backend
      key("backend.kind", K::string, "sim",
          "sim: every rank a thread of this process on a simulated Neuron machine; mpi: one rank "
          "per process under mpirun (`mpirun -np N nxd-train --set backend.kind=mpi`).",
          {"sim", "mpi"}),
      key("backend.instance", K::string, "trn1.32xlarge",
          "sim: the modeled instance type (its NeuronCores, HBM and links give the modeled step "
          "time and memory): trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge, "
          "trn2u.48xlarge, trn2u (the Trn2 UltraServer), trn3-gen1, trn3-gen2 (the Trn3 "
          "UltraServers), inf2.*; <N>x<type> for N instances over EFA; a Trainium2 or Trainium3 "
          "type runs at LNC=2, <type>:lnc=1 at LNC=1."),
      key("backend.world_size", K::integer, nullptr,
          "Ranks (NeuronCores). null = 8 (sim) or the MPI world (mpi). Must equal "
          "tensor_model_parallel_size x pipeline_model_parallel_size x context_parallel_size x "
          "data-parallel size; 1 = plain single-rank training."),
      key("backend.timeline", K::string, "",
          "sim: write every rank's modeled kernels and collectives to this file as a Chrome trace "
          "(opens in https://ui.perfetto.dev); it grows with every step, so use it on short runs. "
          "Empty = no trace."),
      key("backend.collective_timeout_s", K::number, nullptr,
          "A rank waiting longer than this (wall seconds) in one collective or receive ends "
          "the job with an error naming the ranks that never arrived (a hung or dead rank), the "
          "call, its group and sequence number; under mpi the job is aborted (exit 1, so "
          "nxd-elastic restarts it) and waits poll with a sleeping back-off instead of blocking. "
          "Keep it above the longest phase one rank spends outside collectives (a checkpoint "
          "write). null = sim: NXD_SIM_TIMEOUT if set, else 300; mpi: NXD_MPI_TIMEOUT if set, "
          "else none."),
      key("backend.fail_rank", K::integer, -1,
          "Fault injection (tests of recovery; sim and mpi): this rank fails after step "
          "backend.fail_at_step. -1 = none."),
      key("backend.fail_at_step", K::integer, 1,
          "Fault injection: the step fail_rank fails after."),
      key("backend.fail_mode", K::string, "crash",
          "Fault injection: `crash` (the rank throws: the job ends naming it), `hang` (the rank "
          "stops answering: the others time out after backend.collective_timeout_s, or under "
          "mpi without one nxd-elastic --stall-timeout ends the job) or "
          "`kill` (mpi: the rank's process dies by SIGKILL, as a lost node's would).",
          {"crash", "hang", "kill"}),
      // generation
      key("generation.prompt", K::string, "Q: What",
          "Prompt of the text sample printed after training."),
      key("generation.max_new_tokens", K::integer, 200, "Tokens to generate; 0 = no sample."),
      key("generation.temperature", K::number, 0.8, "Sampling temperature; 0 = greedy."),
      key("generation.top_k", K::integer, 40, "Sample among the k most likely tokens; 0 = all."),
  };
}

int64_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<int64_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string last_component(const std::string& k) {
  auto p = k.rfind('.');
  return p == std::string::npos ? k : k.substr(p + 1);
}

}  // namespace

const std::vector<KeySpec>& config_keys() {
  static const std::vector<KeySpec> reg = [] {
    std::vector<KeySpec> r = make_registry();
    for (KeySpec& k : alignment_keys()) r.push_back(std::move(k));
    return r;
  }();
  return reg;
}

const KeySpec* find_key(const std::string& k) {
  for (const auto& s : config_keys())
    if (s.key == k) return &s;
  return nullptr;
}

std::string nearest_key(const std::string& k) {
  std::string best;
  int64_t best_d = INT64_MAX;
  const std::string leaf = last_component(k);
  for (const auto& s : config_keys()) {
    // a right leaf under the wrong section ("trainer.seq_length") is a near miss too
    int64_t d = std::min(edit_distance(k, s.key), edit_distance(leaf, last_component(s.key)) + 1);
    if (s.key.compare(0, k.size(), k) == 0) d = std::min<int64_t>(d, 1);  // a truncated key
    if (d < best_d) best_d = d, best = s.key;
  }
  return best;
}

}  // namespace nxd::train_app
