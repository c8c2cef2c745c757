// The ecosystem's config files read as distlab settings (core/config/ecosystem.h): every DeepSpeed and FSDP
// field becomes a key or a note; unknown and unsupported fields are errors that name them.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/config/ecosystem.h"
#include "core/util/error.h"

using namespace distlab;
namespace fs = std::filesystem;

namespace {

RunConfig with(const EcosystemConfig& e, const std::string& toml = "", const std::vector<std::string>& sets = {}) {
  return parse_config(toml, "t.toml", sets, e.settings);
}

const MappedField* field(const EcosystemConfig& e, const std::string& name) {
  for (const MappedField& f : e.fields)
    if (f.field == name) return &f;
  return nullptr;
}

}  // namespace

TEST_CASE("DeepSpeed JSON: the course text's ZeRO-2 example maps field by field", "[config][ecosystem]") {
  // the seed's deepspeed_config.json fragment, verbatim
  const EcosystemConfig e = map_deepspeed(R"({
  "zero_optimization": {"stage": 2, "allgather_partitions": true, "overlap_comm": true, "reduce_scatter": true},
  "train_batch_size": 32,
  "fp16": {"enabled": true}
})", "ds.json");
  REQUIRE(e.fields.size() == 6);
  CHECK(e.fields[0].field == "zero_optimization.stage");  // the file's order
  CHECK(field(e, "zero_optimization.stage")->setting == "zero2");
  CHECK(field(e, "zero_optimization.overlap_comm")->key.empty());  // a note: distlab overlaps anyway
  CHECK_THAT(field(e, "zero_optimization.overlap_comm")->setting, Catch::Contains("overlap the backward"));
  const RunConfig c = with(e);
  CHECK(c.parallel.strategy == StrategyKind::zero2);
  CHECK(c.parallel.zero_reduce == ZeroReduce::reduce_scatter);
  CHECK(c.train.global_batch == 32);
  CHECK(c.precision.mode == "fp16");
  CHECK(c.precision.effective_loss_scale() == "dynamic");
  CHECK(c.precision.growth_interval == 1000);  // DeepSpeed's loss_scale_window default, not GradScaler's 2000
  CHECK(c.precision.hysteresis == 2);
  CHECK(c.origin.at("parallel.strategy") == "ds.json: zero_optimization.stage");
  CHECK_THAT(describe_mapping(e), Catch::Contains("zero_optimization.stage = 2") && Catch::Contains("parallel.strategy = zero2"));
  // a --set still wins over the file
  CHECK(with(e, "", {"parallel.strategy=zero1"}).parallel.strategy == StrategyKind::zero1);
}

TEST_CASE("DeepSpeed JSON: optimizer, scheduler, loss scaler, offload, buckets and auto", "[config][ecosystem]") {
  const EcosystemConfig e = map_deepspeed(R"({
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "gradient_clipping": 1.0, "steps_per_print": 20,
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 4, "min_loss_scale": 1},
  "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 100, "total_num_steps": 1000}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "reduce_bucket_size": 5e8,
                        "contiguous_gradients": true},
  "communication_data_type": "bf16",
  "wall_clock_breakdown": false
})", "ds.json");
  const RunConfig c = with(e);
  CHECK(c.train.micro_batch == 4);
  CHECK(c.train.accum_steps == 8);
  CHECK(c.optim.clip_grad_norm == 1.0);
  // steps_per_print is DeepSpeed's own log lines: HF's templates set 2000 and it silenced distlab's progress
  CHECK(c.train.log_every == RunConfig{}.train.log_every);
  CHECK(field(e, "steps_per_print")->key.empty());
  CHECK(c.precision.init_scale == 4096);
  CHECK(c.precision.growth_interval == 500);
  CHECK(c.precision.hysteresis == 4);
  CHECK(c.optim.name == OptimizerKind::adamw);  // DeepSpeed's Adam decouples weight decay by default (adam_w_mode)
  CHECK(c.optim.lr == 3e-4);
  CHECK(c.optim.beta2 == 0.95);
  CHECK(c.optim.schedule == LrSchedule::linear);
  CHECK(c.optim.warmup_steps == 100);
  CHECK(c.train.steps == 1000);
  CHECK(c.parallel.strategy == StrategyKind::zero2);
  CHECK(c.parallel.offload == OffloadTo::cpu);  // ZeRO-Offload
  CHECK(c.parallel.bucket_mb == Approx(5e8 * 2 / (1 << 20)));  // elements of fp16 gradients
  CHECK(c.precision.reduce_dtype == "bf16");
  // the section's own window and hysteresis win over DeepSpeed's defaults, before or after "enabled"
  const RunConfig late = with(map_deepspeed(R"({"fp16": {"loss_scale_window": 500, "hysteresis": 3, "enabled": true}})", "late.json"));
  CHECK(late.precision.growth_interval == 500);
  CHECK(late.precision.hysteresis == 3);
  // "auto" leaves the TOML's value
  const EcosystemConfig a = map_deepspeed(R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}})", "a.json");
  const RunConfig ca = with(a, "[train]\nmicro_batch = 6\n");
  CHECK(ca.train.micro_batch == 6);
  CHECK(ca.precision.mode == "fp32");
  CHECK_THAT(field(a, "bf16.enabled")->setting, Catch::Contains("auto"));
  // HF's DeepSpeed template: fp16.enabled "auto" in an fp32 run turned on a dynamic loss scale (loss_scale 0)
  const EcosystemConfig hf = map_deepspeed(R"({"fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
    "hysteresis": 2, "min_loss_scale": 1}, "steps_per_print": 2000})", "hf.json");
  const RunConfig chf = with(hf);
  CHECK(chf.precision.mode == "fp32");
  CHECK(chf.precision.effective_loss_scale() == RunConfig{}.precision.effective_loss_scale());
  CHECK(chf.train.log_every == RunConfig{}.train.log_every);
  CHECK_THAT(field(hf, "fp16.loss_scale")->setting, Catch::Contains("auto"));
  // fp16 on: the scaler's fields apply, wherever "enabled" stands
  CHECK(with(map_deepspeed(R"({"fp16": {"loss_scale": 0, "enabled": true}})", "on.json")).precision.effective_loss_scale() == "dynamic");
}

TEST_CASE("accelerate's DEEPSPEED config: its inline fields or its deepspeed_config_file, through --deepspeed and --fsdp-config", "[config][ecosystem]") {
  // was: unknown field 'deepspeed_config', with ~85 field names, printed twice
  const EcosystemConfig inl = map_fsdp("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                       "  gradient_accumulation_steps: 4\n  gradient_clipping: 1.0\n  offload_optimizer_device: cpu\n"
                                       "  offload_param_device: none\n  zero3_init_flag: false\n  zero_stage: 2\nmixed_precision: bf16\nnum_processes: 2\n",
                                       "acc_ds.yaml");
  const RunConfig c = with(inl);
  CHECK(c.parallel.strategy == StrategyKind::zero2);
  CHECK(c.parallel.offload == OffloadTo::cpu);
  CHECK(c.train.accum_steps == 4);
  CHECK(c.optim.clip_grad_norm == 1.0);
  CHECK(c.precision.mode == "bf16");
  // a deepspeed_config_file beside the YAML: its JSON mapped as --deepspeed maps it; the YAML itself through --deepspeed
  const fs::path dir = fs::temp_directory_path() / ("distlab-accds-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "ds.json") << R"({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2})";
  std::ofstream(dir / "acc.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n";
  const RunConfig f = with(read_deepspeed_config((dir / "acc.yaml").string()));
  CHECK(f.parallel.strategy == StrategyKind::zero3);
  CHECK(f.train.micro_batch == 2);
  CHECK(with(read_fsdp_config((dir / "acc.yaml").string())).parallel.strategy == StrategyKind::zero3);
  // a YAML naming itself is read as JSON and refused, not followed forever
  std::ofstream(dir / "self.yaml") << "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: self.yaml\n";
  CHECK_THROWS_WITH(read_deepspeed_config((dir / "self.yaml").string()), Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(map_fsdp("distributed_type: DEEPSPEED\n", "bare.yaml"), Catch::Contains("without a deepspeed_config section"));
  fs::remove_all(dir);
}

TEST_CASE("activation checkpointing from DeepSpeed, accelerate and the HF Trainer: every block checkpointed", "[config][ecosystem][checkpointing]") {
  // DeepSpeed: the section turns it on (Megatron-DeepSpeed checkpoints every layer); its fields say where
  // the kept inputs live
  const EcosystemConfig ds = map_deepspeed(R"({"activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false,
    "contiguous_memory_optimization": true, "number_checkpoints": 12, "synchronize_checkpoint_boundary": false, "profile": true}})", "ds.json");
  CHECK(with(ds).model.checkpointing == Checkpointing::full);
  CHECK(with(map_deepspeed("{}", "none.json")).model.checkpointing == Checkpointing::none);
  // accelerate's FSDP plugin and the Trainer's gradient_checkpointing
  const RunConfig acc = with(map_fsdp("distributed_type: FSDP\nfsdp_config:\n  fsdp_activation_checkpointing: true\n", "acc.yaml"));
  CHECK(acc.model.checkpointing == Checkpointing::full);
  const RunConfig off = with(map_fsdp("distributed_type: FSDP\nfsdp_config:\n  fsdp_activation_checkpointing: false\n", "off.yaml"));
  CHECK(off.model.checkpointing == Checkpointing::none);
  const EcosystemConfig hf = map_fsdp("gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n", "hf.yaml");
  CHECK(with(hf).model.checkpointing == Checkpointing::full);
  CHECK_THAT(field(hf, "gradient_checkpointing_kwargs")->setting, Catch::Contains("explicit"));
  // the file's setting wins over the TOML's, as a --set does
  CHECK(with(map_fsdp("gradient_checkpointing: false\n", "hf.yaml"), "[train]\nactivation_checkpointing = \"selective\"\n").model.checkpointing ==
        Checkpointing::none);
}

TEST_CASE("DeepSpeed JSON: unknown and unsupported fields are errors that name them", "[config][ecosystem]") {
  auto error_of = [](const std::string& text) {
    try {
      map_deepspeed(text, "ds.json");
    } catch (const ConfigError& e) {
      return e.full();
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of(R"({"zero_optimization": {"stgae": 2}})"),
             Catch::Contains("ds.json: unknown field 'zero_optimization.stgae'") && Catch::Contains("stage"));
  CHECK_THAT(error_of(R"({"train_batch_sise": 8})"), Catch::Contains("unknown field 'train_batch_sise'"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}})"),
             Catch::Contains("zero_optimization.offload_param.device = nvme is not supported") && Catch::Contains("NVMe"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})"),
             Catch::Contains("offload with zero_optimization.stage 1") && Catch::Contains("stage 2 or 3"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 5}})"), Catch::Contains("stages are 0 to 3"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": 2, "reduce_scatter": false}})"), Catch::Contains("reduce_scatter = false is not supported"));
  CHECK_THAT(error_of(R"({"optimizer": {"type": "Lamb"}})"), Catch::Contains("optimizer.type = Lamb is not supported"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"partition_activations": true}})"),
             Catch::Contains("activation_checkpointing.partition_activations = true is not supported"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"cpu_checkpointing": true}})"),
             Catch::Contains("activation_checkpointing.cpu_checkpointing = true is not supported") && Catch::Contains("host memory"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": {"number_checkpoint": 4}})"),
             Catch::Contains("unknown field 'activation_checkpointing.number_checkpoint'"));
  CHECK_THAT(error_of(R"({"activation_checkpointing": true})"), Catch::Contains("activation_checkpointing = true is not supported"));
  CHECK_THAT(error_of(R"({"gradient_clipping": "one"})"), Catch::Contains("gradient_clipping = one is not a number"));
  CHECK_THAT(error_of("[1, 2]"), Catch::Contains("not a JSON object"));
  CHECK_THAT(error_of("{\"fp16\": "), Catch::Contains("not a JSON object"));
  // the values reach the config's own checks, which name the file and field
  const EcosystemConfig bad = map_deepspeed(R"({"gradient_accumulation_steps": 0})", "ds.json");
  CHECK_THROWS_WITH(with(bad), Catch::Contains("ds.json: gradient_accumulation_steps") && Catch::Contains("train.accum_steps"));
  CHECK_THROWS_WITH(read_deepspeed_config("/nonexistent/ds.json"), Catch::Contains("does not exist"));
}

TEST_CASE("FSDP YAML: accelerate's config file and a Trainer-style recipe", "[config][ecosystem]") {
  const EcosystemConfig acc = map_fsdp(R"(# accelerate config
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 100000
  fsdp_backward_prefetch: NO_PREFETCH
  fsdp_forward_prefetch: false
  fsdp_offload_params: true
  fsdp_sharding_strategy: 2          # SHARD_GRAD_OP by number
  fsdp_state_dict_type: FULL_STATE_DICT
mixed_precision: bf16
num_machines: 1
num_processes: 4
tpu_env: []
)", "acc.yaml");
  const RunConfig c = with(acc);
  CHECK(c.parallel.strategy == StrategyKind::fsdp);
  CHECK(c.parallel.sharding == Sharding::shard_grad_op);
  CHECK(c.parallel.offload == OffloadTo::cpu);
  CHECK(c.parallel.prefetch == false);
  CHECK(c.parallel.forward_prefetch == false);  // its own key: backward's prefetch stays as fsdp_backward_prefetch says
  CHECK(c.origin.at("parallel.forward_prefetch") == "acc.yaml: fsdp_config.fsdp_forward_prefetch");
  CHECK(with(map_fsdp("distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch: BACKWARD_PRE\n  fsdp_forward_prefetch: false\n", "b.yaml")).parallel.prefetch == true);
  CHECK(c.parallel.wrap_min_params == 100000);
  CHECK(c.precision.mode == "bf16");
  CHECK(acc.world_size == 4);
  CHECK(c.origin.at("parallel.sharding") == "acc.yaml: fsdp_config.fsdp_sharding_strategy");

  // the course text's LLaMA-Factory lines: fsdp: full_shard auto_wrap, fsdp_config: fsdp_offload_params
  const EcosystemConfig lf = map_fsdp(R"(
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
learning_rate: 1.0e-5
lr_scheduler_type: cosine
bf16: true
model_name_or_path: some/model
finetuning_type: full
fsdp: full_shard auto_wrap
fsdp_config:
  fsdp_offload_params: false     # true = offload to the CPU too (leaner, slower)
  min_num_params: 0
)", "lf.yaml");
  const RunConfig d = with(lf);
  CHECK(d.parallel.strategy == StrategyKind::fsdp);
  CHECK(d.parallel.sharding == Sharding::full_shard);
  CHECK(d.parallel.offload == OffloadTo::none);
  CHECK(d.train.micro_batch == 2);
  CHECK(d.train.accum_steps == 4);
  CHECK(d.optim.lr == 1e-5);
  CHECK(d.optim.schedule == LrSchedule::cosine);
  CHECK(d.precision.mode == "bf16");
  CHECK(field(lf, "finetuning_type")->key == "lora.r");  // full: no adapters
  CHECK(d.lora.r == 0);
  CHECK(lf.world_size == 0);

  auto error_of = [](const std::string& text) {
    try {
      map_fsdp(text, "f.yaml");
    } catch (const ConfigError& e) {
      return e.full();
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n"),
             Catch::Contains("fsdp_config.fsdp_sharding_strategy = HYBRID_SHARD is not supported"));
  CHECK_THAT(error_of("distributed_type: FSDP\nfsdp_config:\n  fsdp_shardng_strategy: FULL_SHARD\n"),
             Catch::Contains("unknown field 'fsdp_config.fsdp_shardng_strategy'"));
  CHECK_THAT(error_of("mixed_precision: fp8\n"), Catch::Contains("mixed_precision = fp8 is not supported"));
  CHECK_THAT(error_of("fsdp: hybrid_shard\n"), Catch::Contains("hybrid_shard is not supported"));
  CHECK_THAT(error_of("gradient_checkpointing: yes please\n"), Catch::Contains("gradient_checkpointing"));
  CHECK_THAT(error_of("distributed_type: DEEPSPEED\n"), Catch::Contains("--deepspeed"));
  CHECK_THAT(error_of("fsdp_config:\n  fsdp_offload_params: true\n"), Catch::Contains("fsdp_config without distributed_type"));
  // the YAML reader's limits, named with the line
  CHECK_THAT(error_of("a: 1\nb: &x 2\n"), Catch::Contains("f.yaml:2") && Catch::Contains("anchors"));
  CHECK_THAT(error_of("a: 1\na: 2\n"), Catch::Contains("f.yaml:2: 'a' appears twice"));
  CHECK_THAT(error_of("a: 1\n  b: 2\n"), Catch::Contains("f.yaml:2"));
  CHECK_THAT(error_of("just text\n"), Catch::Contains("f.yaml:1: 'just text' is not a key: value line"));
  CHECK_THAT(error_of("a: \"open\n"), Catch::Contains("unterminated"));
}

TEST_CASE("the YAML subset: nesting, lists, quotes, comments and scalars", "[config][ecosystem]") {
  const auto y = parse_yaml_subset(R"(
top:
  inner: 'quoted # not a comment'
  n: 3   # a comment
  x: 2.5e-3
  list:
  - a
  - 2
  flow: [1, two, true]
  empty: {}
  nothing:
flag: False
url: "http://h:29500"
)", "y.yaml");
  CHECK(y["top"]["inner"] == "quoted # not a comment");
  CHECK(y["top"]["n"] == 3);
  CHECK(y["top"]["x"].get<double>() == 2.5e-3);
  CHECK(y["top"]["list"][0] == "a");
  CHECK(y["top"]["list"][1] == 2);
  CHECK(y["top"]["flow"][2] == true);
  CHECK(y["top"]["empty"].is_object());
  CHECK(y["top"]["nothing"].is_null());
  CHECK(y["flag"] == false);
  CHECK(y["url"] == "http://h:29500");
}

TEST_CASE("LLaMA-Factory's LoRA fields map onto [lora] field by field, with its defaults, and quantization_bit onto [quantization]", "[config][ecosystem][lora]") {
  const EcosystemConfig lf = map_fsdp(R"(
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
stage: sft
finetuning_type: lora
lora_target: q_proj,v_proj
lora_rank: 16
lora_dropout: 0.05
per_device_train_batch_size: 1
bf16: true
)", "lf.yaml");
  const RunConfig c = with(lf);
  CHECK(c.lora.r == 16);
  CHECK(c.lora.alpha == 32.0);  // LLaMA-Factory: lora_alpha defaults to twice the rank
  CHECK(c.lora.dropout == 0.05);
  CHECK(c.lora.target_modules == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(c.origin.at("lora.r") == "lf.yaml: lora_rank");
  CHECK(field(lf, "lora_alpha")->value == "(absent: twice lora_rank)");
  // a recipe without finetuning_type is LoRA (LLaMA-Factory's default): rank 8, alpha 16, every linear layer
  const RunConfig d = with(map_fsdp("stage: sft\nlearning_rate: 1.0e-4\n", "d.yaml"));
  CHECK(d.lora.r == 8);
  CHECK(d.lora.alpha == 16.0);
  CHECK(d.lora.target_modules == std::vector<std::string>{"all-linear"});
  // a plain accelerate file is no recipe: nothing of [lora] is set
  CHECK(with(map_fsdp("distributed_type: FSDP\n", "a.yaml")).lora.r == 0);
  auto error_of = [](const std::string& text) {
    try {
      map_fsdp(text, "q.yaml");
    } catch (const ConfigError& e) {
      return e.full();
    }
    return std::string("no error");
  };
  // QLoRA: quantization_bit 4 (bitsandbytes' NF4, double quantization by default)
  const EcosystemConfig q = map_fsdp("finetuning_type: lora\nlora_rank: 16\nquantization_bit: 4\n", "q4.yaml");
  const RunConfig qc = with(q);
  CHECK(qc.quantization.bits == 4);
  CHECK(qc.quantization.type == "nf4");
  CHECK(qc.quantization.double_quant);
  CHECK(qc.origin.at("quantization.bits") == "q4.yaml: quantization_bit");
  CHECK(field(q, "double_quantization")->value == "(absent: true)");
  CHECK_FALSE(with(map_fsdp("finetuning_type: lora\nquantization_bit: 4\ndouble_quantization: false\n", "q.yaml")).quantization.double_quant);
  CHECK_THAT(error_of("finetuning_type: lora\nquantization_bit: 8\n"), Catch::Contains("quantization_bit = 8 is not supported"));
  CHECK_THAT(error_of("finetuning_type: lora\nquantization_bit: 4\nquantization_type: fp4\n"), Catch::Contains("quantization_type = fp4"));
  CHECK_THAT(error_of("finetuning_type: lora\nquantization_bit: 4\nquantization_method: gptq\n"), Catch::Contains("quantization_method = gptq"));
  CHECK_THAT(error_of("finetuning_type: full\nquantization_bit: 4\n"), Catch::Contains("nothing would train"));
  CHECK_THAT(error_of("finetuning_type: freeze\n"), Catch::Contains("finetuning_type = freeze is not supported"));
  CHECK_THAT(error_of("finetuning_type: lora\nlora_rank: 0\n"), Catch::Contains("lora_rank = 0 is not a positive whole number"));
}
