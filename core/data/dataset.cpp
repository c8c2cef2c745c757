#include "core/data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

ImageDataset::ImageDataset(std::string d, int64_t C, int64_t H, int64_t W, std::vector<uint8_t> px,
                           std::vector<int32_t> labels, std::vector<float> mean, std::vector<float> std, bool syn)
    : description_(std::move(d)), C_(C), H_(H), W_(W), pixels_(std::move(px)), labels_(std::move(labels)),
      mean_(std::move(mean)), std_(std::move(std)), synthetic_(syn) {
  DL_ASSERT(int64_t(pixels_.size()) == int64_t(labels_.size()) * C * H * W, "image bytes don't match the labels");
  DL_ASSERT(int64_t(mean_.size()) == C && int64_t(std_.size()) == C, "one mean and std per channel");
}

ImageDataset::ImageDataset(std::string d, int64_t C, int64_t H, int64_t W, Draw draw, std::vector<int32_t> labels,
                           std::vector<float> mean, std::vector<float> std)
    : description_(std::move(d)), C_(C), H_(H), W_(W), draw_(std::move(draw)), labels_(std::move(labels)),
      mean_(std::move(mean)), std_(std::move(std)), synthetic_(true) {
  DL_ASSERT(int64_t(mean_.size()) == C && int64_t(std_.size()) == C, "one mean and std per channel");
}

std::vector<uint8_t> ImageDataset::image(int64_t i) const {
  DL_ASSERT(i >= 0 && i < size(), "sample index out of range");
  const int64_t img = C_ * H_ * W_;
  if (!draw_) return std::vector<uint8_t>(pixels_.begin() + i * img, pixels_.begin() + (i + 1) * img);
  std::vector<uint8_t> out(static_cast<size_t>(img));
  draw_(i, out.data());
  return out;
}

Batch ImageDataset::make_batch(Runtime& rt, const std::vector<int64_t>& idx) const {
  Batch b;
  b.B = int64_t(idx.size());
  b.x = rt.empty({b.B, C_, H_, W_}, Category::activations, "input images");
  b.targets.resize(idx.size());
  const int64_t plane = H_ * W_, img = C_ * plane;
  OnHost xh(b.x, OnHost::out);  // built on the host; a GPU rank's batch goes up in one copy (store below)
  float* x = xh.p;
  std::vector<uint8_t> drawn(draw_ && x ? size_t(img) : 0);
  for (size_t i = 0; i < idx.size(); i++) {
    DL_ASSERT(idx[i] >= 0 && idx[i] < size(), "sample index out of range");
    b.targets[i] = labels_[size_t(idx[i])];
    if (!x) continue;
    const uint8_t* src = drawn.data();
    if (draw_) draw_(idx[i], drawn.data());
    else src = pixels_.data() + idx[i] * img;
    float* dst = x + int64_t(i) * img;
    for (int64_t c = 0; c < C_; c++) {
      const float scale = 1.0f / (255.0f * std_[size_t(c)]), shift = mean_[size_t(c)] / std_[size_t(c)];
      for (int64_t p = 0; p < plane; p++) dst[c * plane + p] = float(src[c * plane + p]) * scale - shift;
    }
  }
  xh.store();
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

// ---- records corrupt, records left out ----

static void check_indices(const std::vector<int64_t>& v, int64_t n, const std::string& key, const std::string& what) {
  for (int64_t i : v)
    if (i < 0 || i >= n)
      throw DataError(fmt::format("{}: index {} is not a record of {} (0 to {})", key, i, what, n - 1), "indices count from 0 in the train split");
}

CorruptRecords::CorruptRecords(std::unique_ptr<Dataset> inner, std::vector<int64_t> bad) : inner_(std::move(inner)), bad_(std::move(bad)) {
  check_indices(bad_, inner_->size(), "data.corrupt", inner_->describe());
  if (!dynamic_cast<const ImageDataset*>(inner_.get()))
    throw DataError("data.corrupt: only image data has float inputs to corrupt", "use it with fashion-mnist, cifar10 or synthetic-images");
  std::sort(bad_.begin(), bad_.end());
}

Batch CorruptRecords::make_batch(Runtime& rt, const std::vector<int64_t>& idx) const {
  Batch b = inner_->make_batch(rt, idx);
  OnHost xh(b.x, OnHost::inout);
  float* x = xh.p;
  if (!x) return b;  // the meta device: no values
  const int64_t per = b.x.numel() / std::max<int64_t>(b.B, 1);
  for (size_t i = 0; i < idx.size(); i++)
    if (std::binary_search(bad_.begin(), bad_.end(), idx[i])) std::fill_n(x + int64_t(i) * per, per, std::numeric_limits<float>::quiet_NaN());
  xh.store();
  return b;
}

ExcludeRecords::ExcludeRecords(std::unique_ptr<Dataset> inner, const std::vector<int64_t>& excluded) : inner_(std::move(inner)) {
  check_indices(excluded, inner_->size(), "data.exclude", inner_->describe());
  std::vector<char> out(size_t(inner_->size()), 0);
  for (int64_t i : excluded) out[size_t(i)] = 1;
  for (int64_t i = 0; i < inner_->size(); i++)
    if (!out[size_t(i)]) keep_.push_back(i);
  excluded_ = inner_->size() - int64_t(keep_.size());
  if (keep_.empty()) throw DataError("data.exclude leaves no record of " + inner_->describe());
}

std::string ExcludeRecords::describe() const {
  return fmt::format("{}, {} record{} left out (data.exclude)", inner_->describe(), excluded_, excluded_ == 1 ? "" : "s");
}

Batch ExcludeRecords::make_batch(Runtime& rt, const std::vector<int64_t>& idx) const {
  std::vector<int64_t> inner(idx.size());
  for (size_t i = 0; i < idx.size(); i++) {
    DL_ASSERT(idx[i] >= 0 && idx[i] < size(), "sample index out of range");
    inner[i] = keep_[size_t(idx[i])];
  }
  return inner_->make_batch(rt, inner);
}

}  // namespace distlab
