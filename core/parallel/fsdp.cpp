#include "core/parallel/fsdp.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

static ShardedOptions fsdp_options(Sharding sharding, bool prefetch, bool offload, int64_t min_params, bool forward_prefetch, int prefetch_depth) {
  if (sharding == Sharding::no_shard)
    throw ConfigError("parallel.sharding 'no_shard' for FSDP's sharded form", "use full_shard or shard_grad_op (no_shard is DDP)");
  ShardedOptions o;
  o.reshard_after_forward = sharding == Sharding::full_shard;
  o.prefetch = prefetch;
  o.offload = offload;
  o.min_params = min_params;
  o.forward_prefetch = forward_prefetch;
  o.prefetch_depth = prefetch_depth;
  return o;
}

FSDP::FSDP(ProcessGroup& pg, Model& model, Runtime& rt, Sharding sharding, bool prefetch, bool offload, int64_t min_params, bool forward_prefetch,
           int prefetch_depth)
    : ZeRO3(pg, model, rt, fsdp_options(sharding, prefetch, offload, min_params, forward_prefetch, prefetch_depth), "fsdp"), sharding_(sharding) {}

std::string FSDP::describe() const {
  return fmt::format("fsdp ({}{}{}{}{})", sharding_, o_.prefetch ? (o_.forward_prefetch ? ", backward and forward prefetch" : ", backward prefetch") : "",
                     o_.prefetch && o_.prefetch_depth > 1 ? fmt::format(" {} units ahead", o_.prefetch_depth) : "", o_.offload ? ", cpu offload" : "",
                     o_.min_params > 0 ? fmt::format(", units wrapped to >= {} parameters", o_.min_params) : "");
}

nlohmann::json FSDP::report() const {
  nlohmann::json r = ZeRO3::report();
  r["sharding_strategy"] = std::string(name_of(sharding_));
  return r;
}

}  // namespace distlab
