// DeepSpeed's JSON config as distlab settings (`--deepspeed ds_config.json`): each field of
// zero_optimization, fp16/bf16, the optimizer and scheduler, batch sizes and clipping mapped to a distlab key
// or a note (core/config/ecosystem.h says the rules). The stage and fp16.enabled are read first: what
// reduce_scatter, offload and the loss scaler's fields mean depends on them.
// Read next: core/config/config.h (the keys these map to); core/config/ecosystem.cpp reads FSDP's YAML.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "core/config/ecosystem.h"
#include "core/config/ecosystem_map.h"
#include "core/util/error.h"
#include "core/util/nesting.h"

namespace distlab {

namespace {

using namespace ecosystem;

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

}  // namespace distlab
