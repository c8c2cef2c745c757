// Data sets: the interface, images held as bytes (normalized when a batch is made), token streams.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/data/batch.h"
#include "core/tensor/runtime.h"

namespace distlab {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::string describe() const = 0;  // "Fashion-MNIST train: 60000 images 1x28x28 (/usr/share/...)"
  virtual bool synthetic() const { return false; }
  // A batch of the samples at `indices`, tensors on the rank's device (activations category).
  virtual Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const = 0;
};

// N images of C x H x W bytes with labels; a batch is (pixel / 255 - mean[c]) / std[c] per channel.
class ImageDataset : public Dataset {
 public:
  ImageDataset(std::string description, int64_t C, int64_t H, int64_t W, std::vector<uint8_t> pixels,
               std::vector<int32_t> labels, std::vector<float> mean, std::vector<float> std, bool synthetic = false);
  int64_t size() const override { return int64_t(labels_.size()); }
  std::string describe() const override { return description_; }
  bool synthetic() const override { return synthetic_; }
  Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const override;
  int64_t channels() const { return C_; }
  int64_t height() const { return H_; }
  int64_t width() const { return W_; }
  const std::vector<int32_t>& labels() const { return labels_; }
  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  std::string description_;
  int64_t C_, H_, W_;
  std::vector<uint8_t> pixels_;
  std::vector<int32_t> labels_;
  std::vector<float> mean_, std_;
  bool synthetic_;
};

// A token stream cut into non-overlapping windows: sample i reads tokens [i·T, i·T + T] — inputs are the
// first T, targets the last T (the next token at each position).
class TokenDataset : public Dataset {
 public:
  TokenDataset(std::string description, std::vector<int32_t> tokens, int64_t seq_len, int64_t vocab, bool synthetic);
  int64_t size() const override;
  std::string describe() const override { return description_; }
  bool synthetic() const override { return synthetic_; }
  Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const override;
  int64_t vocab() const { return vocab_; }
  int64_t seq_len() const { return T_; }

 private:
  std::string description_;
  std::vector<int32_t> tokens_;
  int64_t T_, vocab_;
  bool synthetic_;
};

}  // namespace distlab
