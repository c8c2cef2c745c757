// `distlab plan`: which strategy fits a model on N GPUs, and what one step costs. Every row is a run of
// the engine itself — one meta rank of the N-rank job on the fake world (dist.fake_world_size: a process
// group that moves no data but counts and traces every collective), two steps, the second replayed on the
// hardware profile — not a separate formula. A row fits when the caching allocator's reserved bytes fit the
// card less a stated margin, and an offload row's host memory fits the node (--host-mem). The
// recommendation is the fastest row that fits (a tie within 1 %: the one holding less memory), with why.
// Beside it, the course's decision tree: the cheapest rung that fits — DDP, else ZeRO-2, else ZeRO-3/FSDP,
// else + activation checkpointing (selective, then full), else + CPU offload (then with full checkpointing
// too) — which lab 09 asks students to apply by hand. --finetune lora adds the tree's first answer: LoRA rows
// (the engine's own adapters, core/nn/lora.h: a frozen 16-bit base) on one GPU and over all of them, and the
// tree asks after "does a full replica fit?" whether LoRA fits one card: then no distributed training.
// Over several GPUs LoRA also gets FSDP rows: the frozen base sharded beside the adapters.
// --finetune qlora adds QLoRA's rows beside LoRA's (the same adapters on an NF4 base, core/nn/qlora.h: 4.127
// bits a frozen weight) and the tree's next question: does it fit in 4 bits?
// Read next: core/parallel/zero3.h (what the sharded rows do), core/perf/cost_model.h (the step time).
#include "cli/plan_cmd.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <toml++/toml.h>

#include "core/perf/hardware.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "core/util/read_file.h"
#include "core/util/units.h"
#include "grader/bridge/lab_extension.h"

namespace distlab {

namespace {

struct PlanArgs {
  std::string model = "gpt-7b", gpu_mem = "a100-80g", profile, precision = "bf16", optimizer = "adamw", host_mem, finetune = "full";
  int gpus = 8, nodes = 1;
  int64_t lora_r = 16;
  int64_t micro_batch = 1, seq = 0;
  bool json = false;
  std::vector<std::string> sets;
};

// GPT-2-shaped stand-ins for the sizes the course talks about: 12·L·C² + V·C + T·C parameters. LLaMA's
// 7B/13B/70B use SwiGLU and GQA at 32/40/80 layers; ours keep GPT's 4x MLP, and their layer counts are
// chosen so that the totals are the names' sizes: 6.99B (112 GB of model state, the course's number for a
// 7B full fine-tune), 13.1B, 69.6B.
struct Preset {
  const char* name;
  int64_t layers, width, heads, vocab, block;
};
constexpr Preset kPresets[] = {
    {"gpt-1b", 18, 2048, 16, 50257, 1024},
    {"gpt-7b", 34, 4096, 32, 32000, 2048},
    {"gpt-13b", 41, 5120, 40, 32000, 2048},
    {"gpt-70b", 86, 8192, 64, 32000, 4096},
};

// Meta's Llama 3 shapes (the models' config.json on Hugging Face; Grattafiori et al. 2024, table 3):
// 8,030,261,248 and 70,553,706,496 parameters, exactly as published. Llama 3.1's RoPE scaling (for 128K
// contexts) is left out: at 8,192 tokens it changes no shape and no FLOP.
struct LlamaPreset {
  const char* name;
  int64_t layers, width, heads, kv_heads, intermediate, vocab, block;
  double rope_theta;
};
constexpr LlamaPreset kLlamaPresets[] = {
    {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0},
    {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0},
};

std::string model_toml(const PlanArgs& a, std::string& label) {
  for (const LlamaPreset& p : kLlamaPresets)
    if (a.model == p.name) {
      label = a.model;
      return fmt::format("[model]\nname = \"llama\"\nvocab_size = {}\nblock_size = {}\nn_layer = {}\nn_head = {}\nn_kv_head = {}\n"
                         "n_embd = {}\nintermediate_size = {}\nrope_theta = {:.1f}\nattention = \"flash\"\n"
                         "[data]\nname = \"tokens\"\nseq_len = {}\nvocab = {}\n[optim]\nname = \"adamw\"\n",
                         // RoPE has no table of positions: --seq sets the context (Llama 3.1's long-context stage: 128k)
                         p.vocab, std::max<int64_t>(p.block, a.seq), p.layers, p.heads, p.kv_heads, p.width, p.intermediate, p.rope_theta,
                         a.seq > 0 ? a.seq : p.block, p.vocab);
    }
  std::string name = a.model.rfind("gpt-", 0) == 0 ? a.model : "gpt-" + a.model;
  for (const Preset& p : kPresets)
    if (name == p.name) {
      label = name;
      return fmt::format("[model]\nname = \"gpt\"\nvocab_size = {}\nblock_size = {}\nn_layer = {}\nn_head = {}\nn_embd = {}\n"
                         "[data]\nname = \"tokens\"\nseq_len = {}\nvocab = {}\n[optim]\nname = \"adamw\"\n",
                         p.vocab, p.block, p.layers, p.heads, p.width, a.seq > 0 ? a.seq : p.block, p.vocab);
    }
  label = a.model;  // a config file: a regular file (not a FIFO, a device or a folder) with a [model] table
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  for (const LlamaPreset& p : kLlamaPresets) names += std::string(", ") + p.name;
  std::vector<uint8_t> bytes;
  try {
    bytes = read_regular_file(a.model, 16 << 20, "--model's config file");
  } catch (const IoError& e) {
    throw ConfigError(fmt::format("--model {}: neither a preset nor a readable config file ({})", a.model, e.what()),
                      "use " + names + " or a TOML path");
  }
  std::string text(bytes.begin(), bytes.end());
  toml::table t;
  try {
    t = toml::parse(text, a.model);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("--model {}: not a TOML config ({})", a.model, e.description()), "use " + names + " or a TOML path");
  }
  if (!t["model"].is_table())
    throw ConfigError(fmt::format("--model {}: the file has no [model] table: there is no model to plan", a.model),
                      "a run config (configs/gpt-1b.toml) or a preset: " + names);
  return text;
}

// --gpu-mem t4 | a100-80g | h100 | 16GiB -> the link-aware profile the step is modeled on
std::string profile_for(const PlanArgs& a) {
  if (!a.profile.empty()) return a.profile;
  const std::string& m = a.gpu_mem;
  if (m == "t4") return "t4-pcie";
  if (m.rfind("a100", 0) == 0) return "a100-nvlink";
  if (m == "h100") return "h100-nvlink";
  if (auto p = find_profile(m); p && p->has_cost_model()) return m;
  return "a100-nvlink";
}

struct PlanRow {
  std::string label, strategy;
  std::vector<std::string> sets;
  std::string finetune = "full";  // lora: adapters on a frozen 16-bit base; qlora: on a 4-bit one
  nlohmann::json summary;
  double device_bytes = 0;         // reserved by the caching allocator at the peak, per GPU
  double host_bytes_per_node = 0;  // what offload keeps in host memory, all the node's ranks together
  bool fits_device = false, fits_host = false, fits = false;
};

// What "fits" means, with its margins stated (printed above the table).
struct FitRule {
  double device_limit = 0, margin = 0;
  std::string margin_why;
  double host_limit = 0;
  std::string host_why;
};

// The device: outside PyTorch's allocator a process holds its CUDA context and the libraries' workspaces
// (≈0.5 GiB context with lazy module loading, NCCL's channel buffers, cuBLAS(Lt) workspaces: 1 GiB in all),
// and a run sees allocation patterns the planned step does not (a longer last batch, the evaluation, a
// checkpoint's staging): 5 % of the card. The host: the OS, the data loader's workers and the page cache keep
// a share, and offloaded state is pinned (it cannot be swapped out): 80 % of the node is usable.
constexpr double kContextBytes = double(1LL << 30), kHeadroom = 0.05, kHostUsable = 0.80;
FitRule fit_rule(int64_t capacity, int64_t host_mem_per_node, int ranks_per_node) {
  FitRule f;
  f.margin = kContextBytes + kHeadroom * double(capacity);
  f.device_limit = double(capacity) - f.margin;
  f.margin_why = "1 GiB for the CUDA context, NCCL and cuBLAS outside the allocator, 5 % headroom";
  f.host_limit = kHostUsable * double(host_mem_per_node);
  f.host_why = fmt::format("80 % of {} for {} rank(s): the OS, data loaders and page cache keep the rest, offloaded state is pinned",
                           format_bytes(double(host_mem_per_node)), ranks_per_node);
  return f;
}

// A row's memory per GPU as the caching allocator reserves it (the tensors' peak when the run has no model of it)
double device_bytes(const nlohmann::json& summary) {
  return summary.contains("peak_memory_reserved") ? summary["peak_memory_reserved"].get<double>() : summary["peak_memory_total"].get<double>();
}
double step_s(const PlanRow& r) { return r.summary.value("modeled_step_s", 0.0); }
constexpr double kTie = 0.01;  // rows within 1 % of each other's modeled step are as fast

// Why the fastest fitting row: its step and memory, and what the runner-up and the rows that do not fit cost.
std::string fastest_reason(const std::vector<PlanRow>& rows, const PlanRow& best, const FitRule& fit) {
  std::string why = fmt::format("the fastest row that fits: {:.1f} ms a step, {} reserved per GPU", 1e3 * step_s(best), format_bytes(best.device_bytes));
  if (best.host_bytes_per_node > 0)
    why += fmt::format(" and {} of host memory a node (usable: {}; --host-mem if the nodes have less)", format_bytes(best.host_bytes_per_node),
                       format_bytes(fit.host_limit));
  const PlanRow* next = nullptr;
  for (const PlanRow& r : rows)
    if (r.fits && &r != &best && (!next || step_s(r) < step_s(*next))) next = &r;
  if (next) {
    const double slower = 100 * (step_s(*next) / step_s(best) - 1);
    why += std::abs(slower) <= 100 * kTie
               ? (next->device_bytes == best.device_bytes
                      ? fmt::format("; {} is as fast (within 1 %) and holds the same", next->label)
                      : fmt::format("; {} is as fast (within 1 %) but holds {}", next->label, format_bytes(next->device_bytes)))
               : fmt::format("; the next, {}, is {:.1f} % slower", next->label, slower);
  }
  const PlanRow* faster = nullptr;  // the fastest of the rows that do not fit, when it beats the pick
  for (const PlanRow& r : rows)
    if (!r.fits && step_s(r) < step_s(best) && (!faster || step_s(r) < step_s(*faster))) faster = &r;
  if (faster)
    why += faster->fits_device
               ? fmt::format("; {} would be faster but needs {} of host memory a node (usable: {})", faster->label,
                             format_bytes(faster->host_bytes_per_node), format_bytes(fit.host_limit))
               : fmt::format("; {} would be faster but needs {} per GPU (limit {})", faster->label, format_bytes(faster->device_bytes),
                             format_bytes(fit.device_limit));
  return why;
}

nlohmann::json run_row(const std::string& toml, const std::string& name, const PlanArgs& a, const std::string& profile, const PlanRow& row) {
  std::vector<std::string> sets = {"train.steps=2", "log.trace_step=2", "train.eval_every=0", "train.device=meta",
                                   "precision.mode=" + a.precision, "optim.name=" + a.optimizer,
                                   fmt::format("dist.fake_world_size={}", a.gpus), fmt::format("dist.fake_ranks_per_node={}", a.gpus / a.nodes),
                                   fmt::format("train.micro_batch={}", a.micro_batch), "log.profile=" + profile};
  if (a.seq > 0) sets.push_back(fmt::format("data.seq_len={}", a.seq));
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  sets.insert(sets.end(), row.sets.begin(), row.sets.end());
  return run_planned(parse_config(toml, name, sets, {}, lab_config_sections()));
}

int run_plan(const PlanArgs& a) {
  if (a.gpus < 1 || a.nodes < 1 || a.gpus % a.nodes != 0)
    throw ConfigError(fmt::format("--gpus {} over --nodes {}", a.gpus, a.nodes), "the GPUs must split evenly over the nodes");
  std::string label;
  const std::string toml = model_toml(a, label);
  const int64_t capacity = parse_device_memory(a.gpu_mem, "--gpu-mem");
  const std::string profile = profile_for(a);
  const HardwareProfile hw = require_profile(profile, "--profile", true);
  // the node's host memory: --host-mem, else the profile's node (hardware.cpp names its source)
  const int64_t host_mem_per_node = a.host_mem.empty() ? hw.host_memory_per_node_bytes : parse_bytes(a.host_mem, "--host-mem");
  if (host_mem_per_node <= 0)
    throw ConfigError(fmt::format("--host-mem {}: a node needs some host memory", a.host_mem), "a size per node, such as 512GB or 2TiB");
  std::vector<PlanRow> rows = {
      {"DDP", "ddp", {"parallel.strategy=ddp"}},
      {"ZeRO-1", "zero1", {"parallel.strategy=zero1"}},
      {"ZeRO-2", "zero2", {"parallel.strategy=zero2"}},
      {"ZeRO-3", "zero3", {"parallel.strategy=zero3"}},
      {"FSDP", "fsdp", {"parallel.strategy=fsdp"}},
      {"FSDP + sel. AC", "fsdp+selective", {"parallel.strategy=fsdp", "train.activation_checkpointing=selective"}},
      {"FSDP + op AC", "fsdp+selective_op", {"parallel.strategy=fsdp", "train.activation_checkpointing=selective_op"}},
      {"FSDP + full AC", "fsdp+full", {"parallel.strategy=fsdp", "train.activation_checkpointing=full"}},
      {"FSDP + offload", "fsdp+offload", {"parallel.strategy=fsdp", "parallel.offload=cpu"}},
      {"FSDP+offload+AC", "fsdp+offload+full", {"parallel.strategy=fsdp", "parallel.offload=cpu", "train.activation_checkpointing=full"}},
  };
  if (a.gpus == 1)
    rows = {{"one GPU", "none", {"parallel.strategy=none"}},
            {"one GPU + sel. AC", "none+selective", {"parallel.strategy=none", "train.activation_checkpointing=selective"}},
            {"one GPU + op AC", "none+selective_op", {"parallel.strategy=none", "train.activation_checkpointing=selective_op"}},
            {"one GPU + AC", "none+full", {"parallel.strategy=none", "train.activation_checkpointing=full"}}};
  // activation checkpointing is a language model's (its blocks): other models have no such rows; the op-level
  // policy (torchtitan's) is written for Llama's block alone
  const ModelSpec spec = parse_config(toml, label, a.sets, {}, lab_config_sections()).model;
  if (a.finetune != "full" && a.finetune != "lora" && a.finetune != "qlora")
    throw ConfigError(fmt::format("--finetune {}: not full, lora or qlora", a.finetune),
                      "use --finetune full (every parameter), lora (adapters on a 16-bit base) or qlora (on a 4-bit one)");
  if (a.finetune != "full") {  // PEFT's usual setting: rank r on every Linear but the head, alpha 2r
    if (a.lora_r < 1) throw ConfigError(fmt::format("--lora-r {}: a rank is at least 1", a.lora_r), "16 is common");
    std::vector<PlanRow> l;
    // LoRA's rows, then (qlora) the same with the base in NF4: one GPU, with checkpointing, and DDP for speed
    // (the adapters' gradients are all that travels)
    for (const std::string method : {"lora", "qlora"}) {
      if (method == "qlora" && a.finetune != "qlora") continue;
      std::vector<std::string> adapters = {fmt::format("lora.r={}", a.lora_r), fmt::format("lora.alpha={}", 2 * a.lora_r),
                                           "lora.target_modules=all-linear"};
      if (method == "qlora") adapters.push_back("quantization.bits=4");
      auto with = [&](std::vector<std::string> s) {
        s.insert(s.end(), adapters.begin(), adapters.end());
        return s;
      };
      const std::string name = method == "lora" ? "LoRA" : "QLoRA";
      const std::vector<std::string> one = {"dist.fake_world_size=0", "dist.fake_ranks_per_node=0", "parallel.strategy=none"};
      std::vector<std::string> one_ac = one;
      one_ac.push_back("train.activation_checkpointing=full");
      l.push_back({name + ", 1 GPU", method + "+one", with(one), method});
      if (is_language_model(spec)) l.push_back({name + ", 1 GPU + AC", method + "+one+full", with(one_ac), method});
      if (a.gpus > 1) {
        l.push_back({name + " + DDP", method + "+ddp", with({"parallel.strategy=ddp"}), method});
        if (is_language_model(spec))
          l.push_back({name + " + DDP + AC", method + "+ddp+full", with({"parallel.strategy=ddp", "train.activation_checkpointing=full"}), method});
        if (method == "lora") {  // the 16-bit base too big for every card whole: sharded beside the adapters (use_orig_params)
          l.push_back({name + " + FSDP", method + "+fsdp", with({"parallel.strategy=fsdp"}), method});
          if (is_language_model(spec))
            l.push_back({name + " + FSDP + AC", method + "+fsdp+full", with({"parallel.strategy=fsdp", "train.activation_checkpointing=full"}), method});
        }
      }
    }
    rows.insert(rows.begin(), l.begin(), l.end());
  }
  // Long sequences (16k tokens and more): the rows that split the tokens too, with flash attention and full
  // checkpointing — tensor parallel with sequence parallel inside a node, context parallel (ring attention),
  // and both, as Llama 3's long-context stage ran (chapter 8). k = tp·cp ranks share each sequence, so such a
  // row accumulates k micro-batches a step: every row's step is the same batch of gpus × micro-batch sequences.
  const RunConfig user_cfg = parse_config(toml, label, a.sets, {}, lab_config_sections());  // the model and the user's --set
  const int64_t seq = a.seq > 0 ? a.seq : user_cfg.data.seq_len;
  if (is_language_model(spec) && a.finetune == "full" && a.gpus > 1 && seq >= 16384) {
    const int64_t kv = spec.name == "llama" && spec.n_kv_head > 0 ? spec.n_kv_head : spec.n_head;
    auto largest_split = [&](int64_t limit, auto&& ok) {  // the largest power of two <= limit that ok() accepts
      int64_t best = 1;
      for (int64_t k = 2; k <= limit; k *= 2)
        if (ok(k)) best = k;
      return best;
    };
    const int64_t per_node = a.gpus / a.nodes;
    const int64_t t = largest_split(std::min<int64_t>(per_node, 8), [&](int64_t k) {
      return a.gpus % k == 0 && spec.n_head % k == 0 && kv % k == 0 && (seq % k) == 0;
    });
    auto cp_for = [&](int64_t ranks) { return largest_split(ranks, [&](int64_t k) { return ranks % k == 0 && seq % (2 * k) == 0; }); };
    const std::vector<std::string> base = {"parallel.strategy=fsdp", "train.activation_checkpointing=full", "model.attention=flash"};
    auto with = [&](std::vector<std::string> extra) {
      extra.insert(extra.begin(), base.begin(), base.end());
      return extra;
    };
    if (spec.attention != AttentionKernel::flash) rows.push_back({"FSDP + flash + AC", "fsdp+flash+full", with({})});
    auto accum = [&](int64_t k) { return fmt::format("train.accum_steps={}", k * user_cfg.train.accum_steps); };
    if (t > 1)
      rows.push_back({fmt::format("FSDP + TP{} + SP", t), "fsdp+tp+sp+full",
                      with({fmt::format("parallel.tp={}", t), "parallel.sequence_parallel=true", accum(t)})});
    if (const int64_t c = cp_for(a.gpus); c > 1)
      rows.push_back({fmt::format("FSDP + CP{}", c), "fsdp+cp+full", with({fmt::format("parallel.cp={}", c), accum(c)})});
    if (t > 1)
      if (const int64_t c = cp_for(a.gpus / t); c > 1 && (seq / c) % t == 0)
        rows.push_back({fmt::format("FSDP+TP{}+SP+CP{}", t, c), "fsdp+tp+sp+cp+full",
                        with({fmt::format("parallel.tp={}", t), "parallel.sequence_parallel=true", fmt::format("parallel.cp={}", c), accum(t * c)})});
  }
  if (!is_language_model(spec))
    std::erase_if(rows, [](const PlanRow& r) { return r.strategy.find("selective") != std::string::npos || r.strategy.ends_with("full"); });
  if (spec.name != "llama") std::erase_if(rows, [](const PlanRow& r) { return r.strategy.ends_with("selective_op"); });
  // "fits": what the caching allocator reserves at the peak (the tensors alive, rounded into its blocks and
  // segments, core/tensor/allocator_model.h), within the card less a stated margin; an offload row also needs
  // its host memory, all the node's ranks together, within the node's usable share
  const FitRule fit = fit_rule(capacity, host_mem_per_node, a.gpus / a.nodes);
  for (PlanRow& r : rows) {
    r.summary = run_row(toml, label, a, profile, r);
    r.device_bytes = device_bytes(r.summary);
    r.host_bytes_per_node = r.summary["peak_memory"]["host"].get<double>() * double(a.gpus / a.nodes);
    r.fits_device = r.device_bytes <= fit.device_limit;
    r.fits_host = r.host_bytes_per_node <= fit.host_limit;
    r.fits = r.fits_device && r.fits_host;
  }
  const PlanRow& first_full = *std::find_if(rows.begin(), rows.end(), [](const PlanRow& r) { return r.finetune == "full"; });
  const double psi = first_full.summary["params"].get<double>();
  const auto& pm0 = first_full.summary["peak_memory"];
  const double replica = first_full.strategy == "ddp" || first_full.strategy == "none"
                             ? pm0["params"].get<double>() + pm0["grads"].get<double>() + pm0["optim_state"].get<double>()
                             : 0;
  // the decision tree: the first rung that fits (ZeRO-1 and 2 cost DDP's bytes on the wire; ZeRO-1 is skipped
  // as a rung because ZeRO-2 saves more for the same traffic)
  std::string pick, reason;  // the decision tree's rung and why
  // (--finetune lora, qlora) after a full replica, the tree's second question: does LoRA fit one card, or in 4 bits?
  for (const char* rung : {"ddp", "none", "lora+one", "lora+one+full", "qlora+one", "qlora+one+full", "none+selective", "none+selective_op", "none+full", "zero2", "fsdp",
                           "fsdp+selective", "fsdp+selective_op", "fsdp+full", "fsdp+offload", "fsdp+offload+full",
                           // a sequence too long for one card: its tokens split, TP + SP inside a node first, then CP
                           "fsdp+tp+sp+full", "fsdp+cp+full", "fsdp+tp+sp+cp+full"})
    for (const PlanRow& r : rows)
      if (pick.empty() && r.strategy == rung && r.fits) pick = r.label;
  auto row = [&](const std::string& s) -> const PlanRow* {
    for (const PlanRow& r : rows)
      if (r.strategy == s) return &r;
    return nullptr;
  };
  auto need = [&](const PlanRow* r) { return format_bytes(r->device_bytes); };
  // the recompute's share: FLOPs a step over FSDP's without checkpointing
  auto extra_flops = [&](const PlanRow* r) {
    return 100.0 * (r->summary["flops_per_step"].get<double>() / row("fsdp")->summary["flops_per_step"].get<double>() - 1);
  };
  if (pick == "DDP" || pick == "one GPU") {
    reason = "a whole replica fits: no sharding needed, the least communication";
  } else if (pick == "LoRA, 1 GPU" || pick == "LoRA, 1 GPU + AC") {
    const PlanRow* l = row(pick == "LoRA, 1 GPU" ? "lora+one" : "lora+one+full");
    const nlohmann::json& lo = l->summary["lora"];
    reason = fmt::format("full fine-tuning needs {} per GPU for a whole replica; LoRA r {} trains {:.1f} M of {:.2f} B parameters ({:.2f} %): the "
                         "base frozen in 16 bits, the adapters' gradients and Adam state {} — {} on one GPU{}: no distributed training needed",
                         need(row(a.gpus > 1 ? "ddp" : "none")), a.lora_r, lo["trainable_params"].get<double>() / 1e6,
                         lo["all_params"].get<double>() / 1e9, 100.0 * lo["trainable_params"].get<double>() / lo["all_params"].get<double>(),
                         format_bytes(l->summary["peak_memory"]["grads"].get<double>() + l->summary["peak_memory"]["optim_state"].get<double>()),
                         need(l), pick == "LoRA, 1 GPU" ? "" : " with full activation checkpointing");
  } else if (pick == "QLoRA, 1 GPU" || pick == "QLoRA, 1 GPU + AC") {
    const PlanRow* q = row(pick == "QLoRA, 1 GPU" ? "qlora+one" : "qlora+one+full");
    const PlanRow* l = row(pick == "QLoRA, 1 GPU" ? "lora+one" : "lora+one+full");
    reason = fmt::format("full fine-tuning needs {} per GPU and LoRA on a 16-bit base {}; QLoRA keeps the frozen base in NF4 (4.127 bits a "
                         "weight: {} of parameters against {}) — {} on one GPU{}: no distributed training needed",
                         need(row(a.gpus > 1 ? "ddp" : "none")), need(l), format_bytes(q->summary["peak_memory"]["params"].get<double>()),
                         format_bytes(l->summary["peak_memory"]["params"].get<double>()), need(q),
                         pick == "QLoRA, 1 GPU" ? "" : " with full activation checkpointing");
  } else if (pick == "one GPU + sel. AC" || pick == "one GPU + op AC" || pick == "one GPU + AC") {
    reason = fmt::format("one GPU needs {}, {} of it activations; activation checkpointing trades them for recompute",
                         need(row("none")), format_bytes(row("none")->summary["peak_memory"]["activations"].get<double>()));
  } else if (pick == "ZeRO-2") {
    reason = fmt::format("DDP needs {} per GPU; ZeRO-2 splits gradients and optimizer state at DDP's communication cost", need(row("ddp")));
  } else if (pick == "FSDP") {
    reason = fmt::format("ZeRO-2 still needs {} per GPU; FSDP/ZeRO-3 splits the parameters too and gathers them twice a step "
                         "(1.5x DDP's bytes in fp32)",
                         need(row("zero2")));
  } else if (pick == "FSDP + sel. AC") {
    reason = fmt::format("FSDP still needs {} per GPU, {} of it activations; selective activation checkpointing recomputes each block's "
                         "attention probabilities in backward instead of keeping them",
                         need(row("fsdp")), format_bytes(row("fsdp")->summary["peak_memory"]["activations"].get<double>()));
  } else if (pick == "FSDP + op AC") {
    reason = fmt::format("FSDP still needs {} per GPU{}; op-level checkpointing (torchtitan's) keeps each block's input, every second "
                         "matmul's output and the attention's, and recomputes the rest in backward ({:.0f} % more FLOPs a step)",
                         need(row("fsdp")), spec.attention == AttentionKernel::flash ? " (flash attention keeps no probabilities to drop)" : "",
                         extra_flops(row("fsdp+selective_op")));
  } else if (pick == "FSDP + full AC") {
    reason = fmt::format("FSDP with selective checkpointing still needs {} per GPU; full checkpointing keeps only each block's input "
                         "and reruns its forward in backward ({:.0f} % more FLOPs a step)",
                         need(row(row("fsdp+selective_op") ? "fsdp+selective_op" : "fsdp+selective")), extra_flops(row("fsdp+full")));
  } else if (pick == "FSDP + offload") {
    reason = fmt::format("FSDP still needs {} per GPU{}; offload moves the shards and optimizer state to host memory, "
                         "paying PCIe copies and a CPU optimizer step",
                         need(row("fsdp")), row("fsdp+full") ? " (" + need(row("fsdp+full")) + " with full activation checkpointing)" : "");
  } else if (pick == "FSDP+offload+AC") {
    reason = fmt::format("FSDP with offload still needs {} per GPU; with full activation checkpointing too, {}", need(row("fsdp+offload")),
                         need(row("fsdp+offload+full")));
  } else if (const PlanRow* r = [&]() -> const PlanRow* {
               for (const PlanRow& x : rows)
                 if (x.label == pick && x.strategy.find("+sp+") != std::string::npos) return &x;
               for (const PlanRow& x : rows)
                 if (x.label == pick && x.strategy == "fsdp+cp+full") return &x;
               return nullptr;
             }()) {
    const std::string before = need(row("fsdp+offload+full") ? row("fsdp+offload+full") : row("fsdp+full"));
    reason = r->strategy == "fsdp+tp+sp+full"
                 ? fmt::format("one sequence of {} tokens: FSDP with full checkpointing (and offload) still needs {} per GPU; tensor parallel with "
                               "sequence parallelism splits each sequence's activations over the ranks of a node (an all-gather and a "
                               "reduce-scatter for each split layer)",
                               seq, before)
             : r->strategy == "fsdp+cp+full"
                 ? fmt::format("one sequence of {} tokens: FSDP with full checkpointing (and offload) still needs {} per GPU, and TP + SP within "
                               "a node {}; context parallelism splits each sequence over the ranks (ring attention: the keys and values "
                               "travel while the blocks compute)",
                               seq, before, row("fsdp+tp+sp+full") ? need(row("fsdp+tp+sp+full")) : "is not possible")
                 : fmt::format("one sequence of {} tokens: neither TP + SP within a node nor CP alone fits; both together split each "
                               "sequence over tp x cp ranks",
                               seq);
  } else {
    pick = "none fits";
    reason = seq >= 16384 ? "the sequence's activations: split its tokens, sequence or context parallelism (the TP + SP and CP rows, chapter 8)"
                          : "more GPUs, a smaller micro-batch or activation checkpointing, or tensor/pipeline parallelism (3D, lab 06)";
  }
  // what "needs" was held against: the card less the margin (a student's hand estimate compares with this)
  reason += fmt::format(" (a row fits in {} reserved: {} less {})", format_bytes(fit.device_limit), format_bytes(double(capacity)),
                        format_bytes(fit.margin));

  // the recommendation: the fastest row that fits; rows within 1 % of it are a tie, which the one holding the
  // least memory wins
  // the job as asked: --finetune's method, over every GPU (a one-GPU LoRA row trains 1/N of the tokens a step)
  std::vector<PlanRow> asked;
  for (const PlanRow& r : rows)
    if (r.finetune == a.finetune && !(r.finetune != "full" && r.strategy.find("+one") != std::string::npos && a.gpus > 1)) asked.push_back(r);
  const PlanRow* best = nullptr;
  for (const PlanRow& r : asked) {
    if (!r.fits) continue;
    if (!best || step_s(r) < step_s(*best) * (1 - kTie) ||
        (step_s(r) <= step_s(*best) * (1 + kTie) && r.device_bytes < best->device_bytes))
      best = &r;
  }
  std::string recommendation = "none fits", why = "more GPUs, a smaller micro-batch, or tensor/pipeline parallelism (3D, lab 06)";
  if (best) {
    recommendation = best->label;
    why = fastest_reason(asked, *best, fit);
  }
  if (a.nodes > 1 && best) why += "; across nodes keep the heavy traffic inside a node (shard within a node, replicate across: HSDP)";
  if (!best) {
    const PlanRow* host_blocked = nullptr;
    for (const PlanRow& r : rows)
      if (r.fits_device && !r.fits_host) host_blocked = &r;
    if (host_blocked)
      why += fmt::format("; {} would fit the GPU but needs {} of host memory a node, more than the {} usable of --host-mem {}", host_blocked->label,
                         format_bytes(host_blocked->host_bytes_per_node), format_bytes(fit.host_limit), format_bytes(double(host_mem_per_node)));
  }

  if (a.json) {
    nlohmann::json out = {{"model", label}, {"params", psi}, {"gpus", a.gpus}, {"nodes", a.nodes}, {"gpu_mem", capacity},
                          {"precision", a.precision}, {"profile", profile}, {"replica_model_state_bytes", replica}, {"finetune", a.finetune},
                          {"fit_rule", {{"device_limit", fit.device_limit}, {"margin", fit.margin}, {"margin_why", fit.margin_why},
                                        {"host_mem_per_node", host_mem_per_node}, {"host_limit_per_node", fit.host_limit},
                                        {"host_why", fit.host_why}}},
                          {"recommendation", recommendation}, {"reason", why},
                          {"decision_tree", pick}, {"decision_tree_reason", reason},
                          {"flops_convention", rows[0].summary.value("flops_convention", "")}, {"rows", nlohmann::json::array()}};
    for (const PlanRow& r : rows)
      out["rows"].push_back({{"strategy", r.label}, {"finetune", r.finetune}, {"peak_memory", r.summary["peak_memory"]}, {"peak_memory_total", r.summary["peak_memory_total"]},
                             {"peak_memory_reserved", r.device_bytes}, {"host_bytes_per_node", r.host_bytes_per_node},
                             {"fits", r.fits}, {"fits_device", r.fits_device}, {"fits_host", r.fits_host},
                             {"modeled_step_s", step_s(r)},
                             {"modeled_comm_s", r.summary.value("modeled_comm_s", 0.0)},
                             {"modeled_exposed_comm_s", r.summary.value("modeled_exposed_comm_s", 0.0)},
                             {"modeled_mfu", r.summary.value("modeled_mfu", 0.0)}, {"modeled_hfu", r.summary.value("modeled_hfu", 0.0)}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("distlab plan: {} ({:.2f}B parameters), {} GPU(s) on {} node(s), {} per GPU, {}, micro-batch {}, profile {}\n",
                           label, psi / 1e9, a.gpus, a.nodes, format_bytes(double(capacity)), a.precision, a.micro_batch, profile);
  if (replica > 0)
    std::cout << fmt::format("one full replica's model state: {:.1f} GB ({:.0f} bytes per parameter)\n", replica / 1e9, replica / psi);
  std::cout << fmt::format("fits: reserved ≤ {} ({} less {}: {}); offload rows: host ≤ {} a node ({})\n", format_bytes(fit.device_limit),
                           format_bytes(double(capacity)), format_bytes(fit.margin), fit.margin_why, format_bytes(fit.host_limit), fit.host_why);
  std::cout << fmt::format("{:<15} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>11} {:>11} {:>6} {:>10} {:>6} {:>6}\n", "strategy", "params", "grads",
                           "optim", "activations", "comm buf", "host/node", "allocated", "reserved", "fits", "step (ms)", "MFU", "HFU");
  for (const PlanRow& r : rows) {
    const auto& pm = r.summary["peak_memory"];
    auto gb = [&](const char* c) { return fmt::format("{:.2f} GB", pm[c].get<double>() / 1e9); };
    std::cout << fmt::format("{:<15} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>11} {:>11} {:>6} {:>10.1f} {:>5.1f}% {:>5.1f}%\n", r.label, gb("params"),
                             gb("grads"), gb("optim_state"), gb("activations"), gb("comm_buffers"), fmt::format("{:.1f} GB", r.host_bytes_per_node / 1e9),
                             fmt::format("{:.2f} GB", r.summary["peak_memory_total"].get<double>() / 1e9), fmt::format("{:.2f} GB", r.device_bytes / 1e9),
                             r.fits ? "yes" : !r.fits_device ? "no" : "host", 1e3 * step_s(r), 100 * r.summary.value("modeled_mfu", 0.0),
                             100 * r.summary.value("modeled_hfu", 0.0));
  }
  std::cout << "modeled (not measured): " << rows[0].summary.value("flops_convention", "") << "\n";
  std::cout << "recommendation: " << recommendation << " — " << why << "\n";
  std::cout << "the course's decision tree (the first rung that fits): " << pick << " — " << reason << "\n";
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand("plan", "which parallel strategy fits a model on N GPUs, and a step's modeled time");
  sub->add_option("--model", a->model, "gpt-1b | gpt-7b | gpt-13b | gpt-70b (or 1b, 7b, ...) | llama3-8b | llama3-70b, or a config file");
  sub->add_option("--gpus", a->gpus, "data-parallel ranks (GPUs)");
  sub->add_option("--nodes", a->nodes, "nodes the GPUs are spread over (collectives across nodes use the inter-node bandwidth)");
  sub->add_option("--gpu-mem", a->gpu_mem, "memory per GPU: a size (16GiB) or a profile (t4, a100-40g, a100-80g, h100, h200)");
  sub->add_option("--host-mem", a->host_mem, "host memory per node, for the offload rows (default: the profile's node, e.g. 2 TB for a DGX H100)");
  sub->add_option("--profile", a->profile, "hardware profile for the step time (default: from --gpu-mem), or a profile file of distlab bench calibrate (.json)");
  sub->add_option("--precision", a->precision, "fp32 | bf16 | fp16");
  sub->add_option("--optimizer", a->optimizer, "adamw | sgd");
  sub->add_option("--micro-batch", a->micro_batch, "sequences per GPU per micro-step");
  sub->add_option("--finetune", a->finetune, "full (every parameter trains) | lora (+ LoRA rows: adapters on a frozen 16-bit base, one GPU and all) | qlora (+ LoRA's and QLoRA's rows: the base in NF4)");
  sub->add_option("--lora-r", a->lora_r, "--finetune lora: the adapters' rank (alpha 2r, every Linear but the head)");
  sub->add_option("--seq", a->seq, "sequence length (default: the model's block size)")->check(CLI::PositiveNumber);
  sub->add_option("--set", a->sets, "any other config key, as for train (repeatable)");
  sub->add_flag("--json", a->json, "the table as JSON");
  sub->callback([a, &exit_code]() { exit_code = run_plan(*a); });
}

}  // namespace distlab
