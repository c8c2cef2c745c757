// --init and --save: the whole model's weights into a run and out of it (safetensors, Hugging Face names),
// whatever holds them — every rank whole (none, DDP), in parts (ZeRO, FSDP: gathered for the call, from the
// f32 masters for a save), or split by tensor and pipeline parallelism (a whole model built on the side).
// The loop that calls these is trainer.cpp.
#include <fmt/format.h>

#include <map>
#include <set>

#include "core/ckpt/peft_adapter.h"
#include "core/ckpt/safetensors.h"
#include "core/models/peft.h"
#include "core/models/zoo.h"
#include "core/parallel/tensor_parallel.h"
#include "core/train/trainer.h"

namespace distlab {

// The whole model of --init and --save lives on the host (f32, its own accountant, only for the call):
// a cuda rank's split model reads and writes it through OnHost and Tensor::to_host/from_host.
static DeviceKind whole_model_device(DeviceKind d) { return d == DeviceKind::cuda ? DeviceKind::cpu : d; }

std::unique_ptr<Model> Trainer::whole_model(Runtime& side) {
  ModelSpec whole_spec = spec_;
  whole_spec.context = nullptr;  // the side model runs no forward: whole sequences, no ring
  auto whole = build_model(side, whole_spec);
  if (cfg_.lora.on()) apply_lora(side, *whole, lora_, cfg_.train.seed);  // its adapters drawn as one rank's run draws them
  return whole;
}

void Trainer::load_init(const std::string& path) {
  if (!resumed_from_.empty()) {
    log_ << "--init " << path << " ignored: the run resumes from its checkpoint\n";
    return;
  }
  strategy_->gather_full_params(rt_, nullptr);  // sharded: whole for the load, then each rank takes its part
  if (split_model()) {
    load_whole_model(path);
  } else {
    load_model(*model_, path);
  }
  strategy_->release_full_params(rt_, true);
  if (split_model()) return;
  if (strategy_->shards_parameters()) rt_.memory.empty_cache();
  log_ << "loaded weights from " << path << "\n";
}

void Trainer::save_weights(const std::string& path, const std::string& dtype) {
  // every rank: a sharded strategy gathers the weights whole, from the f32 masters where it has them
  strategy_->gather_full_params(rt_, opt_.get());
  if (split_model()) {
    save_whole_model(path, parse_float_dtype(dtype));
  } else if (is_rank0()) {
    save_model(*model_, path, parse_float_dtype(dtype), opt_.get());  // 16-bit params: their f32 masters
    log_ << "saved weights to " << path << " (" << dtype << ")\n";
  }
  strategy_->release_full_params(rt_, false);
}

// --init-adapter and --save-adapter: PEFT's adapter folder (core/ckpt/peft_adapter.h). Over data parallelism
// every rank holds the adapters whole (or gathers them): each loads the folder, rank 0 writes it. Split by
// tensor parallelism, the folder goes through the whole model on the side, as --init and --save do.
void Trainer::load_adapter_dir(const std::string& dir) {
  if (!cfg_.lora.on()) throw ConfigError("--init-adapter without LoRA: lora.r is 0", "set lora.r, lora.alpha and lora.target_modules as the adapter's adapter_config.json says");
  if (!resumed_from_.empty()) {
    log_ << "--init-adapter " << dir << " ignored: the run resumes from its checkpoint\n";
    return;
  }
  strategy_->gather_full_params(rt_, nullptr);  // sharded: whole for the load, then each rank takes its part
  if (split_model()) {
    Runtime side(whole_model_device(rt_.device));
    auto whole = whole_model(side);
    load_adapter(*whole, cfg_.lora, dir);
    ProcessGroup& tp = mesh_->group(MeshAxis::tp);
    // the adapters alone: the base stays as --init or the seed made it
    load_split_params(trainable(model_->parameters()), whole->parameters(), tp.rank(), tp.size());
  } else {
    load_adapter(*model_, cfg_.lora, dir);
  }
  strategy_->release_full_params(rt_, true);
  log_ << "loaded LoRA adapters from " << dir << (split_model() ? " (this rank's part of them)\n" : "\n");
}

void Trainer::save_adapter_dir(const std::string& dir, const std::string& dtype) {
  if (!cfg_.lora.on()) throw ConfigError("--save-adapter without LoRA: lora.r is 0", "set lora.r to train adapters, or --save the whole model");
  strategy_->gather_full_params(rt_, opt_.get());
  if (split_model()) {  // the TP group's slices put together (from the f32 masters), rank 0 writes
    Runtime side(whole_model_device(rt_.device));
    auto whole = whole_model(side);
    gather_split_params(mesh_->group(MeshAxis::tp), trainable(model_->parameters()), whole->parameters(), opt_.get());
    if (is_rank0()) save_adapter(*whole, cfg_.lora, dir, parse_float_dtype(dtype), nullptr, "");
  } else if (is_rank0()) {
    save_adapter(*model_, cfg_.lora, dir, parse_float_dtype(dtype), opt_.get(), "");
  }
  if (is_rank0())
    log_ << "saved LoRA adapters to " << dir << " (PEFT's adapter_config.json and adapter_model.safetensors, " << dtype
         << (split_model() ? fmt::format(", gathered from {} tensor-parallel rank(s))\n", mesh_->shape().tp) : ")\n");
  strategy_->release_full_params(rt_, false);
}

// --init under tensor or pipeline parallelism: the file holds the whole model; each rank takes its stage's
// parameters, and its slices of the split ones

void Trainer::load_whole_model(const std::string& path) {
  Runtime side(whole_model_device(rt_.device));
  auto whole = whole_model(side);
  load_model(*whole, path);
  ProcessGroup& tp = mesh_->group(MeshAxis::tp);
  load_split_params(model_->parameters(), whole->parameters(), tp.rank(), tp.size());
  std::map<std::string, Buffer*> bufs;
  for (Buffer* b : whole->buffers()) bufs[b->name] = b;
  for (Buffer* b : model_->buffers())
    if (b->data.data()) b->data.from_host(bufs.at(b->name)->data.data());  // the same dtype (f32 statistics)
  log_ << "loaded weights from " << path << " (this rank's part of them)\n";
}

// --save under tensor or pipeline parallelism: each stage's TP group gathers its slices (from the f32
// masters) into whole tensors, the stages' first ranks send theirs to rank 0, and rank 0 writes the whole
// model — the same file a one-rank run writes, loadable by PyTorch
void Trainer::save_whole_model(const std::string& path, DType dtype) {
  Runtime side(whole_model_device(rt_.device));
  auto whole = whole_model(side);
  gather_split_params(mesh_->group(MeshAxis::tp), model_->parameters(), whole->parameters(), opt_.get());
  // every tensor of the whole model (parameters, then buffers) and whether this stage holds it
  std::vector<std::pair<std::string, Tensor*>> all;
  std::set<std::string> mine;
  for (Parameter* p : whole->parameters()) all.push_back({p->name, &p->data});
  for (Buffer* b : whole->buffers()) all.push_back({b->name, &b->data});
  for (Parameter* p : model_->parameters())
    if (p->tied.empty()) mine.insert(p->name);
  std::map<std::string, Tensor*> by_name(all.begin(), all.end());
  for (Buffer* b : model_->buffers()) {  // every rank's own BatchNorm statistics; rank 0's (and its stage's) are saved
    mine.insert(b->name);
    if (b->data.data()) b->data.to_host(by_name.at(b->name)->data());
  }
  if (pipeline_ && mesh_->coord().first_replica() && mesh_->coord().tp == 0) {
    // the stages' first ranks send rank 0 what they hold, in the whole model's order
    const std::string key = fmt::format("save/{}/stage/", path);
    if (pipeline_->stage() > 0) {
      nlohmann::json names = nlohmann::json::array();
      for (const auto& [name, t] : all)
        if (mine.count(name)) names.push_back(name);
      pg_->store().set_string(key + std::to_string(pipeline_->stage()), names.dump());
      for (const auto& [name, t] : all)
        if (mine.count(name)) pg_->send(t->f32(), t->numel(), 0, 5);
    } else {
      for (int s = 1; s < pipeline_->stages(); s++) {
        const int from = rank_of(MeshCoord{0, 0, s}, mesh_->shape());
        for (const auto& n : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(s)))) {
          Tensor* t = by_name.at(n.get<std::string>());
          pg_->recv(t->f32(), t->numel(), from, 5);
        }
      }
    }
  }
  if (is_rank0()) {
    save_model(*whole, path, dtype);
    log_ << "saved weights to " << path << " (" << dtype_name(dtype) << ", gathered from " << mesh_->shape().tp << " tensor-parallel rank(s) x "
         << mesh_->shape().pp << " stage(s))\n";
  }
}

}  // namespace distlab
