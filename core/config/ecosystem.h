// The ecosystem's config files, read as distlab settings: a DeepSpeed JSON (`--deepspeed ds_config.json`)
// and an FSDP config in YAML (`--fsdp-config fsdp.yaml`: accelerate's config file with distributed_type
// FSDP and its fsdp_config section, or a Trainer/LLaMA-Factory style file with `fsdp: full_shard
// auto_wrap` and `fsdp_config:`). Every field becomes a distlab key (`zero_optimization.stage 2` ->
// parallel.strategy = zero2), or a note saying how distlab already behaves that way (overlap_comm: DDP's
// and ZeRO's reductions overlap the backward); a field that is unknown, or whose value distlab cannot
// honour (offload to NVMe, hybrid sharding), is an error that names it -- never silently dropped.
// "auto" (what Hugging Face's integration fills in) leaves the key to the TOML config.
// Read next: core/config/config.h (the keys these map to), chapters/06-zero.md and 07-fsdp-offload.md.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/config/yaml_subset.h"

namespace distlab {

// One field of the file and what it became.
struct MappedField {
  std::string field;    // "zero_optimization.stage"
  std::string value;    // "2"
  std::string key;      // "parallel.strategy" ("" when the field maps to no key)
  std::string setting;  // "zero2" (the key's value), or the note for a field without a key
};

struct EcosystemConfig {
  std::string file, format;            // format: "deepspeed" | "fsdp"
  std::vector<MappedField> fields;     // in the file's order
  std::vector<SourcedSetting> settings;  // what load_config applies (after the TOML, before --set)
  int64_t world_size = 0;              // num_processes x num_machines, when the file says (checked against the run)
};

EcosystemConfig read_deepspeed_config(const std::string& path);
EcosystemConfig read_fsdp_config(const std::string& path);
// The same from text (tests); `name` stands for the file in messages.
EcosystemConfig map_deepspeed(const std::string& json_text, const std::string& name);
EcosystemConfig map_fsdp(const std::string& yaml_text, const std::string& name);

// "field = value  ->  key = setting" per line: what a run prints at its start, and what lab 09 annotates.
std::string describe_mapping(const EcosystemConfig& e);

}  // namespace distlab
