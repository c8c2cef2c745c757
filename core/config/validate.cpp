// A run config's values checked against each other, after every file and --set has been applied
// (config.cpp's parse_config and load_config call validate_config last): each refusal is a ConfigError
// naming the key, where it was set (a file's line, a --set, or the default) and a hint. The upper bounds
// refuse only what would otherwise crash or wait forever. Read next: config.h's RunConfig, whose fields
// these are.
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

#include "core/config/config.h"
#include "core/perf/hardware.h"
#include "core/tensor/device.h"
#include "core/util/error.h"

namespace distlab {

namespace {

void require(bool ok, const RunConfig& c, const std::string& key, const std::string& problem, const std::string& hint) {
  if (ok) return;
  auto it = c.origin.find(key);
  std::string at = it == c.origin.end() ? "default" : it->second;
  throw ConfigError(fmt::format("{}: {} {}", at, key, problem), hint);
}

// Upper bounds: a value past them is a typo or an attack, never a run this machine could do. They are
// far above any course run (and above what 24 GiB holds), so they refuse only what would otherwise crash
// (a thread pool of 100000, a bad_alloc) or wait forever.
void at_most(const RunConfig& c, const std::string& key, double v, double max, const std::string& why) {
  require(v <= max, c, key, fmt::format("= {} is over the limit of {}", v, max), why);
}

void validate_bounds(const RunConfig& c) {
  for (auto h : c.model.hidden) at_most(c, "model.hidden", double(h), 1 << 20, "a hidden size over a million is a typo");
  at_most(c, "model.n_layer", double(c.model.n_layer), 4096, "");
  at_most(c, "lora.r", double(c.lora.r), 1 << 16, "LoRA's ranks are 4 to 256");
  at_most(c, "model.n_embd", double(c.model.n_embd), 1 << 16, "");
  at_most(c, "model.block_size", double(c.model.block_size), 1 << 20, "");
  at_most(c, "model.vocab_size", double(c.model.vocab_size), 1 << 24, "");
  require(c.model.vocab_size >= 0, c, "model.vocab_size", "must not be negative", "0 takes the data's vocabulary");
  at_most(c, "data.synthetic_train", double(c.data.synthetic_train), 1e6, "a million synthetic images is 3 GiB; use real data for more");
  at_most(c, "data.synthetic_test", double(c.data.synthetic_test), 1e6, "");
  at_most(c, "data.synthetic_tokens", double(c.data.synthetic_tokens), 1e9, "");
  require(c.data.synthetic_tokens >= 2, c, "data.synthetic_tokens", "must be at least 2", "");
  at_most(c, "data.vocab", double(c.data.vocab), 1 << 24, "");
  at_most(c, "data.seq_len", double(c.data.seq_len), 1 << 20, "");
  at_most(c, "train.micro_batch", double(c.train.micro_batch), 1 << 20, "");
  at_most(c, "train.global_batch", double(c.train.global_batch), 1 << 24, "");
  at_most(c, "train.accum_steps", double(c.train.accum_steps), 1 << 16, "");
  at_most(c, "train.steps", double(c.train.steps), 1e9, "");
  at_most(c, "train.epochs", double(c.train.epochs), 1e6, "");
  at_most(c, "train.threads", double(c.train.threads), 1024, "more compute threads than any machine has cores only slows a rank down");
  require(c.optim.gamma > 0, c, "optim.gamma", "must be positive", "the step schedule multiplies the lr by gamma");
  require(c.optim.min_lr >= 0, c, "optim.min_lr", "must not be negative", "");
  require(c.optim.weight_decay >= 0, c, "optim.weight_decay", "must not be negative", "");
  require(c.optim.dampening >= 0 && c.optim.dampening <= 1, c, "optim.dampening", "must be in [0, 1]", "");
  at_most(c, "optim.warmup_steps", double(c.optim.warmup_steps), 1e9, "");
  at_most(c, "dist.timeout_s", c.dist.timeout_s, 7 * 24 * 3600.0, "a week; a collective that takes longer has hung");
  at_most(c, "parallel.bucket_mb", c.parallel.bucket_mb, 1 << 16, "");
  at_most(c, "precision.growth_factor", c.precision.growth_factor, 1 << 16, "");
  at_most(c, "precision.growth_interval", double(c.precision.growth_interval), 1e9, "");
  at_most(c, "precision.hysteresis", double(c.precision.hysteresis), 1e6, "");
}

}  // namespace

void validate_config(const RunConfig& c) {
  require(c.model.name == "mlp" || c.model.name == "cifar_cnn" || c.model.name == "gpt" || c.model.name == "llama", c, "model.name",
          "is '" + c.model.name + "'", "use mlp, cifar_cnn, gpt or llama");
  require(c.model.n_kv_head >= 0, c, "model.n_kv_head", "must not be negative", "0 takes model.n_head (no grouping)");
  require(c.model.intermediate_size >= 0, c, "model.intermediate_size", "must not be negative", "0 takes 2·4C/3 rounded up to 256");
  require(c.model.rope_theta > 1, c, "model.rope_theta", "must be above 1", "Llama 2 uses 10000, Llama 3 500000");
  require(c.model.rms_norm_eps > 0, c, "model.rms_norm_eps", "must be positive", "Llama uses 1e-5 (or 1e-6)");
  for (auto h : c.model.hidden) require(h > 0, c, "model.hidden", "has a size <= 0", "every hidden size must be positive");
  require(c.model.n_layer >= 1, c, "model.n_layer", "must be at least 1", "");
  require(c.model.n_embd >= 1, c, "model.n_embd", "must be at least 1", "");
  require(c.model.n_head >= 1 && c.model.n_embd % c.model.n_head == 0, c, "model.n_head",
          fmt::format("= {} does not divide model.n_embd = {}", c.model.n_head, c.model.n_embd),
          "the head size n_embd / n_head must be a whole number");
  require(c.model.block_size >= 1, c, "model.block_size", "must be at least 1", "");
  require(c.model.dropout >= 0 && c.model.dropout < 1, c, "model.dropout", "must be in [0, 1)", "");
  eager_ops_for(c.log.kernels, c.log.fused_ops);  // an unknown family is a ConfigError naming log.fused_ops
  require(c.lora.r >= 0, c, "lora.r", "must not be negative", "0 turns LoRA off; PEFT's usual ranks are 8 to 64");
  require(c.lora.alpha > 0, c, "lora.alpha", "must be positive", "PEFT's default is 8; alpha = 2r is common");
  require(c.lora.dropout >= 0 && c.lora.dropout < 1, c, "lora.dropout", "must be in [0, 1)", "");
  require(c.quantization.bits == 0 || c.quantization.bits == 4, c, "quantization.bits", fmt::format("= {}: 0 or 4", c.quantization.bits),
          "4 stores the frozen base in NF4 (QLoRA); bitsandbytes' 8-bit LLM.int8() is not in the engine");
  require(c.quantization.type == "nf4", c, "quantization.type", "is '" + c.quantization.type + "'", "nf4 is the one 4-bit type here (QLoRA's); bitsandbytes' fp4 is not");
  require(!c.quantization.on() || c.lora.on(), c, "quantization.bits", "= 4 with lora.r = 0: a 4-bit base is frozen, so nothing would train",
          "set lora.r (QLoRA: 4-bit base, 16-bit adapters), or quantization.bits = 0 for full fine-tuning");
  require(c.data.fallback == "synthetic" || c.data.fallback == "error", c, "data.fallback",
          "is '" + c.data.fallback + "'", "use synthetic or error");
  require(c.data.seq_len >= 1, c, "data.seq_len", "must be at least 1", "");
  require(c.data.synthetic_train >= 1 && c.data.synthetic_test >= 1, c, "data.synthetic_train", "and data.synthetic_test must be positive", "");
  require(c.data.vocab >= 2, c, "data.vocab", "must be at least 2", "");
  require(c.train.micro_batch >= 1, c, "train.micro_batch", fmt::format("= {} must be at least 1", c.train.micro_batch), "");
  require(c.train.global_batch >= 0, c, "train.global_batch", "must not be negative", "0 means: use train.micro_batch");
  require(c.train.accum_steps >= 1, c, "train.accum_steps", "must be at least 1", "");
  require(c.train.steps >= 0, c, "train.steps", "must not be negative", "0 means: run train.epochs epochs");
  require(c.train.epochs >= 1 || c.train.steps > 0, c, "train.epochs", "must be at least 1 when train.steps = 0", "");
  require(c.train.log_every >= 1, c, "train.log_every", "must be at least 1", "");
  require(c.train.eval_every >= 0 && c.train.eval_batches >= 0, c, "train.eval_every", "and train.eval_batches must not be negative", "");
  require(c.train.threads >= 0, c, "train.threads", "must not be negative", "0 picks cores / ranks");
  require(c.train.sampler == "distributed" || c.train.sampler == "plain", c, "train.sampler", "is '" + c.train.sampler + "'",
          "use distributed (each rank its 1/N of the data) or plain (every rank the whole set: the bug)");
  {
    std::string why;
    const bool known = c.train.device == "cpu" || c.train.device == "meta" || c.train.device == "cuda-sim";
    const bool gpu = !known && c.train.device == "cuda" && cuda_usable(&why);  // before `why` is read below
    require(known || gpu, c, "train.device",
            c.train.device == "cuda" ? "is 'cuda', but this build or machine cannot train on a GPU (cuda: " + why + ")"
                                     : "is '" + c.train.device + "'",
            "use cpu (real numbers), meta (shapes, memory and FLOPs only), cuda (a GPU) or cuda-sim (the GPU's code path on "
            "the CPU, for checking it without one)");
  }
  require(c.dist.backend == CommBackend::gloo || c.train.device == "cuda" || c.train.device == "cuda-sim", c, "dist.backend",
          "is nccl on device " + c.train.device + ": NCCL moves GPU memory", "use dist.backend = \"gloo\", or --device cuda");
  require(c.dist.backend == CommBackend::gloo || c.parallel.strategy != StrategyKind::ddp || c.parallel.ddp_mode == DdpMode::bucketed, c,
          "dist.backend", "is nccl with parallel.ddp_mode naive: the NCCL path all-reduces DDP's buckets (naive DDP "
          "reduces each gradient through the host)", "use parallel.ddp_mode = \"bucketed\"");
  if (!c.train.device_mem.empty()) {
    try {
      require(parse_device_memory(c.train.device_mem, "train.device_mem") > 0, c, "train.device_mem", "must be positive", "");
    } catch (const ConfigError& e) {
      auto it = c.origin.find("train.device_mem");
      throw ConfigError((it == c.origin.end() ? std::string("default") : it->second) + ": " + e.what(), e.hint());
    }
  }
  require(c.optim.lr >= 0, c, "optim.lr", "must not be negative", "");
  require(c.optim.momentum >= 0 && c.optim.momentum < 1, c, "optim.momentum", "must be in [0, 1)", "");
  require(!c.optim.nesterov || (c.optim.momentum > 0 && c.optim.dampening == 0), c, "optim.nesterov",
          "needs momentum > 0 and dampening = 0", "as torch.optim.SGD requires");
  require(c.optim.beta1 >= 0 && c.optim.beta1 < 1 && c.optim.beta2 >= 0 && c.optim.beta2 < 1, c, "optim.beta1",
          "and optim.beta2 must be in [0, 1)", "");
  require(c.optim.eps > 0, c, "optim.eps", "must be positive", "");
  require(c.optim.clip_grad_norm >= 0, c, "optim.clip_grad_norm", "must not be negative", "0 turns clipping off");
  require(c.optim.warmup_steps >= 0, c, "optim.warmup_steps", "must not be negative", "");
  require(c.optim.step_size >= 1, c, "optim.step_size", "must be at least 1", "");
  require(c.precision.reduce_dtype == "fp32" || c.precision.reduce_dtype == "bf16" || c.precision.reduce_dtype == "fp16", c,
          "precision.reduce_dtype", "is '" + c.precision.reduce_dtype + "'", "use fp32 (the default), bf16 or fp16");
  require(c.parallel.dp >= 0, c, "parallel.dp", "must not be negative", "0 leaves it to the world size");
  require(c.parallel.tp >= 1, c, "parallel.tp", "must be at least 1", "1 keeps every layer whole");
  require(c.parallel.pp >= 1, c, "parallel.pp", "must be at least 1", "1 keeps the model in one stage");
  at_most(c, "parallel.tp", c.parallel.tp, 1 << 16, "");
  at_most(c, "parallel.pp", c.parallel.pp, 1 << 16, "");
  require(c.parallel.micro_batches >= 0, c, "parallel.micro_batches", "must not be negative", "0 takes 4 x parallel.pp");
  at_most(c, "parallel.micro_batches", c.parallel.micro_batches, 1 << 16, "");
  require(c.parallel.pp == 1 || c.train.accum_steps == 1, c, "train.accum_steps",
          fmt::format("is {} with parallel.pp {}", c.train.accum_steps, c.parallel.pp),
          "under pipeline parallelism the micro-batches are the accumulation: set parallel.micro_batches instead");
  require(c.parallel.tp == 1 || c.model.name == "gpt" || c.model.name == "llama", c, "parallel.tp",
          fmt::format("is {} with model.name {}", c.parallel.tp, c.model.name),
          "tensor parallel splits a language model's heads, MLP and vocabulary: use gpt or llama, or parallel.tp = 1");
  require(c.parallel.cp >= 1, c, "parallel.cp", "must be at least 1", "1 keeps every sequence whole on its rank");
  at_most(c, "parallel.cp", c.parallel.cp, 1 << 16, "");
  require(c.parallel.cp == 1 || c.model.name == "gpt" || c.model.name == "llama", c, "parallel.cp",
          fmt::format("is {} with model.name {}", c.parallel.cp, c.model.name),
          "context parallel splits a language model's sequences: use gpt or llama, or parallel.cp = 1");
  require(c.parallel.cp == 1 || c.data.seq_len % (2 * c.parallel.cp) == 0, c, "parallel.cp",
          fmt::format("is {} with data.seq_len {}: the sequence cuts into 2 x cp = {} equal chunks (each rank holds an early and a late one)",
                      c.parallel.cp, c.data.seq_len, 2 * c.parallel.cp),
          "choose data.seq_len divisible by 2 x parallel.cp");
  require(!c.model.sequence_parallel || c.parallel.tp > 1, c, "parallel.sequence_parallel", "is true with parallel.tp 1",
          "it splits by rows what tensor parallelism leaves whole on every rank: set parallel.tp > 1");
  require(!c.model.sequence_parallel || c.model.checkpointing != Checkpointing::selective_op, c, "parallel.sequence_parallel",
          "is true with train.activation_checkpointing = selective_op",
          "the op-level recompute reads the gathered inputs it no longer keeps: use full or selective checkpointing with sequence parallelism");
  require(!c.model.sequence_parallel || c.lora.r == 0, c, "parallel.sequence_parallel", "is true with lora.r > 0",
          "LoRA's adapters split with tensor parallelism, not yet with sequence parallelism: set one of them off");
  require(c.parallel.wrap_min_params >= 0, c, "parallel.wrap_min_params", "must not be negative", "0 gives every unit its own flat vector");
  require(c.parallel.prefetch_depth >= 1 && c.parallel.prefetch_depth <= 64, c, "parallel.prefetch_depth", "must be 1..64",
          "1 gathers the next unit while this one computes; k the next k (each holds one more unit whole)");
  require(c.checkpoint.every >= 0, c, "checkpoint.every", "must not be negative", "0 saves at the end (and on SIGTERM) only");
  require(c.checkpoint.keep >= 0, c, "checkpoint.keep", "must not be negative", "0 keeps every checkpoint");
  require(c.checkpoint.disk_gbps > 0, c, "checkpoint.disk_gbps", "must be positive", "an NVMe drive writes about 2 GB/s");
  require(c.checkpoint.resume == "auto" || c.checkpoint.resume == "never" || !c.checkpoint.resume.empty(), c, "checkpoint.resume",
          "is empty", "use auto, never or the path of a step folder (DIR/step-000100)");
  require(!c.checkpoint.dir.empty() || c.checkpoint.every == 0, c, "checkpoint.every", "is set but checkpoint.dir is not",
          "name the folder: --set checkpoint.dir=ckpt");
  require(c.dist.fake_world_size >= 0, c, "dist.fake_world_size", "must not be negative", "0 turns the fake world off");
  at_most(c, "dist.fake_world_size", double(c.dist.fake_world_size), 1 << 20, "");
  require(c.dist.fake_ranks_per_node >= 0, c, "dist.fake_ranks_per_node", "must not be negative", "0 puts every rank on one node");
  require(c.dist.timeout_s >= 1, c, "dist.timeout_s", fmt::format("is {} s, under a second", c.dist.timeout_s),
          "it bounds every collective and the rendezvous itself: below a second a healthy run fails (its default is 300)");
  require(c.log.trace_step >= 1, c, "log.trace_step", "must be at least 1", "");
  if (!c.log.profile.empty()) {
    std::optional<HardwareProfile> hw;
    std::string bad_file;  // a profile file that could not be read or holds a bad key
    try {
      hw = find_profile(c.log.profile);
    } catch (const ConfigError& e) {
      bad_file = e.what();
    }
    require(hw && hw->has_cost_model(), c, "log.profile",
            bad_file.empty() ? "is '" + c.log.profile + "', not a profile with a cost model" : "is '" + c.log.profile + "': " + bad_file,
            "use one of: " + profile_names(true) + ", or a file of distlab bench calibrate (.json)");
  }
  require(c.parallel.bucket_mb * (1 << 20) >= 4, c, "parallel.bucket_mb", fmt::format("is {:g} MiB, less than one float (4 bytes)", c.parallel.bucket_mb),
          "DDP's default is 25 (MiB); a bucket holds at least one gradient element");
  const PrecisionOptions& p = c.precision;
  require(p.mode == "fp32" || p.mode == "bf16" || p.mode == "fp16", c, "precision.mode", "is '" + p.mode + "'",
          "use fp32, bf16 or fp16");
  const std::string ls = p.effective_loss_scale();
  if (ls != "dynamic" && ls != "none") {
    char* end = nullptr;
    const double v = std::strtod(ls.c_str(), &end);
    require(end && *end == 0 && !ls.empty() && std::isfinite(v) && v > 0, c, "precision.loss_scale", "is '" + ls + "'",
            "use dynamic, none, or a positive number such as 1024 (a static scale)");
  }
  require(p.init_scale > 0, c, "precision.init_scale", "must be positive", "65536 = 2^16 is GradScaler's default");
  require(p.growth_factor > 1, c, "precision.growth_factor", "must be greater than 1", "2 is GradScaler's default");
  require(p.backoff_factor > 0 && p.backoff_factor < 1, c, "precision.backoff_factor", "must be in (0, 1)", "0.5 is GradScaler's default");
  require(p.growth_interval >= 1, c, "precision.growth_interval", "must be at least 1", "2000 is GradScaler's default");
  require(p.hysteresis >= 1, c, "precision.hysteresis", "must be at least 1", "1 backs off on every overflow, as GradScaler");
  require(p.min_scale > 0 && p.min_scale <= p.init_scale, c, "precision.min_scale", "must be in (0, init_scale]", "1 is DeepSpeed's default");
  at_most(c, "precision.init_scale", p.init_scale, 1e30, "");
  validate_bounds(c);
}

}  // namespace distlab
