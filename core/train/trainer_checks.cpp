// The trainer's consistency checks, out of the training loop's way: the model spec the config and the
// data imply (spec_for), and that every rank holds the same weights and data (Trainer::check_replicas).
#include <fmt/format.h>

#include "core/train/trainer.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

LossScaleOptions loss_scale_options(const PrecisionOptions& p) {
  LossScaleOptions o;
  const std::string ls = p.effective_loss_scale();
  o.mode = ls == "dynamic" ? LossScaleOptions::Mode::dynamic : ls == "none" ? LossScaleOptions::Mode::none : LossScaleOptions::Mode::fixed;
  o.init_scale = o.mode == LossScaleOptions::Mode::fixed ? std::stod(ls) : p.init_scale;
  o.growth_factor = p.growth_factor;
  o.backoff_factor = p.backoff_factor;
  o.growth_interval = p.growth_interval;
  o.hysteresis = p.hysteresis;
  o.min_scale = p.min_scale;
  return o;
}

ModelSpec spec_for(const RunConfig& c, const DataSets& d, bool meta) {
  ModelSpec s = c.model;
  s.dropout_seed = c.train.seed;
  if (c.data.name == "tokens") {
    const int64_t data_vocab = meta ? c.data.vocab : d.vocab;
    if (s.vocab_size == 0) s.vocab_size = data_vocab;
    if (data_vocab > s.vocab_size)
      throw ConfigError(fmt::format("{}: model.vocab_size {} is smaller than the data's vocabulary {}",
                                    c.origin.count("model.vocab_size") ? c.origin.at("model.vocab_size") : "default",
                                    s.vocab_size, data_vocab),
                        "raise model.vocab_size (or set it to 0 to take the data's)");
    if (c.data.seq_len > s.block_size)
      throw ConfigError(fmt::format("data.seq_len {} is longer than model.block_size {}", c.data.seq_len, s.block_size),
                        "lower data.seq_len or raise model.block_size");
    if (!is_language_model(s)) throw ConfigError("data.name 'tokens' needs model.name = \"gpt\" or \"llama\"", "token data feeds a language model");
    return s;
  }
  if (is_language_model(s))
    throw ConfigError("model.name '" + s.name + "' needs data.name = \"tokens\"", "image data feeds mlp or cifar_cnn");
  if (s.attention != AttentionKernel::naive)
    throw ConfigError(fmt::format("model.attention = \"{}\" with model.name \"{}\": it is a GPT's attention kernel", s.attention, s.name),
                      "leave model.attention \"naive\" (the default) for image models");
  if (s.checkpointing != Checkpointing::none)
    throw ConfigError(fmt::format("train.activation_checkpointing = \"{}\" with model.name \"{}\": it recomputes a GPT's blocks", s.checkpointing,
                                  s.name),
                      "use it with model.name = \"gpt\", or leave it \"none\" (the CNN's and MLP's activations shrink with train.micro_batch)");
  if (meta) {
    const bool mnist = c.data.name == "fashion-mnist";
    s.in_channels = mnist ? 1 : 3;
    s.height = s.width = mnist ? 28 : 32;
    s.num_classes = 10;
  } else {
    s.in_channels = d.channels;
    s.height = d.height;
    s.width = d.width;
    s.num_classes = d.classes;
  }
  return s;
}

// FNV-1a over a buffer's bytes: DDP replicas must stay bitwise equal, step after step.
static uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ULL) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; b && i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

// A tensor's bytes in one number, wherever it lives (a GPU rank's come down first).
static uint64_t tensor_hash(const Tensor& t, uint64_t h = 1469598103934665603ULL) {
  if (!t.data()) return h;
  if (t.device() != DeviceKind::cuda) return fnv1a(t.data(), size_t(t.nbytes()), h);
  std::vector<char> bytes(size_t(t.nbytes()));
  t.to_host(bytes.data());
  return fnv1a(bytes.data(), bytes.size(), h);
}

// The data a rank trains on, in one number: its size and up to `most` samples spread over it. A rank whose
// data came from another folder (DISTLAB_DATA on one node only), or another seed, differs here.
static uint64_t data_hash(Runtime& rt, const Dataset& d, int64_t most) {
  const int64_t n = d.size(), k_max = std::min<int64_t>(n, most);  // no bigger than a training batch: no new peak
  uint64_t h = fnv1a(&n, sizeof n);
  std::vector<int64_t> at;
  for (int64_t k = 0; k < k_max; k++) at.push_back(k * n / k_max);
  if (at.empty()) return h;
  Batch b = d.make_batch(rt, at);
  if (b.x.defined() && b.x.data()) h = tensor_hash(b.x, h);
  h = fnv1a(b.tokens.data(), b.tokens.size() * 4, h);
  return fnv1a(b.targets.data(), b.targets.size() * 4, h);
}

void Trainer::check_replicas(const std::string& when, bool with_buffers_and_data, MetricsWriter* metrics) {
  // [[name, hash], ...] of this rank, published for the others
  nlohmann::json mine = nlohmann::json::array();
  // a unit at a time where the parameters are sharded (ZeRO-3, FSDP): every rank gathers the same units
  strategy_->visit_full_params(rt_, *model_, [&](const std::vector<Parameter*>& params) {
    for (auto* p : params) mine.push_back({p->name, std::to_string(tensor_hash(p->data))});
  });
  if (with_buffers_and_data) {
    for (auto* b : model_->buffers()) mine.push_back({b->name, std::to_string(tensor_hash(b->data))});
    mine.push_back({"the training data", std::to_string(data_.train ? data_hash(rt_, *data_.train, std::min<int64_t>(16, micro_batch_)) : 0)});
  }
  // the replicas: the ranks of this rank's data-parallel group (every rank without a mesh; under tensor
  // or pipeline parallelism the ranks that hold the same slices of the same stage)
  const std::vector<int>& members = grad_->global_ranks();  // (context parallel: the CP ranks too)
  const std::string key = "replicas/" + when + "/";
  pg_->store().set_string(key + std::to_string(pg_->rank()), mine.dump());
  const int first = members[0];
  const auto ref = nlohmann::json::parse(pg_->store().get_string(key + std::to_string(first)));
  // this group's first difference, if any: {"rank", "parameter", "versus_rank"}
  nlohmann::json verdict;
  for (size_t k = 1; k < members.size() && verdict.is_null(); k++) {
    const int r = members[k];
    const auto theirs = r == pg_->rank() ? mine : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)));
    for (size_t i = 0; i < ref.size(); i++) {
      if (i < theirs.size() && theirs[i] == ref[i]) continue;
      verdict = {{"rank", r}, {"parameter", ref[i][0]}, {"versus_rank", first}};
      break;
    }
  }
  // every group's verdict reaches every rank: a divergence in a group without rank 0 (a pipeline stage's, a
  // tensor slice's replicas) fails the whole run too, and rank 0 records it
  pg_->store().set_string(key + "verdict/" + std::to_string(pg_->rank()), verdict.is_null() ? "" : verdict.dump());
  for (int q = 0; q < pg_->size() && verdict.is_null(); q++) {
    const std::string v = q == pg_->rank() ? "" : pg_->store().get_string(key + "verdict/" + std::to_string(q));
    if (!v.empty()) verdict = nlohmann::json::parse(v);
  }
  if (verdict.is_null()) return;
  const int r = verdict["rank"], versus = verdict["versus_rank"];
  const std::string name = verdict["parameter"];
  if (name == "the training data")
    throw Error(fmt::format("rank {} trains on other data than rank {} ({}): {}", r, versus, when, data_.note),
                "every rank must read the same data set: check data.path and $DISTLAB_DATA on every node");
  if (metrics && is_rank0()) metrics->write({{"kind", "diverged"}, {"rank", r}, {"parameter", name}, {"versus_rank", versus}});
  throw Error(fmt::format("rank {}'s {} differs from rank {}'s {}: the replicas {}", r, name, versus, when,
                          when == "at the end" ? "diverged during training" : "start from different weights"),
              when == "at the end"
                  ? "every rank must apply the same averaged gradient to the same weights: is a gradient not averaged, or "
                    "not copied back, on some rank?"
                  : "give every rank the same --init file (or none): weights loaded after DDP's broadcast stay per rank");
}

}  // namespace distlab
