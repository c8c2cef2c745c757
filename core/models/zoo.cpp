#include "core/models/zoo.h"

#include <fmt/format.h>

#include "core/models/gpt.h"
#include "core/models/llama.h"
#include "core/models/sequential.h"
#include "core/nn/conv2d.h"
#include "core/nn/linear.h"
#include "core/nn/norm.h"
#include "core/nn/simple.h"
#include "core/util/error.h"

namespace distlab {

static std::unique_ptr<Sequential> build_mlp(Runtime& rt, const ModelSpec& s) {
  auto m = std::make_unique<Sequential>();
  m->add(std::make_unique<Flatten>());
  int64_t in = s.in_channels * s.height * s.width;
  int i = 1;
  for (int64_t h : s.hidden) {
    m->add(std::make_unique<Linear>(rt, fmt::format("fc{}", i++), in, h));
    m->add(std::make_unique<ReLU>());
    in = h;
  }
  m->add(std::make_unique<Linear>(rt, fmt::format("fc{}", i), in, s.num_classes));
  m->layers()[1]->set_needs_input_grad(false);
  return m;
}

// conv 3->32 k3 p1, [bn], ReLU, maxpool 2, conv 32->64 k3 p1, [bn], ReLU, maxpool 2, flatten, linear -> classes
static std::unique_ptr<Sequential> build_cifar_cnn(Runtime& rt, const ModelSpec& s) {
  if (s.height % 4 || s.width % 4)
    throw ConfigError(fmt::format("cifar_cnn needs image sides divisible by 4 (two 2x2 pools), got {}x{}", s.height, s.width));
  auto m = std::make_unique<Sequential>();
  m->add(std::make_unique<Conv2d>(rt, "conv1", s.in_channels, 32, 3, 1, 1));
  if (s.batchnorm) m->add(std::make_unique<BatchNorm2d>(rt, "bn1", 32));
  m->add(std::make_unique<ReLU>());
  m->add(std::make_unique<MaxPool2d>(2));
  m->add(std::make_unique<Conv2d>(rt, "conv2", 32, 64, 3, 1, 1));
  if (s.batchnorm) m->add(std::make_unique<BatchNorm2d>(rt, "bn2", 64));
  m->add(std::make_unique<ReLU>());
  m->add(std::make_unique<MaxPool2d>(2));
  m->add(std::make_unique<Flatten>());
  m->add(std::make_unique<Linear>(rt, "fc", 64 * (s.height / 4) * (s.width / 4), s.num_classes));
  m->layers()[0]->set_needs_input_grad(false);
  return m;
}

std::unique_ptr<Model> build_model(Runtime& rt, const ModelSpec& s) {
  if (s.name == "mlp") return build_mlp(rt, s);
  if (s.name == "cifar_cnn") return build_cifar_cnn(rt, s);
  if (s.name == "gpt") return std::make_unique<GPT>(rt, s);
  if (s.name == "llama") return std::make_unique<Llama>(rt, s);
  throw ConfigError("unknown model.name '" + s.name + "'", "use mlp, cifar_cnn, gpt or llama");
}

std::unique_ptr<Model> build_sequential_stage(Runtime& rt, const ModelSpec& s, int stage, int stages,
                                              const std::vector<int64_t>& layers) {
  DL_ASSERT(s.name == "mlp" || s.name == "cifar_cnn", "build_sequential_stage: " + s.name + " is not a Sequential model");
  std::function<std::unique_ptr<Sequential>(Runtime&)> whole = [s](Runtime& r) {
    return s.name == "mlp" ? build_mlp(r, s) : build_cifar_cnn(r, s);
  };
  auto m = whole(rt);
  m->keep_stage(stage, stages, layers, whole, {s.in_channels, s.height, s.width});
  return m;
}

int64_t gpt_params_closed_form(const ModelSpec& s) {
  return 12 * s.n_layer * s.n_embd * s.n_embd + s.vocab_size * s.n_embd + s.block_size * s.n_embd;
}

int64_t gpt_params_exact(const ModelSpec& s) {
  return gpt_params_closed_form(s) + 13 * s.n_layer * s.n_embd + 2 * s.n_embd;
}

double gpt_model_flops_per_token(const ModelSpec& s, int64_t T) {
  const double params = s.name == "llama" ? double(llama_params_exact(s)) : double(gpt_params_exact(s));
  return 6.0 * params + 12.0 * double(s.n_layer) * double(s.n_embd) * double(T);
}

const char* const kFlopsConvention =
    "MFU = (6·N + 12·L·H·Q·T) FLOPs a token, N every parameter (embeddings included, as torchtitan counts), "
    "over the step's time at the precision's peak; HFU adds the activation checkpointing's recompute; under LoRA a frozen "
    "parameter counts 4 (no weight gradient)";

}  // namespace distlab
