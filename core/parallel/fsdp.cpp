#include "core/parallel/fsdp.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

static ShardedOptions fsdp_options(const std::string& sharding, bool prefetch, bool offload) {
  if (sharding != "full_shard" && sharding != "shard_grad_op")
    throw ConfigError("parallel.sharding '" + sharding + "' for FSDP's sharded form", "use full_shard or shard_grad_op (no_shard is DDP)");
  ShardedOptions o;
  o.reshard_after_forward = sharding == "full_shard";
  o.prefetch = prefetch;
  o.offload = offload;
  return o;
}

FSDP::FSDP(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& sharding, bool prefetch, bool offload)
    : ZeRO3(pg, model, rt, fsdp_options(sharding, prefetch, offload), "fsdp"), sharding_(sharding) {}

std::string FSDP::describe() const {
  return fmt::format("fsdp ({}{}{})", sharding_, o_.prefetch ? ", backward and forward prefetch" : "", o_.offload ? ", cpu offload" : "");
}

nlohmann::json FSDP::report() const {
  nlohmann::json r = ZeRO3::report();
  r["sharding_strategy"] = sharding_;
  return r;
}

}  // namespace distlab
