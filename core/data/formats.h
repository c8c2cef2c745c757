// Readers of real data set formats. Each checks what it reads and throws DataError naming the file and
// what is wrong (missing, truncated, bad magic, label out of range).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace distlab {

// IDX (LeCun's MNIST format), plain or gzip-compressed: a big-endian magic (2051 images, 2049 labels),
// the dimensions, then bytes.
struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
};
IdxImages read_idx_images(const std::string& path);
std::vector<int32_t> read_idx_labels(const std::string& path, int32_t num_classes);

// CIFAR-10 binary: records of 3073 bytes — a label (0..9), then 1024 red, 1024 green, 1024 blue bytes.
constexpr int64_t kCifarRecordBytes = 3073;
void read_cifar10_batch(const std::string& path, std::vector<uint8_t>& pixels, std::vector<int32_t>& labels);

// Reads a whole file, gunzipping it when it starts with the gzip magic. Throws DataError when missing.
std::vector<uint8_t> read_file_maybe_gz(const std::string& path);

}  // namespace distlab
