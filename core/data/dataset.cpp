#include "core/data/dataset.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

ImageDataset::ImageDataset(std::string d, int64_t C, int64_t H, int64_t W, std::vector<uint8_t> px,
                           std::vector<int32_t> labels, std::vector<float> mean, std::vector<float> std, bool syn)
    : description_(std::move(d)), C_(C), H_(H), W_(W), pixels_(std::move(px)), labels_(std::move(labels)),
      mean_(std::move(mean)), std_(std::move(std)), synthetic_(syn) {
  DL_ASSERT(int64_t(pixels_.size()) == int64_t(labels_.size()) * C * H * W, "image bytes don't match the labels");
  DL_ASSERT(int64_t(mean_.size()) == C && int64_t(std_.size()) == C, "one mean and std per channel");
}

Batch ImageDataset::make_batch(Runtime& rt, const std::vector<int64_t>& idx) const {
  Batch b;
  b.B = int64_t(idx.size());
  b.x = rt.empty({b.B, C_, H_, W_}, Category::activations, "input images");
  b.targets.resize(idx.size());
  const int64_t plane = H_ * W_, img = C_ * plane;
  float* x = b.x.f32();
  for (size_t i = 0; i < idx.size(); i++) {
    DL_ASSERT(idx[i] >= 0 && idx[i] < size(), "sample index out of range");
    b.targets[i] = labels_[size_t(idx[i])];
    if (!x) continue;
    const uint8_t* src = pixels_.data() + idx[i] * img;
    float* dst = x + int64_t(i) * img;
    for (int64_t c = 0; c < C_; c++) {
      const float scale = 1.0f / (255.0f * std_[size_t(c)]), shift = mean_[size_t(c)] / std_[size_t(c)];
      for (int64_t p = 0; p < plane; p++) dst[c * plane + p] = float(src[c * plane + p]) * scale - shift;
    }
  }
  return b;
}

TokenDataset::TokenDataset(std::string d, std::vector<int32_t> tokens, int64_t T, int64_t vocab, bool syn)
    : description_(std::move(d)), tokens_(std::move(tokens)), T_(T), vocab_(vocab), synthetic_(syn) {
  if (int64_t(tokens_.size()) < T + 1)
    throw DataError(fmt::format("{}: {} tokens are fewer than one window of seq_len {} + 1", description_,
                                tokens_.size(), T),
                    "use a longer text or a smaller data.seq_len");
}

int64_t TokenDataset::size() const { return (int64_t(tokens_.size()) - 1) / T_; }

Batch TokenDataset::make_batch(Runtime& rt, const std::vector<int64_t>& idx) const {
  Batch b;
  b.B = int64_t(idx.size());
  b.T = T_;
  b.tokens.resize(size_t(b.B * T_));
  b.targets.resize(size_t(b.B * T_));
  for (size_t i = 0; i < idx.size(); i++) {
    const int32_t* src = tokens_.data() + idx[i] * T_;
    for (int64_t t = 0; t < T_; t++) {
      b.tokens[i * size_t(T_) + size_t(t)] = src[t];
      b.targets[i * size_t(T_) + size_t(t)] = src[t + 1];
    }
  }
  return b;
}

}  // namespace distlab
