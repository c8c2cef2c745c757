// Lab 07, alternative B ("samples_streamed"): a bit-at-a-time CRC-32 (no table, branch-free mask); explicit
// little-endian byte-by-byte encoding (no memcpy of host integers); the sampler is saved as the SAMPLES seen
// this epoch (position * micro_batch * world, converted at save time) rather than the raw position; the
// header (magic, version, payload length, CRC-32 of the payload) is followed by the payload streamed in
// many write calls (one per tensor) into a "tmp-" prefixed name, fsync'ed, closed, then renamed; the
// loader checks the header, length and CRC before it decodes anything.
#include <string>
#include <vector>

#include "labs/07-checkpoint/api.h"

namespace lab07 {

uint32_t crc32(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

namespace {
constexpr uint8_t kMagic[8] = {'L', '0', '7', 'S', 'T', 'A', 'T', 'E'};
constexpr uint64_t kVersion = 7;
constexpr size_t kHeader = 8 + 8 + 8 + 8;  // magic, version, payload length, crc (u64-widened)

void put_u64(std::vector<uint8_t>& o, uint64_t v) {
  for (int k = 0; k < 8; k++) o.push_back(static_cast<uint8_t>(v >> (8 * k)));
}
void put_u32(std::vector<uint8_t>& o, uint32_t v) {
  for (int k = 0; k < 4; k++) o.push_back(static_cast<uint8_t>(v >> (8 * k)));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int k = 0; k < 8; k++) v |= uint64_t(p[k]) << (8 * k);
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) v |= uint32_t(p[k]) << (8 * k);
  return v;
}
uint32_t float_bits(float f) {
  uint32_t u;
  static_assert(sizeof u == sizeof f);
  __builtin_memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
}  // namespace

void save_state(State& st, Files& files) {
  // The payload in pieces: the scalars, then one piece per (parameter, state) tensor.
  std::vector<std::vector<uint8_t>> pieces;
  {
    std::vector<uint8_t> s;
    put_u64(s, uint64_t(st.step()));
    put_u64(s, uint64_t(st.world()));
    put_u64(s, uint64_t(st.micro_batch()));
    put_u64(s, uint64_t(st.optimizer_steps()));
    put_u64(s, uint64_t(st.epoch()));
    put_u64(s, uint64_t(st.position() * st.micro_batch() * st.world()));  // samples seen this epoch
    const auto rng = st.rng_streams();
    put_u64(s, rng.size());
    for (uint64_t d : rng) put_u64(s, d);
    const auto names = st.optimizer_state_names();
    put_u64(s, uint64_t(st.num_params()));
    put_u64(s, names.size());
    pieces.push_back(std::move(s));
    for (int i = 0; i < st.num_params(); i++)
      for (const auto& name : names) {
        const auto v = st.optimizer_state(i, name);
        std::vector<uint8_t> t;
        t.reserve(8 + 4 * v.size());
        put_u64(t, v.size());
        for (float f : v) put_u32(t, float_bits(f));
        pieces.push_back(std::move(t));
      }
  }
  uint64_t length = 0;
  uint32_t c = ~0u;  // the CRC over the concatenated pieces, computed piece by piece
  for (const auto& p : pieces) {
    length += p.size();
    for (uint8_t b : p) {
      c ^= b;
      for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
  }
  const uint32_t sum = ~c;
  std::vector<uint8_t> header(kMagic, kMagic + 8);
  put_u64(header, kVersion);
  put_u64(header, length);
  put_u64(header, sum);

  const std::string dst = state_file(st.rank());
  const std::string tmp = "tmp-" + dst;
  const int h = files.open(tmp);
  files.write(h, header.data(), header.size());
  for (const auto& p : pieces) files.write(h, p.data(), p.size());
  files.fsync(h);
  files.close(h);
  files.rename(tmp, dst);
}

std::string load_state(State& st, Files& files) {
  const std::string own = state_file(st.rank());
  const std::string name = files.exists(own) ? own : state_file(0);
  if (!files.exists(name)) return "missing " + name;
  const auto b = files.read(name);
  if (b.size() < kHeader) return name + " is truncated";
  for (int k = 0; k < 8; k++)
    if (b[k] != kMagic[k]) return name + " has a bad magic";
  if (get_u64(b.data() + 8) != kVersion) return name + " has an unknown version";
  const uint64_t length = get_u64(b.data() + 16);
  if (length != b.size() - kHeader) return name + ": payload length does not match the file";
  const uint64_t sum = get_u64(b.data() + 24);
  if (sum != crc32(b.data() + kHeader, length)) return name + ": checksum mismatch";

  const uint8_t* p = b.data() + kHeader;
  const uint8_t* end = p + length;
  auto u64 = [&](uint64_t& out) {
    if (end - p < 8) return false;
    out = get_u64(p);
    p += 8;
    return true;
  };
  uint64_t step, world, micro, opt_steps, epoch, samples, nrng;
  if (!u64(step) || !u64(world) || !u64(micro) || !u64(opt_steps) || !u64(epoch) || !u64(samples) || !u64(nrng))
    return name + ": short payload";
  if (int64_t(step) != st.step()) return name + ": a state of step " + std::to_string(step);
  std::vector<uint64_t> rng(nrng);
  for (auto& d : rng)
    if (!u64(d)) return name + ": short RNG section";
  uint64_t np, ns;
  if (!u64(np) || !u64(ns)) return name + ": short payload";
  const auto names = st.optimizer_state_names();
  if (int64_t(np) != st.num_params() || ns != names.size()) return name + ": another model or optimizer";
  std::vector<std::vector<float>> tensors;
  for (uint64_t i = 0; i < np * ns; i++) {
    uint64_t n;
    if (!u64(n) || uint64_t(end - p) / 4 < n) return name + ": short tensor";
    if (n != 0 && int64_t(n) != st.param_numel(int(i / ns))) return name + ": a tensor of the wrong size";
    std::vector<float> v(n);
    for (auto& f : v) {
      f = bits_float(get_u32(p));
      p += 4;
    }
    tensors.push_back(std::move(v));
  }
  if (p != end) return name + ": bytes left over";
  const int64_t batch = st.micro_batch() * st.world();
  if (int64_t(samples) % batch != 0) return name + ": samples seen are not whole batches here";

  for (uint64_t i = 0; i < np * ns; i++)
    if (!tensors[i].empty()) st.set_optimizer_state(int(i / ns), names[i % ns], tensors[i]);
  st.set_optimizer_steps(int64_t(opt_steps));
  st.set_rng_streams(rng);
  st.set_sampler(int64_t(epoch), int64_t(samples) / batch);
  return "";
}

}  // namespace lab07

extern "C" Lab07Plugin distlab_lab07 = {kLab07Abi, lab07::save_state, lab07::load_state};
