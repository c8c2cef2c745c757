// Lab 07 — checkpoint and resume: save what a resume needs besides the weights (the optimizer's moments
// and step count, the RNG streams, the sampler's place), atomically and with a checksum, and put it back
// so that the resumed run is the uninterrupted one, bit for bit.
#include <cstring>
#include <string>
#include <vector>

#include <stdexcept>

#include "labs/07-checkpoint/api.h"

namespace lab07 {

// CRC-32 (IEEE, zlib's): a file changed after it was written no longer matches the sum saved in it.
uint32_t crc32(const uint8_t* p, size_t n) {
  // TODO(07-checkpoint): implement crc32. Read labs/07-checkpoint/README.md.
  throw std::logic_error("07-checkpoint: crc32 is not implemented yet: "
                         "fill in the TODO in labs/07-checkpoint/student/ckpt.cpp");
}

// The file: "DLCKPT07", the payload's length (u64) and CRC-32 (u32), then the payload:
//   step, world, micro_batch, optimizer steps (i64); per parameter, per state name: a count n (i64, 0 before
//   the first step) and n floats; the RNG streams (count, then u64 each); epoch, position (i64).
struct Buffer {
  std::vector<uint8_t> bytes;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_floats(const std::vector<float>& v) {
    put(int64_t(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes.insert(bytes.end(), p, p + v.size() * 4);
  }
};

struct Cursor {
  const std::vector<uint8_t>& bytes;
  size_t at;
  bool ok = true;
  template <class T>
  T take() {
    T v{};
    if (at + sizeof(T) > bytes.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

void save_state(State& st, Files& files) {
  // TODO(07-checkpoint): implement save_state. Read labs/07-checkpoint/README.md.
  throw std::logic_error("07-checkpoint: save_state is not implemented yet: "
                         "fill in the TODO in labs/07-checkpoint/student/ckpt.cpp");
}

std::string load_state(State& st, Files& files) {
  // TODO(07-checkpoint): implement load_state. Read labs/07-checkpoint/README.md.
  throw std::logic_error("07-checkpoint: load_state is not implemented yet: "
                         "fill in the TODO in labs/07-checkpoint/student/ckpt.cpp");
}

}  // namespace lab07

extern "C" Lab07Plugin distlab_lab07 = {kLab07Abi, lab07::save_state, lab07::load_state};
