// Scalars in TensorBoard's own file format, written by hand: a file of TFRecords (length, its masked
// CRC-32C, the bytes, their masked CRC-32C), each an Event protocol buffer (tensorflow/core/util/
// event.proto): wall_time (field 1, double), step (2, varint), file_version (3, string, the first record's
// "brain.Event:2") and summary (5) holding Summary.Value { tag (1), simple_value (2, float) }.
// What `distlab export tensorboard` writes from a run's metrics (cli/export_cmd.cpp); `tensorboard
// --logdir DIR` reads it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace distlab {

// CRC-32C (Castagnoli), the checksum TFRecords carry: crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, size_t n);

struct Scalar {
  std::string tag;  // "train/loss"
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;  // seconds since the epoch
};

// The events file's bytes: the version record first, then one record per scalar.
std::string tfevents(const std::vector<Scalar>& scalars, double start_time);

}  // namespace distlab
