#include "core/data/formats.h"

#include <fmt/format.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>

#include "core/util/error.h"

namespace distlab {

std::vector<uint8_t> read_file_maybe_gz(const std::string& path) {
  if (!std::filesystem::exists(path)) throw DataError(fmt::format("{}: no such file", path));
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
  if (!f) throw DataError(fmt::format("{}: cannot open", path));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw DataError(fmt::format("{}: corrupt gzip stream ({})", path, msg),
                      "the download was damaged: fetch the file again");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > (size_t(4) << 30)) {  // a decompression bomb, or not a data set of this course
      gzclose(f);
      throw DataError(fmt::format("{}: more than 4 GiB once decompressed", path), "is this the right file?");
    }
  }
  // a gzip file cut short reads as a clean EOF in some zlib versions: gzclose_r reports it
  int rc = gzclose(f);
  if (rc != Z_OK && rc != Z_BUF_ERROR)
    throw DataError(fmt::format("{}: corrupt or truncated gzip stream (zlib {})", path, rc), "fetch the file again");
  if (rc == Z_BUF_ERROR)
    throw DataError(fmt::format("{}: truncated gzip stream", path), "the file was cut short: fetch it again");
  return out;
}

static uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }

IdxImages read_idx_images(const std::string& path) {
  std::vector<uint8_t> raw = read_file_maybe_gz(path);
  uint32_t magic = raw.size() >= 4 ? be32(raw.data()) : 0;
  if (raw.size() < 16 && magic != 2049)
    throw DataError(fmt::format("{}: {} bytes is too short for an IDX image header (16)", path, raw.size()));
  if (magic != 2051)
    throw DataError(fmt::format("{}: magic number {} is not 2051 (IDX images)", path, magic),
                    magic == 2049 ? "this is a labels file: swap the images and labels paths" : "is this an IDX file?");
  IdxImages im;
  im.count = be32(raw.data() + 4);
  im.rows = be32(raw.data() + 8);
  im.cols = be32(raw.data() + 12);
  // each bounded first, so that the product below cannot wrap around to match the file's size
  if (im.rows < 1 || im.rows > 65536 || im.cols < 1 || im.cols > 65536 || im.count > (int64_t(1) << 31))
    throw DataError(fmt::format("{}: header says {} images of {}x{}: not a plausible image file", path, im.count, im.rows, im.cols),
                    "the file is corrupt or not IDX images: fetch it again");
  const uint64_t want = uint64_t(im.count) * uint64_t(im.rows) * uint64_t(im.cols);
  if (raw.size() - 16 != want)
    throw DataError(fmt::format("{}: header says {} images of {}x{} ({} bytes) but the file holds {} bytes after it", path,
                                im.count, im.rows, im.cols, want, raw.size() - 16),
                    "the file is truncated or corrupt: fetch it again");
  im.pixels.assign(raw.begin() + 16, raw.end());
  return im;
}

std::vector<int32_t> read_idx_labels(const std::string& path, int32_t num_classes) {
  std::vector<uint8_t> raw = read_file_maybe_gz(path);
  uint32_t magic = raw.size() >= 4 ? be32(raw.data()) : 0;
  if (raw.size() < 8 && magic != 2051)
    throw DataError(fmt::format("{}: {} bytes is too short for an IDX label header (8)", path, raw.size()));
  if (magic != 2049)
    throw DataError(fmt::format("{}: magic number {} is not 2049 (IDX labels)", path, magic),
                    magic == 2051 ? "this is an images file: swap the images and labels paths" : "is this an IDX file?");
  const uint64_t count = be32(raw.data() + 4);
  if (raw.size() - 8 != count)
    throw DataError(fmt::format("{}: header says {} labels but the file holds {}", path, count, raw.size() - 8),
                    "the file is truncated or corrupt: fetch it again");
  std::vector<int32_t> labels(count);
  for (uint64_t i = 0; i < count; i++) {
    labels[i] = raw[8 + i];
    if (labels[i] >= num_classes)
      throw DataError(fmt::format("{}: label {} at index {} is not below {} classes", path, labels[i], i, num_classes));
  }
  return labels;
}

void read_cifar10_batch(const std::string& path, std::vector<uint8_t>& pixels, std::vector<int32_t>& labels) {
  std::vector<uint8_t> raw = read_file_maybe_gz(path);
  if (raw.empty() || raw.size() % kCifarRecordBytes != 0)
    throw DataError(fmt::format("{}: {} bytes is not a whole number of 3073-byte CIFAR-10 records", path, raw.size()),
                    "a data_batch file is 30730000 bytes (10000 records): fetch it again");
  const size_t n = raw.size() / kCifarRecordBytes;
  for (size_t i = 0; i < n; i++) {
    const uint8_t* r = raw.data() + i * kCifarRecordBytes;
    if (r[0] > 9)
      throw DataError(fmt::format("{}: record {} has label {}, CIFAR-10 labels are 0..9", path, i, r[0]),
                      "is this CIFAR-100 (2 label bytes) or another file? distlab reads the CIFAR-10 binary version");
    labels.push_back(r[0]);
    pixels.insert(pixels.end(), r + 1, r + kCifarRecordBytes);
  }
}

}  // namespace distlab
