// Data sets: the interface, images held as bytes or drawn when a batch asks for them (normalized when a batch
// is made), token streams.
#pragma once
#include <cstdint>
#include <functional>
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
  // Sample i's index in the data set as its files number it (differs once records are left out).
  virtual int64_t source_index(int64_t i) const { return i; }
};

// N images of C x H x W bytes with labels; a batch is (pixel / 255 - mean[c]) / std[c] per channel.
class ImageDataset : public Dataset {
 public:
  ImageDataset(std::string description, int64_t C, int64_t H, int64_t W, std::vector<uint8_t> pixels,
               std::vector<int32_t> labels, std::vector<float> mean, std::vector<float> std, bool synthetic = false);
  // Images drawn when a batch asks for them (the synthetic sets): draw(i, out) writes image i's C*H*W bytes.
  using Draw = std::function<void(int64_t i, uint8_t* out)>;
  ImageDataset(std::string description, int64_t C, int64_t H, int64_t W, Draw draw, std::vector<int32_t> labels,
               std::vector<float> mean, std::vector<float> std);
  int64_t size() const override { return int64_t(labels_.size()); }
  std::string describe() const override { return description_; }
  bool synthetic() const override { return synthetic_; }
  Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const override;
  int64_t channels() const { return C_; }
  int64_t height() const { return H_; }
  int64_t width() const { return W_; }
  const std::vector<int32_t>& labels() const { return labels_; }
  std::vector<uint8_t> image(int64_t i) const;  // image i's C*H*W bytes

 private:
  std::string description_;
  int64_t C_, H_, W_;
  std::vector<uint8_t> pixels_;  // every image's bytes, or empty where draw_ makes them
  Draw draw_;
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

// A data set some of whose records are corrupt: their inputs come out NaN, as a broken record in a real data
// set does (a sensor glitch, a half-written file). data.corrupt lists them: lab 08's NaN case. The log does
// not say which: finding it is the case (data.check_finite does).
class CorruptRecords : public Dataset {
 public:
  CorruptRecords(std::unique_ptr<Dataset> inner, std::vector<int64_t> bad);  // DataError: not images, out of range
  int64_t size() const override { return inner_->size(); }
  std::string describe() const override { return inner_->describe(); }
  bool synthetic() const override { return inner_->synthetic(); }
  Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const override;
  int64_t source_index(int64_t i) const override { return inner_->source_index(i); }

 private:
  std::unique_ptr<Dataset> inner_;
  std::vector<int64_t> bad_;  // sorted
};

// A data set with some records left out (data.exclude: a bad record dropped): sample i is the i-th kept one.
class ExcludeRecords : public Dataset {
 public:
  ExcludeRecords(std::unique_ptr<Dataset> inner, const std::vector<int64_t>& excluded);  // DataError: out of range
  int64_t size() const override { return int64_t(keep_.size()); }
  std::string describe() const override;
  bool synthetic() const override { return inner_->synthetic(); }
  Batch make_batch(Runtime& rt, const std::vector<int64_t>& indices) const override;
  int64_t source_index(int64_t i) const override { return inner_->source_index(keep_[size_t(i)]); }

 private:
  std::unique_ptr<Dataset> inner_;
  std::vector<int64_t> keep_;
  int64_t excluded_ = 0;
};

}  // namespace distlab
