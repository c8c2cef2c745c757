// clinic alt (alpha): every rank its own file: state_file(rank) as the final name, and a per-rank
// "partial-" prefixed temporary name.
// Lab 07 — checkpoint and resume: save what a resume needs besides the weights (the optimizer's moments
// and step count, the RNG streams, the sampler's place), atomically and with a checksum, and put it back
// so that the resumed run is the uninterrupted one, bit for bit.
#include <cstring>
#include <string>
#include <vector>

#include "labs/07-checkpoint/api.h"

namespace lab07 {

// CRC-32 (IEEE, zlib's): a file changed after it was written no longer matches the sum saved in it.
uint32_t crc32(const uint8_t* p, size_t n) {
  /// BEGIN SOLUTION
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
  }
  return ~crc;
  /// END SOLUTION
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
  /// BEGIN SOLUTION
  Buffer payload;
  payload.put(st.step());
  payload.put(int64_t(st.world()));
  payload.put(st.micro_batch());
  payload.put(st.optimizer_steps());
  for (int i = 0; i < st.num_params(); i++)
    for (const std::string& name : st.optimizer_state_names()) payload.put_floats(st.optimizer_state(i, name));
  const std::vector<uint64_t> streams = st.rng_streams();
  payload.put(int64_t(streams.size()));
  for (uint64_t s : streams) payload.put(s);
  payload.put(st.epoch());
  payload.put(st.position());

  Buffer file;
  for (char c : std::string("DLCKPT07")) file.put(c);
  file.put(uint64_t(payload.bytes.size()));
  file.put(crc32(payload.bytes.data(), payload.bytes.size()));
  file.bytes.insert(file.bytes.end(), payload.bytes.begin(), payload.bytes.end());

  // atomically: a temporary name, on the disk, then renamed over the final one — a kill at any point
  // leaves either no file under the final name or a whole one
  const std::string final_name = state_file(st.rank()), tmp = "partial-" + final_name;
  const int h = files.open(tmp);
  files.write(h, file.bytes.data(), file.bytes.size());
  files.fsync(h);
  files.close(h);
  files.rename(tmp, final_name);
  /// END SOLUTION
}

std::string load_state(State& st, Files& files) {
  /// BEGIN SOLUTION
  // this rank's file; on a world the checkpoint did not have, rank 0's (under DDP every rank's is the same
  // but for its place in the data, which carries over as samples seen, below)
  std::string name = state_file(st.rank());
  if (!files.exists(name)) name = state_file(0);
  if (!files.exists(name)) return name + " is missing";
  const std::vector<uint8_t> raw = files.read(name);
  if (raw.size() < 20 || std::memcmp(raw.data(), "DLCKPT07", 8) != 0) return name + ": not a lab 07 state file";
  uint64_t length = 0;
  uint32_t crc = 0;
  std::memcpy(&length, raw.data() + 8, 8);
  std::memcpy(&crc, raw.data() + 16, 4);
  if (length != raw.size() - 20) return name + ": truncated (" + std::to_string(raw.size() - 20) + " of " + std::to_string(length) + " bytes)";
  if (crc32(raw.data() + 20, length) != crc) return name + ": CRC-32 mismatch (corrupt)";

  Cursor c{raw, 20};
  const int64_t step = c.take<int64_t>(), world = c.take<int64_t>(), micro = c.take<int64_t>();
  const int64_t t = c.take<int64_t>();
  std::vector<std::vector<std::vector<float>>> state(size_t(st.num_params()));
  for (int i = 0; i < st.num_params(); i++)
    for (size_t k = 0; k < st.optimizer_state_names().size(); k++) {
      const int64_t n = c.take<int64_t>();
      if (!c.ok || (n != 0 && n != st.param_numel(i))) return name + ": does not fit this model";
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = c.take<float>();
      state[size_t(i)].push_back(std::move(v));
    }
  std::vector<uint64_t> streams(size_t(c.take<int64_t>()));
  for (auto& s : streams) s = c.take<uint64_t>();
  const int64_t epoch = c.take<int64_t>();
  int64_t position = c.take<int64_t>();
  if (!c.ok || step != st.step()) return name + ": malformed";

  for (int i = 0; i < st.num_params(); i++)
    for (size_t k = 0; k < state[size_t(i)].size(); k++)
      if (!state[size_t(i)][k].empty()) st.set_optimizer_state(i, st.optimizer_state_names()[k], state[size_t(i)][k]);
  st.set_optimizer_steps(t);
  st.set_rng_streams(streams);
  // another world or micro-batch: the same samples of this epoch count as seen
  if (world != st.world() || micro != st.micro_batch()) position = position * micro * world / (st.micro_batch() * st.world());
  st.set_sampler(epoch, position);
  return "";
  /// END SOLUTION
}

}  // namespace lab07

extern "C" Lab07Plugin distlab_lab07 = {kLab07Abi, lab07::save_state, lab07::load_state};
