// FSDP configs in YAML as distlab settings (`--fsdp-config`): accelerate's config file (distributed_type
// FSDP and its fsdp_config, or DEEPSPEED and its deepspeed_config section), or a Trainer / LLaMA-Factory style
// file (`fsdp: full_shard auto_wrap`, `fsdp_config:`); and the mapping machinery both readers share
// (core/config/ecosystem_map.h). Read next: core/config/deepspeed_config.cpp (DeepSpeed's JSON).
#include "core/config/ecosystem.h"

#include "core/config/llamafactory.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/util/error.h"
#include "core/util/nesting.h"

namespace distlab {

namespace ecosystem {

// ---- mapping, shared by both formats (core/config/ecosystem_map.h) ----

std::string show_json(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string toml_value(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt::format("{}", v.get<double>());  // the shortest text that reads back the same
  return v.dump();
}




void walk_json(Mapper& m, const json& obj, const Table& table, const std::string& prefix) {
  if (!obj.is_object()) throw ConfigError(fmt::format("{} is not a mapping", m.where(prefix.empty() ? "the file" : prefix)));
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string field = prefix.empty() ? it.key() : prefix + "." + it.key();
    auto h = table.find(it.key());
    if (h == table.end()) {
      std::string known;
      for (const auto& [k, _] : table) known += (known.empty() ? "" : ", ") + k;
      throw ConfigError(fmt::format("{}: unknown field '{}'", m.out.file, field),
                        fmt::format("the fields distlab reads{} are: {}", prefix.empty() ? "" : " in " + prefix, known));
    }
    h->second(m, field, it.value());
  }
}

Handler to_key(const std::string& key, std::function<std::string(Mapper&, const std::string&, const json&)> convert) {
  return [key, convert](Mapper& m, const std::string& f, const json& v) {
    if (m.is_auto(f, v)) return;
    m.set(f, v, key, convert ? convert(m, f, v) : toml_value(v));
  };
}
Handler note_only(const std::string& text) {
  return [text](Mapper& m, const std::string& f, const json& v) { m.note(f, v, text); };
}
std::string as_int(Mapper& m, const std::string& f, const json& v) { return std::to_string(m.integer(f, v)); }
std::string as_real(Mapper& m, const std::string& f, const json& v) { return fmt::format("{}", m.number(f, v)); }
std::string as_bool(Mapper& m, const std::string& f, const json& v) { return m.boolean(f, v) ? "true" : "false"; }

EcosystemConfig read_file(const std::string& path, const std::string& what, EcosystemConfig (*map)(const std::string&, const std::string&)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw ConfigError(fmt::format("{} file '{}' does not exist or is not a file", what, path));
  if (std::filesystem::file_size(path, ec) > (1u << 20)) throw ConfigError(fmt::format("{} file '{}' is larger than 1 MiB", what, path));
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{} file '{}' cannot be read", what, path));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return map(text, path);
}

}  // namespace ecosystem

using namespace ecosystem;

namespace {

// ---- FSDP (accelerate's config file, or Trainer-style fsdp/fsdp_config) ----

Table fsdp_config_table(bool prefixed) {
  auto k = [prefixed](const std::string& name) { return (prefixed ? "fsdp_" : "") + name; };
  Handler sharding = [](Mapper& m, const std::string& f, const json& v) {
    std::string s = v.is_number() ? std::to_string(m.integer(f, v)) : m.text(f, v);
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (s == "FULL_SHARD" || s == "1") m.set(f, v, "parallel.sharding", "full_shard");
    else if (s == "SHARD_GRAD_OP" || s == "2") m.set(f, v, "parallel.sharding", "shard_grad_op");
    else if (s == "NO_SHARD" || s == "3") m.set(f, v, "parallel.sharding", "no_shard");
    else m.unsupported(f, v, "distlab shards across every rank (no hybrid sharding within a node)", "use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD");
  };
  Handler wrap = [](Mapper& m, const std::string& f, const json& v) {
    const std::string p = m.text(f, v);
    if (p == "TRANSFORMER_BASED_WRAP") m.set(f, v, "parallel.wrap_min_params", "0");
    else if (p == "SIZE_BASED_WRAP") m.note(f, v, "units merge up to fsdp_min_num_params (parallel.wrap_min_params)");
    else if (p == "NO_WRAP") m.set(f, v, "parallel.wrap_min_params", "1099511627776");
    else m.unsupported(f, v, "the policies are TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP and NO_WRAP", "use one of those");
  };
  Handler prefetch = [](Mapper& m, const std::string& f, const json& v) {
    const std::string p = m.text(f, v);
    if (p == "BACKWARD_PRE") m.set(f, v, "parallel.prefetch", "true");
    else if (p == "BACKWARD_POST") m.set(f, v, "parallel.prefetch", "true");
    else if (p == "NO_PREFETCH") m.set(f, v, "parallel.prefetch", "false");
    else m.unsupported(f, v, "the choices are BACKWARD_PRE, BACKWARD_POST and NO_PREFETCH", "use one of those");
  };
  Handler offload = [](Mapper& m, const std::string& f, const json& v) { m.set(f, v, "parallel.offload", m.boolean(f, v) ? "cpu" : "none"); };
  Handler activation = [](Mapper& m, const std::string& f, const json& v) {  // accelerate wraps every block in checkpoint()
    m.set(f, v, "train.activation_checkpointing", m.boolean(f, v) ? "full" : "none");
  };
  return Table{
      {k("sharding_strategy"), sharding},
      {k("offload_params"), offload},
      {k("auto_wrap_policy"), wrap},
      {k("min_num_params"), to_key("parallel.wrap_min_params", as_int)},
      {k("transformer_layer_cls_to_wrap"), note_only("each of the model's blocks is a unit (GPT's blocks; the CNN's and MLP's layers)")},
      {k("backward_prefetch"), prefetch},
      {k("backward_prefetch_policy"), prefetch},
      {k("forward_prefetch"), [](Mapper& m, const std::string& f, const json& v) {
         m.set(f, v, "parallel.forward_prefetch", m.boolean(f, v) ? "true" : "false");
       }},
      {k("state_dict_type"), [](Mapper& m, const std::string& f, const json& v) {
         const std::string t = m.text(f, v);
         m.note(f, v, t == "SHARDED_STATE_DICT" ? "checkpoints hold each rank's shards (checkpoint.dir)" : "--save writes the whole weights");
       }},
      {k("sync_module_states"), note_only("rank 0's initial weights reach every rank")},
      {k("use_orig_params"), note_only("parameters keep their names and shapes (PyTorch's)")},
      {k("cpu_ram_efficient_loading"), note_only("--init reads the weights once and shards them")},
      {k("activation_checkpointing"), activation},
      {k("version"), [](Mapper& m, const std::string& f, const json& v) {
         m.note(f, v, m.integer(f, v) == 2 ? "≈ distlab shards a flat vector per unit (FSDP1's layout), not each parameter (FSDP2)" : "FSDP1's flat vectors per unit");
       }},
      {k("reshard_after_forward"), [](Mapper& m, const std::string& f, const json& v) {
         m.set(f, v, "parallel.sharding", m.boolean(f, v) ? "full_shard" : "shard_grad_op");
       }},
  };
}


// accelerate config's deepspeed_config section (accelerate's DeepSpeedPlugin): the few fields it takes
// inline, or deepspeed_config_file naming a DeepSpeed JSON (relative to the YAML's folder), mapped as
// --deepspeed maps it.
Table accelerate_deepspeed_table() {
  auto device = [](const char* what) {
    return [what](Mapper& m, const std::string& f, const json& v) {
      const std::string d = m.text(f, v);
      if (d == "cpu") m.set(f, v, "parallel.offload", "cpu");
      else if (d == "none") m.note(f, v, std::string(what) + " stays on the device");
      else m.unsupported(f, v, "distlab offloads to the CPU's memory", "use cpu or none (NVMe offload is not supported)");
    };
  };
  return {
      {"zero_stage", [](Mapper& m, const std::string& f, const json& v) {
         const int64_t s = m.integer(f, v);
         if (s < 0 || s > 3) m.unsupported(f, v, "ZeRO's stages are 0..3", "use 0 (DDP), 1, 2 or 3");
         m.set(f, v, "parallel.strategy", s == 0 ? "ddp" : fmt::format("zero{}", s));
       }},
      {"offload_optimizer_device", device("the optimizer state")},
      {"offload_param_device", device("the parameters")},
      {"gradient_accumulation_steps", to_key("train.accum_steps", as_int)},
      {"gradient_clipping", to_key("optim.clip_grad_norm", as_real)},
      {"zero3_init_flag", note_only("distlab builds each rank's shard directly under ZeRO-3 (no full model first)")},
      {"zero3_save_16bit_model", note_only("checkpoints hold f32 weights; distlab ckpt export writes any dtype")},
      {"deepspeed_multinode_launcher", note_only("distlab run starts the ranks (srun under Slurm)")},
      {"deepspeed_hostfile", note_only("distlab run --nnodes / Slurm's node list")},
      {"deepspeed_inclusion_filter", note_only("distlab run --nnodes / Slurm's node list")},
      {"deepspeed_exclusion_filter", note_only("distlab run --nnodes / Slurm's node list")},
      {"deepspeed_config_file", [](Mapper& m, const std::string& f, const json& v) {
         std::filesystem::path file = m.text(f, v);
         if (file.is_relative()) file = std::filesystem::path(m.out.file).parent_path() / file;
         const EcosystemConfig inner = read_file(file.string(), "DeepSpeed config", map_deepspeed);  // the JSON only: no YAML naming YAML
         m.note(f, v, "its fields, below");
         for (const MappedField& x : inner.fields) m.out.fields.push_back({f + ": " + x.field, x.value, x.key, x.setting});
         m.out.settings.insert(m.out.settings.end(), inner.settings.begin(), inner.settings.end());
       }},
  };
}

Table fsdp_top_table() {
  auto precision = [](Mapper& m, const std::string& f, const json& v) {
    std::string p = v.is_boolean() ? (v.get<bool>() ? "?" : "no") : m.text(f, v);
    if (p == "no") m.set(f, v, "precision.mode", "fp32");
    else if (p == "fp16" || p == "bf16") m.set(f, v, "precision.mode", p);
    else m.unsupported(f, v, "distlab computes in fp32, bf16 or fp16", "use no, bf16 or fp16");
  };
  auto mode_flag = [](const char* mode) {
    return [mode](Mapper& m, const std::string& f, const json& v) {
      if (m.boolean(f, v)) m.set(f, v, "precision.mode", mode);
      else m.note(f, v, std::string(mode) + " off");
    };
  };
  auto fsdp_words = [](Mapper& m, const std::string& f, const json& v) {
    std::vector<std::string> words;
    if (v.is_array())
      for (const auto& w : v) words.push_back(m.text(f, w));
    else {
      std::stringstream ss(m.text(f, v));
      for (std::string w; ss >> w;) words.push_back(w);
    }
    for (const std::string& w : words) {
      if (w == "full_shard") m.set(f, v, "parallel.strategy", "fsdp"), m.out.settings.push_back({"parallel.sharding", "full_shard", m.where(f)});
      else if (w == "shard_grad_op") m.set(f, v, "parallel.strategy", "fsdp"), m.out.settings.push_back({"parallel.sharding", "shard_grad_op", m.where(f)});
      else if (w == "no_shard") m.set(f, v, "parallel.strategy", "fsdp"), m.out.settings.push_back({"parallel.sharding", "no_shard", m.where(f)});
      else if (w == "offload") m.set(f, v, "parallel.offload", "cpu");
      else if (w == "auto_wrap") m.note(f, v, "auto_wrap: each block is a unit");
      else m.unsupported(f, w, "the words distlab reads are full_shard, shard_grad_op, no_shard, offload and auto_wrap", "hybrid sharding is not supported");
    }
  };
  Table t = {
      // accelerate's config file
      {"distributed_type", [](Mapper& m, const std::string& f, const json& v) {
         const std::string d = m.text(f, v);
         if (d == "FSDP") m.set(f, v, "parallel.strategy", "fsdp");
         else if (d == "MULTI_GPU" || d == "MULTI_CPU") m.set(f, v, "parallel.strategy", "ddp");
         else if (d == "NO") m.set(f, v, "parallel.strategy", "none");
         else if (d == "DEEPSPEED") m.note(f, v, "DeepSpeed: the stage, offload and the rest come from deepspeed_config (or its deepspeed_config_file)");
         else m.unsupported(f, v, "distlab runs FSDP, MULTI_GPU (DDP) or NO", "use one of those");
       }},
      {"mixed_precision", precision},
      {"num_processes", [](Mapper& m, const std::string& f, const json& v) {
         m.out.world_size = std::max<int64_t>(m.out.world_size, 1) * m.integer(f, v);
         m.note(f, v, "distlab run -n N: checked against the run's world");
       }},
      {"num_machines", [](Mapper& m, const std::string& f, const json& v) {
         m.note(f, v, "distlab run --nnodes M (its ranks multiply num_processes)");
       }},
      {"machine_rank", note_only("distlab run --node-rank")},
      {"main_process_ip", note_only("distlab run --master-addr (MASTER_ADDR)")},
      {"main_process_port", note_only("distlab run --master-port (MASTER_PORT)")},
      {"rdzv_backend", note_only("distlab run hosts the rendezvous store on rank 0's node")},
      {"same_network", note_only("the nodes reach each other's ports")},
      {"compute_environment", note_only("this machine")},
      {"debug", note_only("errors name the rank and the collective")},
      {"downcast_bf16", note_only("precision.mode decides what is held in 16 bits")},
      {"enable_cpu_affinity", note_only("train.threads sets each rank's threads")},
      {"gpu_ids", note_only("one device per rank")},
      {"main_training_function", note_only("distlab train")},
      {"use_cpu", note_only("--device cpu: ranks are CPU processes")},
      {"tpu_env", note_only("no TPUs")},
      {"tpu_use_cluster", note_only("no TPUs")},
      {"tpu_use_sudo", note_only("no TPUs")},
      // accelerate's DeepSpeed plugin: its own fields inline, or a DeepSpeed JSON beside the file
      {"deepspeed_config", [](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, accelerate_deepspeed_table(), f); }},
      {"fsdp_config", [](Mapper& m, const std::string& f, const json& v) {
         Table both = fsdp_config_table(true), bare = fsdp_config_table(false);  // Trainer takes the keys with or without fsdp_
         both.insert(bare.begin(), bare.end());
         walk_json(m, v, both, f);
       }},
      // Hugging Face Trainer / LLaMA-Factory arguments
      {"fsdp", fsdp_words},
      {"per_device_train_batch_size", to_key("train.micro_batch", as_int)},
      {"gradient_accumulation_steps", to_key("train.accum_steps", as_int)},
      {"learning_rate", to_key("optim.lr", as_real)},
      {"weight_decay", to_key("optim.weight_decay", as_real)},
      {"adam_beta1", to_key("optim.beta1", as_real)},
      {"adam_beta2", to_key("optim.beta2", as_real)},
      {"adam_epsilon", to_key("optim.eps", as_real)},
      {"max_grad_norm", to_key("optim.clip_grad_norm", as_real)},
      {"warmup_steps", to_key("optim.warmup_steps", as_int)},
      {"max_steps", to_key("train.steps", as_int)},
      {"num_train_epochs", to_key("train.epochs", as_int)},
      {"logging_steps", to_key("train.log_every", as_int)},
      {"eval_steps", to_key("train.eval_every", as_int)},
      {"save_steps", to_key("checkpoint.every", as_int)},
      {"save_total_limit", to_key("checkpoint.keep", as_int)},
      {"output_dir", to_key("checkpoint.dir")},
      {"seed", to_key("train.seed", as_int)},
      {"ddp_timeout", to_key("dist.timeout_s", as_real)},
      {"bf16", mode_flag("bf16")},
      {"fp16", mode_flag("fp16")},
      {"optim", [](Mapper& m, const std::string& f, const json& v) {
         const std::string o = m.text(f, v);
         if (o.rfind("adamw", 0) == 0) m.set(f, v, "optim.name", "adamw");
         else if (o == "sgd") m.set(f, v, "optim.name", "sgd");
         else m.unsupported(f, v, "distlab has adamw and sgd", "use adamw_torch or sgd");
       }},
      {"lr_scheduler_type", [](Mapper& m, const std::string& f, const json& v) {
         const std::string s = m.text(f, v);
         if (s == "cosine" || s == "linear") m.set(f, v, "optim.schedule", s);
         else if (s == "constant" || s == "constant_with_warmup") m.set(f, v, "optim.schedule", "constant");
         else m.unsupported(f, v, "distlab's schedules are constant, step, cosine and linear", "use cosine, linear or constant");
       }},
      {"resume_from_checkpoint", to_key("checkpoint.resume")},
      {"deepspeed", [](Mapper& m, const std::string& f, const json& v) {
         m.unsupported(f, v, "this file configures FSDP", "pass a DeepSpeed JSON with --deepspeed instead");
       }},
  };
  // the model, data and logging fields of a fine-tuning recipe: distlab trains the TOML's model and data
  // LLaMA-Factory's finetuning fields: map_llamafactory_finetuning maps them once the file is walked
  for (const char* name : kLlamaFactoryFinetuningFields) t[name] = [](Mapper&, const std::string&, const json&) {};
  for (const char* name : {"model_name_or_path", "trust_remote_code", "stage", "do_train", "dataset", "template", "cutoff_len", "max_samples",
                           "overwrite_cache", "preprocessing_num_workers", "dataloader_num_workers", "overwrite_output_dir", "plot_loss",
                           "report_to", "val_size", "per_device_eval_batch_size", "eval_strategy", "evaluation_strategy",
                           "save_strategy", "logging_dir", "run_name", "flash_attn", "gradient_checkpointing", "gradient_checkpointing_kwargs"})
    t[name] = [name = std::string(name)](Mapper& m, const std::string& f, const json& v) {
      if (name == "gradient_checkpointing") {  // Trainer's: model.gradient_checkpointing_enable(), every decoder layer
        m.set(f, v, "train.activation_checkpointing", m.boolean(f, v) ? "full" : "none");
        return;
      }
      if (name == "gradient_checkpointing_kwargs") {
        m.note(f, v, "use_reentrant and the rest are PyTorch's autograd: distlab's recompute is explicit (core/models/gpt.h's Block)");
        return;
      }
      m.note(f, v, "the model and data are the TOML's [model] and [data]");
    };
  return t;
}

}  // namespace

EcosystemConfig map_fsdp(const std::string& text, const std::string& name) {
  const json doc = parse_yaml_subset(text, name);
  Mapper m;
  m.out.file = name;
  m.out.format = "fsdp";
  walk_json(m, doc, fsdp_top_table(), "");
  map_llamafactory_finetuning(m.out, doc);  // finetuning_type, lora_*: onto [lora] (core/config/llamafactory.h)
  const bool deepspeed = doc.contains("distributed_type") && doc["distributed_type"].is_string() && doc["distributed_type"] == "DEEPSPEED";
  if (deepspeed && !doc.contains("deepspeed_config"))
    throw ConfigError(fmt::format("{}: distributed_type DEEPSPEED without a deepspeed_config section", name),
                      "accelerate config writes its fields there (zero_stage, offload_optimizer_device, ...) or a "
                      "deepspeed_config_file; or pass the DeepSpeed JSON itself with --deepspeed");
  if (!deepspeed && doc.contains("deepspeed_config"))
    throw ConfigError(fmt::format("{}: deepspeed_config without distributed_type: DEEPSPEED", name), "say which strategy the file configures");
  if (doc.contains("fsdp_config") && !doc.contains("distributed_type") && !doc.contains("fsdp"))
    throw ConfigError(fmt::format("{}: fsdp_config without distributed_type: FSDP (accelerate) or fsdp: full_shard (Trainer)", name),
                      "say which strategy the section configures");
  return m.out;
}

// --deepspeed takes the JSON, or accelerate's YAML whose distributed_type is DEEPSPEED (what `accelerate
// config` writes for a DeepSpeed run): a file that does not start with '{' is read as that YAML
EcosystemConfig read_deepspeed_config(const std::string& path) {
  return read_file(path, "DeepSpeed config", [](const std::string& text, const std::string& name) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    return first != std::string::npos && text[first] != '{' ? map_fsdp(text, name) : map_deepspeed(text, name);
  });
}
EcosystemConfig read_fsdp_config(const std::string& path) { return read_file(path, "FSDP config", map_fsdp); }

std::string describe_mapping(const EcosystemConfig& e) {
  size_t w = 10;
  for (const MappedField& f : e.fields) w = std::max(w, f.field.size() + f.value.size() + 3);
  w = std::min<size_t>(w, 60);
  std::string s = fmt::format("{} ({}):\n", e.file, e.format == "deepspeed" ? "DeepSpeed" : "FSDP");
  for (const MappedField& f : e.fields)
    s += fmt::format("  {:<{}}  ->  {}\n", f.field + " = " + f.value, w, f.key.empty() ? f.setting : f.key + " = " + f.setting);
  return s;
}

}  // namespace distlab
