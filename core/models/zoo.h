// The models distlab trains, built from a ModelSpec. Parameter names and layouts follow PyTorch:
//   mlp:       fc1.weight [h1, in] ... fcN.weight [classes, hN]
//   cifar_cnn: conv1.weight [32, 3, 3, 3], (bn1.*), conv2.weight [64, 32, 3, 3], (bn2.*), fc.weight [10, 4096]
//   gpt:       transformer.wte.weight [V, C], transformer.wpe.weight [T, C], transformer.h.N.{ln_1, attn.c_attn,
//              attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, transformer.ln_f; lm_head tied to wte (nanoGPT's
//              nn.Linear layout [out, in]; Hugging Face's Conv1D stores these transposed)
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/models/model.h"
#include "core/util/choice.h"

namespace distlab {

class ContextShards;  // core/nn/attention.h

// train.activation_checkpointing: what a block keeps for its backward (Chen et al. 2016; Korthikanti
// et al. 2022). none: every activation. selective: all but the attention probabilities (B, NH, T, T),
// recomputed from qkv in backward. full: only the block's input; backward reruns the block's forward first.
// selective_op (Llama only): torchtitan's op-level policy — the block's input, every second matmul's output
// and the attention's; backward recomputes the rest (the other matmuls, the norms, RoPE, SwiGLU).
enum class Checkpointing { none, selective, full, selective_op };
template <>
struct ChoiceTable<Checkpointing> {
  static constexpr std::array names = {choice(Checkpointing::none, "none"), choice(Checkpointing::selective, "selective"),
                                       choice(Checkpointing::full, "full"), choice(Checkpointing::selective_op, "selective_op")};
};

// model.attention: which kernels compute a GPT's attention core (core/nn/attention.h). naive: the scores
// and probabilities (B, NH, T, T) in memory, kept for backward; flash: FlashAttention-2's tiles, keeping
// (B, NH, T) log-sum-exps instead.
enum class AttentionKernel { naive, flash };
template <>
struct ChoiceTable<AttentionKernel> {
  static constexpr std::array names = {choice(AttentionKernel::naive, "naive"), choice(AttentionKernel::flash, "flash")};
};

struct ModelSpec {
  std::string name = "mlp";          // mlp | cifar_cnn | gpt | llama
  // image models
  int64_t in_channels = 1, height = 28, width = 28, num_classes = 10;
  std::vector<int64_t> hidden = {256, 128};  // mlp
  bool batchnorm = false;                     // cifar_cnn variant
  // gpt
  int64_t vocab_size = 256, block_size = 64, n_layer = 2, n_head = 2, n_embd = 64;
  float dropout = 0.0f;
  // llama (core/models/llama.h), Hugging Face's LlamaConfig: num_key_value_heads, intermediate_size,
  // rope_theta, rms_norm_eps (0: n_head, and 2·4C/3 rounded up to 256)
  int64_t n_kv_head = 0, intermediate_size = 0;
  float rope_theta = 10000.0f, rms_norm_eps = 1e-5f;
  uint64_t dropout_seed = 0;
  Checkpointing checkpointing = Checkpointing::none;  // gpt: train.activation_checkpointing
  AttentionKernel attention = AttentionKernel::naive;  // gpt: model.attention
  bool sequence_parallel = false;  // parallel.sequence_parallel: with tensor parallel, the stream's rows split too
  // parallel.cp > 1: the sequence split over a context-parallel group (core/parallel/context_parallel.h),
  // which the trainer owns and sets here; the attention cores go round its ring, and the positions (wpe,
  // RoPE) are its. Not a config key: nullptr everywhere else.
  ContextShards* context = nullptr;
};

// The whole model, on one rank (a split one: build_split_model in core/parallel/gpt_parallel.h).
std::unique_ptr<Model> build_model(Runtime& rt, const ModelSpec& spec);

// Stage `stage` of `stages` of a Sequential model (mlp, cifar_cnn): consecutive layers (`layers`: how
// many per stage; empty: even), built whole and then cut, so it starts from the whole model's weights.
std::unique_ptr<Model> build_sequential_stage(Runtime& rt, const ModelSpec& spec, int stage, int stages,
                                              const std::vector<int64_t>& layers = {});

// The closed form of the course: 12·L·C² (blocks) + V·C + T·C, and the exact count of our GPT:
// 12·L·C² + 13·L·C + V·C + T·C + 2·C (biases and norms are the "small terms").
int64_t gpt_params_closed_form(const ModelSpec& s);
int64_t gpt_params_exact(const ModelSpec& s);
// The FLOPs a language model's training needs per token of sequence length T, the count MFU divides by, by
// one convention (PaLM, Chowdhery et al. 2022, appendix B, as torchtitan counts it): 6 per parameter, every
// parameter (the embeddings too, though a lookup multiplies nothing: torchtitan's 8B is 6·8.03e9 + 12·L·H·Q·T
// = 61.07 GFLOP a token at T = 8192) + 12·L·H·Q·T for the attention scores and their use (q kᵀ and P v,
// forward and backward, the causal half not discounted; H·Q = the heads' width). Recompute is not in it:
// HFU = these FLOPs + the recompute's (trace events marked by RecomputeScope), so HFU ≥ MFU always.
double gpt_model_flops_per_token(const ModelSpec& s, int64_t T);
// The convention above in words, printed beside every MFU and HFU figure
extern const char* const kFlopsConvention;
// A language model: gpt or llama (token data, a sequence length, a vocabulary)
inline bool is_language_model(const ModelSpec& s) { return s.name == "gpt" || s.name == "llama"; }

}  // namespace distlab
