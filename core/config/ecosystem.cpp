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

using json = nlohmann::ordered_json;

namespace {

// ---- mapping, shared by both formats ----

std::string show_json(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string toml_value(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return fmt::format("{}", v.get<double>());  // the shortest text that reads back the same
  return v.dump();
}

struct Mapper {
  EcosystemConfig out;

  std::string where(const std::string& field) const { return fmt::format("{}: {}", out.file, field); }
  [[noreturn]] void unsupported(const std::string& field, const json& v, const std::string& why, const std::string& hint) const {
    throw ConfigError(fmt::format("{} = {} is not supported: {}", where(field), show_json(v), why), hint);
  }
  void set(const std::string& field, const json& v, const std::string& key, const std::string& value) {
    out.fields.push_back({field, show_json(v), key, value});
    out.settings.push_back({key, value, where(field)});
  }
  void note(const std::string& field, const json& v, const std::string& text) { out.fields.push_back({field, show_json(v), "", text}); }
  bool is_auto(const std::string& field, const json& v) {
    if (!(v.is_string() && v.get<std::string>() == "auto")) return false;
    note(field, v, "auto: the TOML config's value stays");
    return true;
  }
  double number(const std::string& field, const json& v) const {
    if (!v.is_number()) throw ConfigError(fmt::format("{} = {} is not a number", where(field), show_json(v)));
    return v.get<double>();
  }
  int64_t integer(const std::string& field, const json& v) const {
    const double d = number(field, v);
    if (d != std::floor(d) || std::abs(d) > 1e15) throw ConfigError(fmt::format("{} = {} is not a whole number", where(field), show_json(v)));
    return int64_t(d);
  }
  bool boolean(const std::string& field, const json& v) const {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string() && (v == "true" || v == "false")) return v == "true";
    throw ConfigError(fmt::format("{} = {} is not true or false", where(field), show_json(v)));
  }
  std::string text(const std::string& field, const json& v) const {
    if (!v.is_string()) throw ConfigError(fmt::format("{} = {} is not a string", where(field), show_json(v)));
    return v.get<std::string>();
  }
};

using Handler = std::function<void(Mapper&, const std::string& field, const json& v)>;
using Table = std::map<std::string, Handler>;

// Walks `obj`: each key must be in `table` (a nested object is walked by its own table, given as the key
// "name." with a handler that receives the object).
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

Handler to_key(const std::string& key, std::function<std::string(Mapper&, const std::string&, const json&)> convert = nullptr) {
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

// ---- DeepSpeed ----

struct DeepSpeedState {
  int64_t stage = 0;
  // fp16.enabled as the file says it, read first: the loss scaler's fields mean something only in an fp16
  // run. "auto" (Hugging Face's templates) is resolved as the HF Trainer resolves it, from the run's own
  // precision (here: the TOML's precision.mode), which the mapping does not change
  std::string fp16_enabled = "absent";  // true | false | auto | absent
  bool fp16 = false, bf16 = false, offload_optimizer = false, offload_param = false;
  double reduce_bucket_elements = 0;
  std::string bucket_field;
};

// A loss-scaler field of the fp16 section: a setting when fp16 is on, else a note saying why it is not one.
Handler scaler_field(DeepSpeedState& st, Handler h) {
  return [&st, h](Mapper& m, const std::string& f, const json& v) {
    if (st.fp16_enabled == "true") return h(m, f, v);
    m.note(f, v, st.fp16_enabled == "auto" ? "fp16.enabled is auto: the run's precision.mode decides; the scaler's settings of a "
                                             "TOML in fp16 apply (set them in its [precision])"
                                           : "fp16 is off: no loss scaler");
  };
}

Table deepspeed_table(DeepSpeedState& st) {
  Table fp16 = {
      {"enabled", [&st](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         st.fp16 = m.boolean(f, v);
         if (!st.fp16) return m.note(f, v, "fp16 off");
         m.set(f, v, "precision.mode", "fp16");
         // DeepSpeed's dynamic loss scaler defaults (GradScaler's differ: window 2000, hysteresis 1), first in
         // line so that the section's own loss_scale_window and hysteresis win wherever the file puts them
         m.out.settings.insert(m.out.settings.begin(), {{"precision.growth_interval", "1000", m.where("fp16 (DeepSpeed's default loss_scale_window)")},
                                                        {"precision.hysteresis", "2", m.where("fp16 (DeepSpeed's default hysteresis)")}});
       }},
      {"loss_scale", scaler_field(st, [](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         const double s = m.number(f, v);
         m.set(f, v, "precision.loss_scale", s == 0 ? "dynamic" : fmt::format("{:g}", s));
       })},
      {"initial_scale_power", scaler_field(st, to_key("precision.init_scale", [](Mapper& m, const std::string& f, const json& v) {
         return fmt::format("{}", std::pow(2.0, double(m.integer(f, v))));
       }))},
      {"loss_scale_window", scaler_field(st, to_key("precision.growth_interval", as_int))},
      {"hysteresis", scaler_field(st, to_key("precision.hysteresis", as_int))},
      {"min_loss_scale", scaler_field(st, to_key("precision.min_scale", as_real))},
      {"consecutive_hysteresis", [](Mapper& m, const std::string& f, const json& v) {
         if (m.boolean(f, v)) m.unsupported(f, v, "distlab's hysteresis counts overflows since the last back-off", "set it to false");
         m.note(f, v, "overflows counted since the last back-off (distlab's hysteresis)");
       }},
      {"auto_cast", note_only("distlab casts activations by the precision policy (core/ops/autocast.h)")},
      {"fp16_master_weights_and_grads", [](Mapper& m, const std::string& f, const json& v) {
         if (m.boolean(f, v)) m.unsupported(f, v, "distlab keeps f32 master weights", "set it to false");
         m.note(f, v, "f32 master weights (distlab's)");
       }},
  };
  Table bf16 = {{"enabled", [&st](Mapper& m, const std::string& f, const json& v) {
                   if (m.is_auto(f, v)) return;
                   st.bf16 = m.boolean(f, v);
                   if (st.bf16) m.set(f, v, "precision.mode", "bf16");
                   else m.note(f, v, "bf16 off");
                 }},
                {"immediate_grad_update", note_only("gradients are applied at the step (distlab's only order)")}};
  Table optim_params = {
      {"lr", to_key("optim.lr", as_real)},
      {"betas", [](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         if (!v.is_array() || v.size() != 2) throw ConfigError(fmt::format("{} = {} is not [beta1, beta2]", m.where(f), show_json(v)));
         m.set(f, v, "optim.beta1", as_real(m, f, v[0]));
         m.out.settings.push_back({"optim.beta2", as_real(m, f, v[1]), m.where(f)});
       }},
      {"eps", to_key("optim.eps", as_real)},
      {"weight_decay", to_key("optim.weight_decay", as_real)},
      {"momentum", to_key("optim.momentum", as_real)},
      {"nesterov", to_key("optim.nesterov", as_bool)},
      {"adam_w_mode", [](Mapper& m, const std::string& f, const json& v) {
         if (!m.boolean(f, v)) m.unsupported(f, v, "distlab's Adam decouples weight decay (AdamW)", "use adam_w_mode true, or weight_decay 0");
         m.note(f, v, "decoupled weight decay: AdamW");
       }},
      {"torch_adam", note_only("distlab's own AdamW (core/optim/adamw.h)")},
      {"bias_correction", [](Mapper& m, const std::string& f, const json& v) {
         if (!m.boolean(f, v)) m.unsupported(f, v, "distlab's AdamW corrects the moments' bias", "remove it");
         m.note(f, v, "bias-corrected moments (distlab's AdamW)");
       }},
  };
  Table optimizer = {
      {"type", [](Mapper& m, const std::string& f, const json& v) {
         std::string t = m.text(f, v);
         for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
         if (t == "adam" || t == "adamw" || t == "fusedadam" || t == "cpuadam") m.set(f, v, "optim.name", "adamw");
         else if (t == "sgd") m.set(f, v, "optim.name", "sgd");
         else m.unsupported(f, v, "distlab has SGD and AdamW", "use \"AdamW\" or \"SGD\"");
       }},
      {"params", [optim_params](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, optim_params, f); }},
  };
  Table sched_params = {
      {"warmup_max_lr", to_key("optim.lr", as_real)},
      {"warmup_num_steps", to_key("optim.warmup_steps", as_int)},
      {"total_num_steps", to_key("train.steps", as_int)},
      {"warmup_min_lr", [](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         m.note(f, v, m.number(f, v) == 0 ? "the warmup starts near 0 (distlab's: lr x (step + 1) / warmup_steps)"
                                          : "≈ distlab's warmup starts at lr / warmup_steps, not at this value");
       }},
      {"warmup_min_ratio", note_only("≈ distlab's warmup starts at lr / warmup_steps")},
      {"cos_min_ratio", [](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         if (m.number(f, v) != 0) m.unsupported(f, v, "optim.min_lr is an absolute rate", "set optim.min_lr in the TOML and cos_min_ratio to 0");
         m.note(f, v, "decays to 0 (optim.min_lr = 0)");
       }},
      {"warmup_type", [](Mapper& m, const std::string& f, const json& v) {
         const std::string t = m.text(f, v);
         m.note(f, v, t == "linear" ? "linear warmup (distlab's)" : "≈ distlab warms up linearly, not logarithmically");
       }},
      {"last_batch_iteration", note_only("a resumed run takes its step from the checkpoint")},
  };
  Table scheduler = {
      {"type", [](Mapper& m, const std::string& f, const json& v) {
         const std::string t = m.text(f, v);
         if (t == "WarmupLR") m.set(f, v, "optim.schedule", "constant");
         else if (t == "WarmupDecayLR") m.set(f, v, "optim.schedule", "linear");
         else if (t == "WarmupCosineLR") m.set(f, v, "optim.schedule", "cosine");
         else m.unsupported(f, v, "distlab's schedules are constant, step, cosine and linear, each with a linear warmup",
                            "use WarmupLR, WarmupDecayLR or WarmupCosineLR");
       }},
      {"params", [sched_params](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, sched_params, f); }},
  };
  auto offload_table = [&st](bool optimizer) {
    return Table{
        {"device", [&st, optimizer](Mapper& m, const std::string& f, const json& v) {
           const std::string d = m.text(f, v);
           if (d == "none") return m.note(f, v, "no offload");
           if (d != "cpu") m.unsupported(f, v, "distlab offloads to host memory only (no NVMe tier)", "use \"cpu\"");
           (optimizer ? st.offload_optimizer : st.offload_param) = true;
           m.set(f, v, "parallel.offload", "cpu");
         }},
        {"pin_memory", note_only("always: on a GPU, offloaded parts are page-locked host memory (the cost model's PCIe bandwidth)")},
        {"nvme_path", note_only("no NVMe tier in distlab (device must be cpu)")},
        {"buffer_count", note_only("NVMe buffers (not used with cpu)")},
        {"buffer_size", note_only("NVMe buffers (not used with cpu)")},
        {"max_in_cpu", note_only("everything offloaded stays in host memory")},
        {"fast_init", note_only("NVMe (not used with cpu)")},
        {"ratio", [](Mapper& m, const std::string& f, const json& v) {
           if (m.number(f, v) != 1) m.unsupported(f, v, "distlab offloads all of the optimizer state or none", "remove ratio");
           m.note(f, v, "all of it offloaded");
         }},
    };
  };
  Table zero = {
      {"stage", [&st](Mapper& m, const std::string& f, const json& v) {
         st.stage = m.integer(f, v);
         static const char* names[] = {"ddp", "zero1", "zero2", "zero3"};
         if (st.stage < 0 || st.stage > 3) throw ConfigError(fmt::format("{} = {}: stages are 0 to 3", m.where(f), show_json(v)));
         m.set(f, v, "parallel.strategy", names[st.stage]);
       }},
      {"allgather_partitions", [](Mapper& m, const std::string& f, const json& v) {
         if (!m.boolean(f, v)) m.unsupported(f, v, "distlab all-gathers the updated parts in one collective", "set it to true");
         m.note(f, v, "the updated parts are all-gathered after the step (ZeRO-1/2)");
       }},
      {"allgather_bucket_size", note_only("distlab all-gathers one flat vector per unit")},
      {"overlap_comm", note_only("the reductions overlap the backward: DDP's buckets, ZeRO's units (parallel.ddp_mode = naive shows no overlap)")},
      {"reduce_scatter", [&st](Mapper& m, const std::string& f, const json& v) {
         const bool rs = m.boolean(f, v);
         if (!rs && st.stage >= 2) m.unsupported(f, v, "ZeRO-2 and ZeRO-3 reduce-scatter their gradients", "set it to true");
         m.set(f, v, "parallel.zero_reduce", rs ? "reduce_scatter" : "all_reduce");
       }},
      {"reduce_bucket_size", [&st](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         st.reduce_bucket_elements = m.number(f, v);
         st.bucket_field = f;
       }},
      {"contiguous_gradients", note_only("each unit's gradients are copied into one flat vector (distlab's flats)")},
      {"round_robin_gradients", note_only("each rank owns one contiguous part of every flat vector")},
      {"sub_group_size", note_only("the optimizer steps each flat part at once")},
      {"cpu_offload", [&st](Mapper& m, const std::string& f, const json& v) {
         if (!m.boolean(f, v)) return m.note(f, v, "no offload");
         st.offload_optimizer = true;
         m.set(f, v, "parallel.offload", "cpu");
       }},
      {"offload_optimizer", [t = offload_table(true)](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, t, f); }},
      {"offload_param", [t = offload_table(false)](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, t, f); }},
      {"stage3_prefetch_bucket_size", [](Mapper& m, const std::string& f, const json& v) {
         if (m.is_auto(f, v)) return;
         m.set(f, v, "parallel.prefetch", m.number(f, v) > 0 ? "true" : "false");
       }},
      {"stage3_param_persistence_threshold", note_only("≈ distlab shards every unit, however small")},
      {"stage3_max_live_parameters", note_only("at most the unit in use and the one prefetched are whole")},
      {"stage3_max_reuse_distance", note_only("a unit is freed after its forward and gathered again for its backward")},
      {"stage3_gather_16bit_weights_on_model_save", note_only("--save gathers the whole weights")},
      {"gather_16bit_weights_on_model_save", note_only("--save gathers the whole weights")},
      {"memory_efficient_linear", note_only("distlab's Linear keeps its input for the backward")},
  };
  Table monitor = {{"enabled", note_only("distlab writes metrics as JSON Lines (--metrics FILE)")},
                   {"output_path", note_only("see --metrics")},
                   {"job_name", note_only("see --metrics")},
                   {"project", note_only("see --metrics")},
                   {"team", note_only("see --metrics")},
                   {"group", note_only("see --metrics")}};
  // deepspeed.checkpointing.configure's fields: where the kept inputs live (the section itself turns it on)
  auto must_be_off = [](const char* why) {
    return [why](Mapper& m, const std::string& f, const json& v) {
      if (m.boolean(f, v)) m.unsupported(f, v, why, "set it to false");
      m.note(f, v, "off");
    };
  };
  Table ac = {
      {"partition_activations", must_be_off("it splits each kept input over the model-parallel ranks; distlab's blocks keep theirs whole")},
      {"cpu_checkpointing", must_be_off("it moves the kept inputs to host memory; distlab keeps them on the device")},
      {"contiguous_memory_optimization", note_only("the kept inputs are ordinary activations in the memory table")},
      {"number_checkpoints", note_only("every block keeps its input: one checkpoint per transformer block")},
      {"synchronize_checkpoint_boundary", note_only("the recompute runs in the backward's order, no extra synchronisation")},
      {"profile", note_only("the recompute's FLOPs are in the run's FLOPs per step and its modeled time")},
  };
  Table top = {
      {"train_batch_size", to_key("train.global_batch", as_int)},
      {"train_micro_batch_size_per_gpu", to_key("train.micro_batch", as_int)},
      {"gradient_accumulation_steps", to_key("train.accum_steps", as_int)},
      {"gradient_clipping", to_key("optim.clip_grad_norm", as_real)},
      // DeepSpeed's own log lines (its engine's timers); distlab's progress line is train.log_every's (the
      // HF Trainer's logging_steps), which HF's templates leave alone while setting this to 2000
      {"steps_per_print", note_only("DeepSpeed's own log lines: distlab's progress follows train.log_every")},
      {"wall_clock_breakdown", note_only("the run's summary has wall and modeled time (log.profile for the breakdown)")},
      {"zero_allow_untested_optimizer", note_only("distlab's ZeRO steps SGD and AdamW")},
      {"zero_force_ds_cpu_optimizer", note_only("an offloaded step runs on the host's CPU")},
      {"communication_data_type", [](Mapper& m, const std::string& f, const json& v) {
         std::string t = m.text(f, v);
         if (t == "fp16" || t == "bf16" || t == "fp32") m.set(f, v, "precision.reduce_dtype", t);
         else m.unsupported(f, v, "gradients travel in fp32, bf16 or fp16", "use one of those");
       }},
      {"prescale_gradients", [](Mapper& m, const std::string& f, const json& v) {
         if (m.boolean(f, v)) m.unsupported(f, v, "distlab divides by the world after the sum", "set it to false");
         m.note(f, v, "gradients are divided by the world after the sum");
       }},
      {"gradient_predivide_factor", [](Mapper& m, const std::string& f, const json& v) {
         if (m.number(f, v) != 1) m.unsupported(f, v, "distlab divides by the world after the sum", "use 1.0");
         m.note(f, v, "no pre-division");
       }},
      {"fp16", [fp16](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, fp16, f); }},
      {"bf16", [bf16](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, bf16, f); }},
      {"optimizer", [optimizer](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, optimizer, f); }},
      {"scheduler", [scheduler](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, scheduler, f); }},
      {"zero_optimization", [zero](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, zero, f); }},
      {"tensorboard", [monitor](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, monitor, f); }},
      {"wandb", [monitor](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, monitor, f); }},
      {"csv_monitor", [monitor](Mapper& m, const std::string& f, const json& v) { walk_json(m, v, monitor, f); }},
      {"flops_profiler", note_only("the run's summary has FLOPs per step; log.profile models the time")},
      // DeepSpeed's activation checkpointing (deepspeed.checkpointing, which Megatron-DeepSpeed wraps around every
      // transformer layer): the section turns it on; its fields say where the kept inputs live
      {"activation_checkpointing", [ac](Mapper& m, const std::string& f, const json& v) {
         if (!v.is_object()) m.unsupported(f, v, "it is a section of fields", "write activation_checkpointing: {} (every block checkpointed)");
         m.set(f, "{...}", "train.activation_checkpointing", "full");
         walk_json(m, v, ac, f);
       }},
      {"data_types", [](Mapper& m, const std::string& f, const json& v) {
         if (!v.is_object() || (v.contains("grad_accum_dtype") && v["grad_accum_dtype"] != "fp32" && !v["grad_accum_dtype"].is_null()))
           m.unsupported(f, v, "gradients accumulate in the parameters' dtype, reduced in precision.reduce_dtype", "remove data_types");
         m.note(f, v, "accumulation in the parameters' dtype");
       }},
  };
  return top;
}

void finish_deepspeed(Mapper& m, const DeepSpeedState& st) {
  if ((st.offload_optimizer || st.offload_param) && st.stage < 2)
    throw ConfigError(fmt::format("{}: offload with zero_optimization.stage {}", m.out.file, st.stage),
                      "distlab offloads ZeRO-2's optimizer state (ZeRO-Offload) or ZeRO-3's parameters and state: use stage 2 or 3");
  if (st.offload_param && st.stage != 3)
    throw ConfigError(fmt::format("{}: offload_param with stage {}", m.out.file, st.stage), "offloading parameters needs stage 3 (as in DeepSpeed)");
  if (st.stage == 3 && st.offload_param != st.offload_optimizer)
    m.note("zero_optimization.offload_*", st.offload_param ? "offload_param only" : "offload_optimizer only",
           "≈ distlab's ZeRO-3 offloads the parameters and the optimizer state together");
  if (st.reduce_bucket_elements > 0) {
    const double bytes = st.fp16 || st.bf16 ? 2 : 4;  // elements of the gradients' dtype
    const double mb = st.reduce_bucket_elements * bytes / double(1 << 20);
    m.set(st.bucket_field, st.reduce_bucket_elements, "parallel.bucket_mb", fmt::format("{:.6g}", mb));
  }
}

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

EcosystemConfig read_file(const std::string& path, const std::string& what, EcosystemConfig (*map)(const std::string&, const std::string&));

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

EcosystemConfig read_file(const std::string& path, const std::string& what, EcosystemConfig (*map)(const std::string&, const std::string&)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw ConfigError(fmt::format("{} file '{}' does not exist or is not a file", what, path));
  if (std::filesystem::file_size(path, ec) > (1u << 20)) throw ConfigError(fmt::format("{} file '{}' is larger than 1 MiB", what, path));
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{} file '{}' cannot be read", what, path));
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return map(text, path);
}

}  // namespace

EcosystemConfig map_deepspeed(const std::string& text, const std::string& name) {
  check_nesting(text, name);
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    throw ConfigError(fmt::format("{}: not a JSON object", name), "a DeepSpeed config is one JSON object: {\"zero_optimization\": {...}, ...}");
  Mapper m;
  m.out.file = name;
  m.out.format = "deepspeed";
  DeepSpeedState st;
  // the stage first: what reduce_scatter and offload mean depends on it
  if (doc.contains("zero_optimization") && doc["zero_optimization"].is_object() && doc["zero_optimization"].contains("stage") &&
      doc["zero_optimization"]["stage"].is_number_integer())
    st.stage = doc["zero_optimization"]["stage"].get<int64_t>();
  if (doc.contains("fp16") && doc["fp16"].is_object() && doc["fp16"].contains("enabled")) {
    const json& e = doc["fp16"]["enabled"];
    st.fp16_enabled = e.is_boolean() ? (e.get<bool>() ? "true" : "false") : e.is_string() && e == "auto" ? "auto" : e.is_string() && e == "true" ? "true" : "false";
  }
  const Table top = deepspeed_table(st);
  walk_json(m, doc, top, "");
  finish_deepspeed(m, st);
  return m.out;
}

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
