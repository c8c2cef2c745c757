// Lab 07, alternative A ("named_trailer"): a table-driven CRC-32 (256-entry table built once); a
// self-describing file addressed by NAME — every optimizer tensor is stored with its parameter name and state
// name and found again by them on load (not by position); the CRC-32 is a trailer over every byte before
// it (magic and header included) instead of a header field over the payload; the file is written to a
// ".part" name in one write, fsync'ed, closed, then renamed. Resharding keeps the samples seen
// (position * micro_batch * world) and turns them back into this world's batches.
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "labs/07-checkpoint/api.h"

namespace lab07 {

namespace {
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1u) ? (0xEDB88320u ^ (c >> 1)) : (c >> 1);
      t[i] = c;
    }
    return t;
  }();
  return table;
}

constexpr char kMagic[8] = {'C', 'K', 'P', 'T', '-', 'A', 'L', 'T'};
constexpr uint32_t kVersion = 2;

struct Writer {
  std::vector<uint8_t> out;
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  void u32(uint32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  size_t end;
  bool ok = true;
  Reader(const std::vector<uint8_t>& b, size_t e) : in(b), end(e) {}
  bool raw(void* p, size_t n) {
    if (!ok || n > end - at) return ok = false;
    std::memcpy(p, in.data() + at, n);
    at += n;
    return true;
  }
  uint32_t u32() { uint32_t v = 0; raw(&v, 4); return v; }
  int64_t i64() { int64_t v = 0; raw(&v, 8); return v; }
  uint64_t u64() { uint64_t v = 0; raw(&v, 8); return v; }
  std::string str() {
    const uint32_t n = u32();
    if (!ok || n > end - at) { ok = false; return {}; }
    std::string s(reinterpret_cast<const char*>(in.data() + at), n);
    at += n;
    return s;
  }
};
}  // namespace

uint32_t crc32(const uint8_t* p, size_t n) {
  const auto& t = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void save_state(State& st, Files& files) {
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kVersion);
  w.i64(st.step());
  w.i64(st.world());
  w.i64(st.micro_batch());
  w.i64(st.optimizer_steps());
  w.i64(st.epoch());
  w.i64(st.position());
  const auto rng = st.rng_streams();
  w.u32(static_cast<uint32_t>(rng.size()));
  for (uint64_t d : rng) w.u64(d);
  const auto names = st.optimizer_state_names();
  const int np = st.num_params();
  w.u32(static_cast<uint32_t>(np) * static_cast<uint32_t>(names.size()));  // number of entries
  for (int i = 0; i < np; i++) {
    for (const auto& name : names) {
      const auto v = st.optimizer_state(i, name);
      w.str(st.param_name(i));
      w.str(name);
      w.i64(static_cast<int64_t>(v.size()));
      w.raw(v.data(), v.size() * sizeof(float));
    }
  }
  w.u32(crc32(w.out.data(), w.out.size()));  // trailer: covers every byte before it

  const std::string final_name = state_file(st.rank());
  const std::string part = final_name + ".part";
  const int h = files.open(part);
  files.write(h, w.out.data(), w.out.size());
  files.fsync(h);
  files.close(h);
  files.rename(part, final_name);
}

std::string load_state(State& st, Files& files) {
  std::string name = state_file(st.rank());
  if (!files.exists(name)) name = state_file(0);  // a world larger or other than the one that saved
  if (!files.exists(name)) return "no state file " + name + " in this checkpoint";
  const std::vector<uint8_t> b = files.read(name);
  if (b.size() < sizeof kMagic + 4 + 4) return name + ": too short (" + std::to_string(b.size()) + " bytes)";
  uint32_t stored = 0;
  std::memcpy(&stored, b.data() + b.size() - 4, 4);
  const uint32_t actual = crc32(b.data(), b.size() - 4);
  if (stored != actual) return name + ": CRC-32 mismatch (corrupt)";
  if (std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) return name + ": not a state file (magic)";

  Reader r(b, b.size() - 4);
  char magic[8];
  r.raw(magic, 8);
  if (r.u32() != kVersion) return name + ": unknown version";
  const int64_t step = r.i64();
  const int64_t world = r.i64();
  const int64_t micro = r.i64();
  const int64_t opt_steps = r.i64();
  const int64_t epoch = r.i64();
  const int64_t position = r.i64();
  const uint32_t nrng = r.u32();
  if (!r.ok) return name + ": truncated header";
  std::vector<uint64_t> rng;
  for (uint32_t k = 0; k < nrng && r.ok; k++) rng.push_back(r.u64());
  const uint32_t entries = r.u32();
  if (!r.ok) return name + ": truncated";
  if (step != st.step()) return name + ": saved at step " + std::to_string(step) + ", not " + std::to_string(st.step());
  if (world <= 0 || micro <= 0) return name + ": bad world or micro-batch";

  std::map<std::pair<std::string, std::string>, std::vector<float>> saved;
  for (uint32_t k = 0; k < entries; k++) {
    std::string pn = r.str();
    std::string sn = r.str();
    const int64_t n = r.i64();
    if (!r.ok || n < 0 || static_cast<uint64_t>(n) * sizeof(float) > r.end - r.at) return name + ": truncated tensor";
    std::vector<float> v(static_cast<size_t>(n));
    r.raw(v.data(), v.size() * sizeof(float));
    saved[{std::move(pn), std::move(sn)}] = std::move(v);
  }
  if (!r.ok || r.at != r.end) return name + ": trailing or missing bytes";

  // Check everything first, then apply: a refused checkpoint must leave the state untouched.
  const auto names = st.optimizer_state_names();
  for (int i = 0; i < st.num_params(); i++)
    for (const auto& sn : names) {
      auto it = saved.find({st.param_name(i), sn});
      if (it == saved.end()) return name + ": no " + sn + " for " + st.param_name(i);
      if (!it->second.empty() && static_cast<int64_t>(it->second.size()) != st.param_numel(i))
        return name + ": " + sn + " of " + st.param_name(i) + " has the wrong size";
    }
  const int64_t samples = position * micro * world;
  const int64_t per_batch = st.micro_batch() * st.world();
  if (samples % per_batch != 0)
    return name + ": " + std::to_string(samples) + " samples seen are not whole batches of " + std::to_string(per_batch);

  for (int i = 0; i < st.num_params(); i++)
    for (const auto& sn : names) {
      const auto& v = saved.at({st.param_name(i), sn});
      if (!v.empty()) st.set_optimizer_state(i, sn, v);
    }
  st.set_optimizer_steps(opt_steps);
  st.set_rng_streams(rng);
  st.set_sampler(epoch, samples / per_batch);
  return "";
}

}  // namespace lab07

extern "C" Lab07Plugin distlab_lab07 = {kLab07Abi, lab07::save_state, lab07::load_state};
