// Reading a run's config: the table of every key (keys(): its name, kind, meaning, and how it is read and
// shown), the walk over a TOML file's tables that applies them, the --set overrides, and the errors that
// name a key and where it was written. The values' checks against each other are validate.cpp's.
// Read next: validate.cpp, then deepspeed_config.cpp and ecosystem.cpp (DeepSpeed's and accelerate's configs read into these keys).
#include "core/config/config.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include <fstream>

#include <filesystem>
#include <functional>
#include <sstream>
#include <toml++/toml.h>

#include "core/perf/hardware.h"
#include "core/tensor/device.h"
#include "core/util/error.h"
#include "core/util/nesting.h"

namespace distlab {

namespace {

enum class Kind { integer, real, boolean, string, int_list, string_list, string_or_number };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::string_or_number: return "string or number";
    case Kind::integer: return "integer";
    case Kind::real: return "number";
    case Kind::boolean: return "boolean";
    case Kind::string: return "string";
    case Kind::int_list: return "list of integers";
    case Kind::string_list: return "list of strings (or one string, comma-separated)";
  }
  return "?";
}

// A declared key: its type, and how to store a value of it into a RunConfig.
struct Key {
  const char* name;
  Kind kind;
  const char* doc;
  std::function<void(RunConfig&, const toml::node&)> set;
  std::function<std::string(const RunConfig&)> show;  // the default, for the reference
  // a key that takes one of a few names (CHOICE below): whether `name` is one, and what to say if not
  std::function<bool(const std::string&)> accepts = nullptr;
  std::string choices_hint = "";
};

template <class T>
T get_as(const toml::node& n);
template <>
int64_t get_as(const toml::node& n) { return *n.value<int64_t>(); }
template <>
double get_as(const toml::node& n) { return *n.value<double>(); }  // toml++ converts integers too
template <>
bool get_as(const toml::node& n) { return *n.value<bool>(); }
template <>
std::string get_as(const toml::node& n) {
  if (n.is_integer()) return std::to_string(*n.value<int64_t>());  // string_or_number keys
  if (n.is_floating_point()) return fmt::format("{}", *n.value<double>());
  return *n.value<std::string>();
}
template <>
std::vector<int64_t> get_as(const toml::node& n) {
  std::vector<int64_t> v;
  for (const auto& e : *n.as_array()) v.push_back(*e.value<int64_t>());
  return v;
}

// a list of names, or one string of them comma-separated (LLaMA-Factory's lora_target = "q_proj,v_proj")
template <>
std::vector<std::string> get_as(const toml::node& n) {
  std::vector<std::string> v;
  auto add = [&](const std::string& s) {
    size_t a = 0;
    while (a <= s.size()) {
      size_t b = s.find(',', a);
      if (b == std::string::npos) b = s.size();
      std::string w = s.substr(a, b - a);
      w.erase(0, w.find_first_not_of(" \t"));
      w.erase(w.find_last_not_of(" \t") + 1);
      if (!w.empty()) v.push_back(w);
      a = b + 1;
    }
  };
  if (n.is_string()) add(*n.value<std::string>());
  else
    for (const auto& e : *n.as_array()) add(*e.value<std::string>());
  return v;
}

std::string show(int64_t v) { return std::to_string(v); }
std::string show(uint64_t v) { return std::to_string(v); }
std::string show(double v) { return fmt::format("{}", v); }
std::string show(float v) { return fmt::format("{}", v); }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(const std::string& v) { return "\"" + v + "\""; }
std::string show(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", \"" : "\"") + v[i] + "\"";
  return s + "]";
}
std::string show(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

#define KEY(NAME, KIND, TYPE, FIELD, DOC)                                                             \
  Key {                                                                                              \
    NAME, KIND, DOC, [](RunConfig& c, const toml::node& n) { c.FIELD = static_cast<decltype(c.FIELD)>(get_as<TYPE>(n)); }, \
        [](const RunConfig& c) { return show(c.FIELD); }                                             \
  }

std::string show(Choice auto v) { return "\"" + std::string(name_of(v)) + "\""; }

// A key read into an enum (core/util/choice.h): a name it does not take fails here, at load, naming the key,
// where it was written and the names it takes (HINT: "" says just those).
#define CHOICE(NAME, FIELD, DOC, HINT)                                                                     \
  Key {                                                                                                   \
    NAME, Kind::string, DOC,                                                                              \
        [](RunConfig& c, const toml::node& n) { c.FIELD = *parse_choice<decltype(c.FIELD)>(get_as<std::string>(n)); }, \
        [](const RunConfig& c) { return show(c.FIELD); },                                                \
        [](const std::string& s) { return parse_choice<decltype(RunConfig{}.FIELD)>(s).has_value(); },     \
        std::string(HINT).empty() ? "use " + choice_list<decltype(RunConfig{}.FIELD)>() : std::string(HINT) \
  }

const std::vector<Key>& keys() {
  static const std::vector<Key> k = {
      KEY("model.name", Kind::string, std::string, model.name, "mlp | cifar_cnn | gpt | llama"),
      KEY("model.hidden", Kind::int_list, std::vector<int64_t>, model.hidden, "mlp: hidden layer sizes"),
      KEY("model.batchnorm", Kind::boolean, bool, model.batchnorm, "cifar_cnn: BatchNorm2d after each conv"),
      KEY("model.vocab_size", Kind::integer, int64_t, model.vocab_size, "gpt: vocabulary (0 = the data's)"),
      KEY("model.block_size", Kind::integer, int64_t, model.block_size, "gpt: longest sequence (position table rows)"),
      KEY("model.n_layer", Kind::integer, int64_t, model.n_layer, "gpt: transformer blocks"),
      KEY("model.n_head", Kind::integer, int64_t, model.n_head, "gpt: attention heads"),
      KEY("model.n_embd", Kind::integer, int64_t, model.n_embd, "gpt: model width C"),
      KEY("model.dropout", Kind::real, double, model.dropout, "gpt: dropout probability"),
      KEY("model.n_kv_head", Kind::integer, int64_t, model.n_kv_head, "llama: key/value heads, grouped-query attention (0 = n_head)"),
      KEY("model.intermediate_size", Kind::integer, int64_t, model.intermediate_size, "llama: the SwiGLU MLP's hidden size (0 = 2·4C/3 rounded up to 256)"),
      KEY("model.rope_theta", Kind::real, double, model.rope_theta, "llama: RoPE's base θ (Llama 2: 10000, Llama 3: 500000)"),
      KEY("model.rms_norm_eps", Kind::real, double, model.rms_norm_eps, "llama: RMSNorm's epsilon"),
      CHOICE("model.attention", model.attention,
             "gpt and llama: naive (the (B, heads, T, T) probabilities in memory) | flash (FlashAttention-2's tiles: log-sum-exps kept instead)", ""),
      KEY("data.name", Kind::string, std::string, data.name, "fashion-mnist | cifar10 | synthetic-images | tokens"),
      KEY("data.path", Kind::string, std::string, data.path, "folder with the data files (default: $DISTLAB_DATA, system folders)"),
      KEY("data.fallback", Kind::string, std::string, data.fallback, "cifar10 when missing: error | synthetic (a stand-in, said so)"),
      KEY("data.synthetic", Kind::boolean, bool, data.synthetic, "train on the named image set's synthetic stand-in on purpose"),
      KEY("data.synthetic_train", Kind::integer, int64_t, data.synthetic_train, "synthetic images in the train split"),
      KEY("data.synthetic_test", Kind::integer, int64_t, data.synthetic_test, "synthetic images in the test split"),
      KEY("data.seq_len", Kind::integer, int64_t, data.seq_len, "tokens: window length T"),
      KEY("data.text_file", Kind::string, std::string, data.text_file, "tokens: a text file read as bytes (\"\" = synthetic)"),
      KEY("data.synthetic_tokens", Kind::integer, int64_t, data.synthetic_tokens, "tokens: length of the synthetic stream"),
      KEY("data.vocab", Kind::integer, int64_t, data.vocab, "tokens: vocabulary of the synthetic stream"),
      KEY("data.corrupt", Kind::int_list, std::vector<int64_t>, data.corrupt, "train records whose inputs come out NaN: a corrupt record (lab 08's NaN case)"),
      KEY("data.exclude", Kind::int_list, std::vector<int64_t>, data.exclude, "train records left out (indices of the train split)"),
      KEY("data.check_finite", Kind::boolean, bool, data.check_finite, "check every batch's inputs for NaN/Inf and name the record"),
      KEY("train.micro_batch", Kind::integer, int64_t, train.micro_batch, "samples per rank per micro-step"),
      KEY("train.global_batch", Kind::integer, int64_t, train.global_batch, "if > 0: micro_batch = global_batch / (ranks x accum_steps)"),
      KEY("train.accum_steps", Kind::integer, int64_t, train.accum_steps, "micro-steps per optimizer step"),
      KEY("train.epochs", Kind::integer, int64_t, train.epochs, "epochs when train.steps = 0"),
      KEY("train.steps", Kind::integer, int64_t, train.steps, "optimizer steps (0 = from epochs)"),
      KEY("train.eval_every", Kind::integer, int64_t, train.eval_every, "evaluate every N steps (0 = at the end)"),
      KEY("train.eval_batches", Kind::integer, int64_t, train.eval_batches, "test batches per evaluation (0 = all)"),
      KEY("train.log_every", Kind::integer, int64_t, train.log_every, "progress line every N steps"),
      KEY("train.seed", Kind::integer, int64_t, train.seed, "seed of weights, shuffling, dropout and synthetic data"),
      KEY("train.threads", Kind::integer, int64_t, train.threads, "compute threads per rank (0 = cores / ranks)"),
      KEY("train.shuffle", Kind::boolean, bool, train.shuffle, "shuffle the train set every epoch"),
      KEY("train.drop_last", Kind::boolean, bool, train.drop_last, "drop the last short batch of an epoch"),
      KEY("train.sampler", Kind::string, std::string, train.sampler, "distributed | plain (every rank reads the whole set: the missing DistributedSampler)"),
      KEY("train.set_epoch", Kind::boolean, bool, train.set_epoch, "a new order every epoch (false: the forgotten sampler.set_epoch)"),
      KEY("train.device", Kind::string, std::string, train.device, "cpu | meta | cuda | cuda-sim"),
      CHOICE("train.activation_checkpointing", model.checkpointing,
             "none | selective (the attention probabilities recomputed in backward) | full (a block keeps its input, reruns its forward in backward) "
             "| selective_op (llama: torchtitan's op-level policy, every second matmul's output and the attention's kept)", ""),
      KEY("train.device_mem", Kind::string, std::string, train.device_mem, "simulated device memory: 16GiB or a profile (t4, a100-40g, a100-80g, h100, h200)"),
      CHOICE("optim.name", optim.name, "sgd | adamw", ""),
      KEY("optim.lr", Kind::real, double, optim.lr, "base learning rate"),
      KEY("optim.momentum", Kind::real, double, optim.momentum, "sgd: momentum"),
      KEY("optim.dampening", Kind::real, double, optim.dampening, "sgd: dampening"),
      KEY("optim.nesterov", Kind::boolean, bool, optim.nesterov, "sgd: Nesterov momentum"),
      KEY("optim.weight_decay", Kind::real, double, optim.weight_decay, "sgd: L2 added to the gradient; adamw: decoupled decay"),
      KEY("optim.beta1", Kind::real, double, optim.beta1, "adamw: beta1"),
      KEY("optim.beta2", Kind::real, double, optim.beta2, "adamw: beta2"),
      KEY("optim.eps", Kind::real, double, optim.eps, "adamw: eps"),
      KEY("optim.clip_grad_norm", Kind::real, double, optim.clip_grad_norm, "clip the global gradient norm (0 = off)"),
      CHOICE("optim.schedule", optim.schedule, "constant | step | cosine | linear (each after optim.warmup_steps of linear warmup)", ""),
      KEY("optim.warmup_steps", Kind::integer, int64_t, optim.warmup_steps, "linear warmup steps"),
      KEY("optim.step_size", Kind::integer, int64_t, optim.step_size, "step: steps between decays"),
      KEY("optim.gamma", Kind::real, double, optim.gamma, "step: decay factor"),
      KEY("optim.min_lr", Kind::real, double, optim.min_lr, "cosine, linear: final learning rate"),
      CHOICE("parallel.strategy", parallel.strategy, "none (one rank) | ddp | zero1 (optimizer state sharded) | zero2 (+ gradients) | zero3 (+ parameters) | fsdp", ""),
      CHOICE("parallel.ddp_mode", parallel.ddp_mode, "ddp: bucketed (overlapped with backward) | naive", ""),
      KEY("parallel.bucket_mb", Kind::real, double, parallel.bucket_mb, "DDP's (and ZeRO-1's) bucket size in MiB"),
      KEY("parallel.sync_batchnorm", Kind::boolean, bool, parallel.sync_batchnorm, "BatchNorm statistics over all ranks"),
      CHOICE("parallel.zero_reduce", parallel.zero_reduce, "zero1: reduce_scatter the gradient | all_reduce it, then slice", ""),
      KEY("parallel.prefetch", Kind::boolean, bool, parallel.prefetch, "zero3, fsdp: gather the next unit's parameters while this one computes"),
      KEY("parallel.forward_prefetch", Kind::boolean, bool, parallel.forward_prefetch,
          "zero3, fsdp: with parallel.prefetch, in forward too (PyTorch FSDP's forward_prefetch; false: backward only)"),
      KEY("parallel.prefetch_depth", Kind::integer, int64_t, parallel.prefetch_depth,
          "zero3, fsdp: with parallel.prefetch, how many units ahead are gathered (1: the next; each more holds one more unit whole)"),
      CHOICE("parallel.sharding", parallel.sharding, "fsdp: full_shard | shard_grad_op | no_shard", ""),
      KEY("parallel.wrap_min_params", Kind::integer, int64_t, parallel.wrap_min_params, "zero3, fsdp: size-based auto-wrap: units merge into flat vectors of at least this many parameters (0 = one per unit)"),
      CHOICE("parallel.offload", parallel.offload, "zero2, zero3, fsdp: none | cpu (shards and optimizer state in host memory)", ""),
      KEY("parallel.dp", Kind::integer, int64_t, parallel.dp, "data-parallel ranks (0 = the world / (cp x tp x pp)); the strategy above works over them (and over the cp ranks with them)"),
      KEY("parallel.tp", Kind::integer, int64_t, parallel.tp, "tensor-parallel ranks: a GPT's or Llama's heads, MLP and vocabulary split over them (Megatron-LM; consecutive ranks)"),
      KEY("parallel.sequence_parallel", Kind::boolean, bool, model.sequence_parallel, "tp > 1: Megatron's sequence parallelism: the residual stream, its LayerNorms and dropouts split by rows too (all-gather + reduce-scatter for each all-reduce)"),
      KEY("parallel.cp", Kind::integer, int64_t, parallel.cp, "context-parallel ranks: each holds 1/cp of every sequence (two chunks, load-balanced); attention goes round their ring (gpt, llama)"),
      KEY("parallel.pp", Kind::integer, int64_t, parallel.pp, "pipeline stages (1 = none): GPT's blocks split into pp stages on pp ranks"),
      KEY("parallel.micro_batches", Kind::integer, int64_t, parallel.micro_batches, "pp > 1: micro-batches per optimizer step, m >= pp (0 = 4 x pp); the batch is micro_batch x m x dp"),
      CHOICE("parallel.schedule", parallel.schedule, "pp > 1: 1f1b (warm-up, one forward one backward, cool-down) | gpipe (all forwards, then all backwards)", ""),
      KEY("parallel.pp_layers", Kind::int_list, std::vector<int64_t>, parallel.pp_layers, "pp > 1: blocks per stage, e.g. [3, 5] (empty: n_layer / pp each)"),
      KEY("dist.fake_world_size", Kind::integer, int64_t, dist.fake_world_size, "--device meta: plan one rank of a job of this many ranks (0 = off)"),
      KEY("dist.fake_ranks_per_node", Kind::integer, int64_t, dist.fake_ranks_per_node, "the fake world's ranks per node (0 = all on one node)"),
      CHOICE("dist.backend", dist.backend, "gloo | nccl (the strategy's collectives on the GPU: --device cuda)", "use gloo (host memory, any device) or nccl (GPU memory: --device cuda)"),
      KEY("dist.timeout_s", Kind::real, double, dist.timeout_s, "seconds before a collective some rank never joins fails"),
      KEY("precision.mode", Kind::string, std::string, precision.mode, "fp32 | bf16 | fp16: params, grads and activations (f32 master weights in the optimizer)"),
      KEY("precision.reduce_dtype", Kind::string, std::string, precision.reduce_dtype, "fp32 | bf16 | fp16: gradients on the wire when averaged across ranks (FSDP's reduce_dtype)"),
      KEY("precision.loss_scale", Kind::string_or_number, std::string, precision.loss_scale, "dynamic | none | a number (\"\" = dynamic for fp16, none otherwise)"),
      KEY("precision.init_scale", Kind::real, double, precision.init_scale, "dynamic: the first loss scale"),
      KEY("precision.growth_factor", Kind::real, double, precision.growth_factor, "dynamic: scale x this after growth_interval clean steps"),
      KEY("precision.backoff_factor", Kind::real, double, precision.backoff_factor, "dynamic: scale x this on an overflow"),
      KEY("precision.growth_interval", Kind::integer, int64_t, precision.growth_interval, "dynamic: clean steps between growths"),
      KEY("precision.hysteresis", Kind::integer, int64_t, precision.hysteresis, "dynamic: overflows skipped before the scale backs off (DeepSpeed)"),
      KEY("precision.min_scale", Kind::real, double, precision.min_scale, "dynamic: an overflow at this scale stops the run"),
      KEY("log.metrics", Kind::string, std::string, log.metrics, "JSON Lines metrics file (\"\" = none)"),
      KEY("log.profile", Kind::string, std::string, log.profile, "model step time on: t4-pcie, a100-nvlink, h100-nvlink, h100-96g, h100-pcie, h200, cpu, or a profile file (.json) of distlab bench calibrate"),
      KEY("log.calibrated", Kind::boolean, bool, log.calibrated, "false: model every kernel at the data sheet's peak (no calibration, no step overhead)"),
      CHOICE("log.kernels", log.kernels,
             "modeled kernels: fused (distlab's, one pass per op) | eager (PyTorch's op-by-op chains, and what their autograd keeps) | "
             "compiled (torch.compile on each transformer block, as torchtitan applies it: the loss and AdamW stay eager)", ""),
      KEY("log.fused_ops", Kind::string_list, std::vector<std::string>, log.fused_ops,
          "op families run fused all the same under eager or compiled (a Triton kernel the model calls, e.g. torchtitan's fused_rmsnorm): rmsnorm, rope, swiglu, loss, adamw"),
      KEY("log.trace", Kind::string, std::string, log.trace, "Chrome trace (Perfetto) of one step"),
      KEY("checkpoint.dir", Kind::string, std::string, checkpoint.dir, "folder of checkpoints, DIR/step-NNNNNN/ (\"\" = none)"),
      KEY("checkpoint.every", Kind::integer, int64_t, checkpoint.every, "save every N steps (0: at the end and on SIGTERM only)"),
      KEY("checkpoint.keep", Kind::integer, int64_t, checkpoint.keep, "complete checkpoints kept, newest first (0 = all)"),
      KEY("checkpoint.resume", Kind::string, std::string, checkpoint.resume, "auto (latest complete in dir) | never | a step folder"),
      KEY("checkpoint.disk_gbps", Kind::real, double, checkpoint.disk_gbps, "storage write bandwidth (GB/s per node) for the modeled save time"),
      KEY("log.trace_step", Kind::integer, int64_t, log.trace_step, "the step (1-based) that is traced and modeled"),
      KEY("lora.r", Kind::integer, int64_t, lora.r, "LoRA's rank: adapters on lora.target_modules, every other weight frozen (0 = off: full fine-tuning)"),
      KEY("lora.alpha", Kind::real, double, lora.alpha, "LoRA's lora_alpha: the adapter's output scaled by alpha / r (PEFT's default 8)"),
      KEY("lora.dropout", Kind::real, double, lora.dropout, "LoRA's lora_dropout on the adapter's input"),
      KEY("lora.target_modules", Kind::string_list, std::vector<std::string>, lora.target_modules,
          "Linear modules adapted, by name or last part: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (llama); c_attn, c_proj, c_fc (gpt); \"all-linear\" (empty: PEFT's default for the model)"),
      KEY("lora.use_rslora", Kind::boolean, bool, lora.use_rslora, "rank-stabilized LoRA: scale by alpha / sqrt(r) instead of alpha / r"),
      KEY("quantization.bits", Kind::integer, int64_t, quantization.bits, "the frozen base's bits: 0 (the compute dtype) | 4 (NF4: QLoRA, with lora.r > 0)"),
      KEY("quantization.type", Kind::string, std::string, quantization.type, "bnb_4bit_quant_type: nf4 (QLoRA's NormalFloat4)"),
      KEY("quantization.double_quant", Kind::boolean, bool, quantization.double_quant, "bnb_4bit_use_double_quant: the absmax constants quantized to 8 bits too (4.127 bits a weight, else 4.5)"),
  };
  return k;
}

const Key* find_key(const std::string& name) {
  for (const auto& k : keys())
    if (name == k.name) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> d(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) d[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t prev = d[0];
    d[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t cur = d[j];
      d[j] = std::min({d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1])});
      prev = cur;
    }
  }
  return d[b.size()];
}

std::string suggest(const std::string& name) {
  std::string best;
  size_t best_d = 4;
  for (const auto& k : keys()) {
    size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = k.name;
    }
  }
  return best.empty() ? "see `distlab train --help-config` for every key" : "did you mean '" + best + "'?";
}

bool kind_matches(Kind k, const toml::node& n) {
  switch (k) {
    case Kind::integer: return n.is_integer();
    case Kind::real: return n.is_integer() || n.is_floating_point();
    case Kind::boolean: return n.is_boolean();
    case Kind::string: return n.is_string();
    case Kind::string_or_number: return n.is_string() || n.is_integer() || n.is_floating_point();
    case Kind::int_list: {
      if (!n.is_array()) return false;
      for (const auto& e : *n.as_array())
        if (!e.is_integer()) return false;
      return true;
    }
    case Kind::string_list: {
      if (n.is_string()) return true;
      if (!n.is_array()) return false;
      for (const auto& e : *n.as_array())
        if (!e.is_string()) return false;
      return true;
    }
  }
  return false;
}

std::string where(const std::string& file, const toml::node& n) {
  return fmt::format("{}:{}", file, n.source().begin.line);
}

void apply(RunConfig& c, const std::string& name, const toml::node& n, const std::string& origin) {
  const Key* k = find_key(name);
  if (!k) throw ConfigError(fmt::format("{}: unknown key '{}'", origin, name), suggest(name));
  if (!kind_matches(k->kind, n))
    throw ConfigError(fmt::format("{}: {} must be {} {}", origin, name, k->kind == Kind::integer ? "an" : "a", kind_name(k->kind)),
                      fmt::format("{} = {} (default)", name, k->show(RunConfig{})));
  if (n.is_floating_point() && !std::isfinite(n.as_floating_point()->get()))
    throw ConfigError(fmt::format("{}: {} = {} is not a finite number", origin, name, n.as_floating_point()->get()),
                      fmt::format("{} = {} (default)", name, k->show(RunConfig{})));
  if (k->accepts && !k->accepts(get_as<std::string>(n)))
    throw ConfigError(fmt::format("{}: {} is '{}'", origin, name, get_as<std::string>(n)), k->choices_hint);
  // the seed is unsigned (the generators' state): -1 would silently become 18446744073709551615
  if (name == "train.seed" && n.is_integer() && n.as_integer()->get() < 0)
    throw ConfigError(fmt::format("{}: train.seed is {}, negative", origin, n.as_integer()->get()), "a seed is a number from 0 up (the default is 0)");
  k->set(c, n);
  c.origin[name] = origin;
}

// A key of a caller's section, kept as text: a string as it is, any other value as TOML writes it.
void keep_extra(RunConfig& c, const std::string& name, const toml::node& n, const std::string& origin) {
  if (const auto* str = n.as_string()) c.extra[name] = str->get();
  else {
    std::ostringstream os;
    n.visit([&](const auto& v) { os << v; });
    c.extra[name] = os.str();
  }
  c.origin[name] = origin;
}

const std::map<std::string, std::string>* extra_keys(const ConfigExtras& x, const std::string& section) {
  auto it = x.tables.find(section);
  return it == x.tables.end() ? nullptr : &it->second;
}

std::string key_list(const std::map<std::string, std::string>& keys) {
  std::string out;
  for (const auto& [k, doc] : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

void walk(RunConfig& c, const toml::table& t, const std::string& file, const ConfigExtras& extras) {
  for (const auto& [section, node] : t) {
    std::string s(section.str());
    if (node.is_array() && std::find(extras.ignored_arrays.begin(), extras.ignored_arrays.end(), s) != extras.ignored_arrays.end())
      continue;  // another program's list ([[check]]): not the run's
    if (const auto* keys = extra_keys(extras, s); keys && node.is_table()) {  // another program's table ([lab])
      c.extra_sections.push_back(s);
      for (const auto& [key, value] : *node.as_table()) {
        const std::string k(key.str());
        if (!keys->count(k))
          throw ConfigError(fmt::format("{}: unknown key '{}.{}'", where(file, value), s, k), fmt::format("[{}] holds {}", s, key_list(*keys)));
        keep_extra(c, s + "." + k, value, where(file, value));
      }
      continue;
    }
    if (node.is_array_of_tables())
      throw ConfigError(fmt::format("{}: unknown section [[{}]]", where(file, node), s),
                        "a run's sections: [model], [data], [train], [optim], [parallel], [dist], [precision], [log]");
    if (!node.is_table()) {
      throw ConfigError(fmt::format("{}: '{}' is outside any section", where(file, node), s),
                        "keys live in sections: [model], [data], [train], [optim], [parallel], [dist], [precision], [log]");
    }
    for (const auto& [key, value] : *node.as_table()) {
      std::string name = s + "." + std::string(key.str());
      if (value.is_table())
        throw ConfigError(fmt::format("{}: unknown section '{}'", where(file, value), name), suggest(name));
      apply(c, name, value, where(file, value));
    }
  }
}

// "--set train.steps=50": the value is parsed as TOML, falling back to a bare string.
void apply_setting(RunConfig& c, const std::string& name, const std::string& value, const std::string& origin);

void apply_override(RunConfig& c, const std::string& text, const ConfigExtras& extras) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("--set '{}': expected section.key=value", text), "for example --set train.steps=50");
  std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  const size_t dot = name.find('.');
  if (const auto* keys = dot == std::string::npos ? nullptr : extra_keys(extras, name.substr(0, dot))) {  // --set lab.plugin=...
    if (!keys->count(name.substr(dot + 1)))
      throw ConfigError(fmt::format("--set: unknown key '{}'", name), fmt::format("[{}] holds {}", name.substr(0, dot), key_list(*keys)));
    c.extra[name] = value;
    c.origin[name] = "--set " + name;
    return;
  }
  if (!find_key(name)) throw ConfigError(fmt::format("--set: unknown key '{}'", name), suggest(name));
  apply_setting(c, name, value, "--set " + name);
}

void apply_setting(RunConfig& c, const std::string& name, const std::string& value, const std::string& origin) {
  const Key* k = find_key(name);
  if (!k) throw ConfigError(fmt::format("{}: unknown key '{}'", origin, name), suggest(name));
  toml::table t;
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    t = toml::table{{"v", value}};  // a bare word such as adamw or 16GiB
  }
  if (k->kind == Kind::string && !t["v"].is_string()) t = toml::table{{"v", value}};
  if (k->kind == Kind::int_list && t["v"].is_integer()) t = toml::table{{"v", toml::array{*t["v"].value<int64_t>()}}};
  apply(c, name, *t.get("v"), origin);
}

RunConfig finish(toml::table t, const std::string& name, const std::vector<std::string>& overrides,
                 const std::vector<SourcedSetting>& from_files, const ConfigExtras& extras) {
  RunConfig c;
  c.source = name;
  walk(c, t, name, extras);
  for (const auto& s : from_files) apply_setting(c, s.key, s.value, s.origin);
  for (const auto& o : overrides) apply_override(c, o, extras);
  validate_config(c);
  return c;
}

}  // namespace

RunConfig parse_config(const std::string& text, const std::string& name, const std::vector<std::string>& overrides,
                       const std::vector<SourcedSetting>& from_files, const ConfigExtras& extras) {
  check_nesting(text, name);  // before the parser: it recurses once per level
  toml::table t;
  try {
    t = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", name, e.source().begin.line, e.source().begin.column, e.description()),
                      "the file is not valid TOML");
  }
  return finish(std::move(t), name, overrides, from_files, extras);
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides, const std::vector<SourcedSetting>& from_files,
                      const ConfigExtras& extras) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(fmt::format("config file '{}' does not exist", path), "check the path: configs/ has examples");
  if (!std::filesystem::is_regular_file(path, ec))
    throw ConfigError(fmt::format("config file '{}' is not a regular file (a folder or a device?)", path),
                      "give a .toml file: configs/ has examples");
  if (std::filesystem::file_size(path, ec) > (16u << 20))
    throw ConfigError(fmt::format("config file '{}' is larger than 16 MiB", path), "a config is a few lines of TOML");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("config file '{}' cannot be read", path), "check the path: configs/ has examples");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check_nesting(text, path);  // before the parser: it recurses once per level
  toml::table t;
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column, e.description()),
                      "the file is not valid TOML");
  }
  if (t.empty())  // an empty file (or comments only) would train the default model without a word
    throw ConfigError(fmt::format("config file '{}' sets nothing (no section, no key)", path),
                      "a run's config names at least its model and data: start from one in configs/");
  return finish(std::move(t), path, overrides, from_files, extras);
}

// A caller's value as a TOML string, the way the engine's string keys show
static std::string quoted(const std::string& v) {
  std::string out = "\"";
  for (char ch : v) out += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
  return out + "\"";
}

std::string config_fingerprint(const RunConfig& c) {
  std::string s;
  for (const auto& k : keys())
    if (std::string(k.name) != "log.metrics" && std::string(k.name) != "log.trace") s += std::string(k.name) + "=" + k.show(c) + "\n";
  for (const auto& [k, v] : c.extra) s += k + "=" + quoted(v) + "\n";
  return s;
}

std::map<std::string, std::string> config_values(const RunConfig& c) {
  std::map<std::string, std::string> m;
  for (const auto& k : keys()) m[k.name] = k.show(c);
  for (const auto& [k, v] : c.extra) m[k] = quoted(v);  // as a string key shows: "x.so"
  return m;
}

std::string config_reference(const ConfigExtras& extras) {
  std::string s;
  RunConfig def;
  for (const auto& k : keys()) s += fmt::format("  {:<24} {:<16} {:<14} {}\n", k.name, kind_name(k.kind), k.show(def), k.doc);
  for (const auto& [section, keys] : extras.tables)
    for (const auto& [k, doc] : keys) s += fmt::format("  {:<24} {:<16} {:<14} {}\n", section + "." + k, "string", "\"\"", doc);
  return s;
}

}  // namespace distlab
