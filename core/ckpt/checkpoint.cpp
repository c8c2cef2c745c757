#include "core/ckpt/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/ckpt/peft_adapter.h"
#include "core/ops/cpu/nf4.h"
#include "core/util/atomic_file.h"
#include "core/util/read_file.h"

namespace distlab {

namespace fs = std::filesystem;

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string crc32_hex(uint32_t c) { return fmt::format("{:08x}", c); }

std::string step_dir_name(int64_t step) { return fmt::format("step-{:06d}", step); }

static int64_t step_of(const std::string& name);  // step-NNNNNN's number, -1 for another name

// A checkpoint's own small file (manifest.json, COMPLETE): a regular file of at most `max_bytes`, never a
// link to /dev/zero nor a FIFO (core/util/read_file.h); anything else is a CheckpointError, so that resume
// moves on to the checkpoint before.
static std::vector<uint8_t> read_bytes(const std::string& path, uint64_t max_bytes, const char* what) {
  try {
    return read_regular_file(path, max_bytes, what);
  } catch (const IoError& e) {
    throw CheckpointError(e.what(), "a checkpoint's files are the regular files its save wrote");
  }
}

// ---- writing ----

void CheckpointWriter::add(const std::string& logical, const Shape& shape, int64_t offset, const float* data, int64_t numel,
                           const std::string& category) {
  if (numel <= 0) return;
  Piece p{logical, "", category, shape, offset, numel, std::vector<float>(data, data + numel)};
  p.tensor = offset == 0 && numel == shape_numel(shape) ? logical : fmt::format("{}@{}", logical, offset);
  pieces_.push_back(std::move(p));
}

int64_t CheckpointWriter::bytes() const {
  int64_t b = 0;
  for (const auto& p : pieces_) b += 4 * p.numel;
  return b;
}

nlohmann::json CheckpointWriter::write(const std::string& step_dir, int rank, const std::function<void()>& before_commit) {
  StFile f;
  nlohmann::json pieces = nlohmann::json::array();
  for (auto& p : pieces_) {
    StTensor t;
    t.dtype = "F32";
    t.shape = p.tensor == p.logical ? p.shape : Shape{p.numel};
    t.bytes.resize(size_t(p.numel) * 4);
    std::memcpy(t.bytes.data(), p.values.data(), t.bytes.size());
    if (f.tensors.count(p.tensor))
      throw Error(fmt::format("checkpoint: rank {} has two pieces named '{}'", rank, p.tensor));
    f.tensors[p.tensor] = std::move(t);
    pieces.push_back({{"logical", p.logical}, {"tensor", p.tensor}, {"shape", p.shape}, {"offset", p.offset},
                      {"numel", p.numel}, {"category", p.category}});
  }
  f.metadata["format"] = "distlab-checkpoint";
  f.metadata["distlab.state"] = state_.dump();
  const std::string file = fmt::format("rank-{:05d}.safetensors", rank);
  const WrittenFile w = write_safetensors((fs::path(step_dir) / file).string(), f, before_commit);
  return {{"file", file}, {"rank", rank}, {"bytes", w.bytes}, {"crc32", crc32_hex(w.crc32)}, {"pieces", pieces}};
}

void write_manifest(const std::string& step_dir, nlohmann::json m, const std::vector<nlohmann::json>& ranks) {
  nlohmann::json files = nlohmann::json::object();
  nlohmann::json tensors = nlohmann::json::object();
  std::map<std::string, int64_t> bytes;
  for (const auto& r : ranks) {
    files[r.at("file").get<std::string>()] = {{"rank", r.at("rank")}, {"bytes", r.at("bytes")}, {"crc32", r.at("crc32")}};
    for (const auto& p : r.at("pieces")) {
      const std::string logical = p.at("logical");
      auto& t = tensors[logical];
      if (t.is_null()) t = {{"shape", p.at("shape")}, {"category", p.at("category")}, {"pieces", nlohmann::json::array()}};
      t["pieces"].push_back({{"rank", r.at("rank")}, {"tensor", p.at("tensor")}, {"offset", p.at("offset")}, {"numel", p.at("numel")}});
      bytes[p.at("category").get<std::string>()] += 4 * p.at("numel").get<int64_t>();
    }
  }
  int64_t total = 0;
  nlohmann::json by_category = nlohmann::json::object();
  for (auto& [k, v] : bytes) {
    by_category[k] = v;
    total += v;
  }
  by_category["total"] = total;
  m["format"] = "distlab-checkpoint";
  m["version"] = 1;
  m["files"] = files;
  m["tensors"] = tensors;
  m["bytes"] = by_category;
  const std::string text = m.dump(1);
  AtomicFile mf((fs::path(step_dir) / "manifest.json").string());
  mf.write(text);
  mf.commit();
  AtomicFile done((fs::path(step_dir) / "COMPLETE").string());  // last: the folder is a checkpoint from here on
  done.write(fmt::format("step {}\nmanifest.json crc32 {}\n", m.at("step").get<int64_t>(), crc32_hex(crc32(text.data(), text.size()))));
  done.commit();
}

// ---- reading ----

Checkpoint::Checkpoint(const std::string& step_dir) : dir_(step_dir) {
  if (!fs::is_directory(step_dir)) throw CheckpointError(fmt::format("{}: not a folder", step_dir));
  const fs::path complete = fs::path(step_dir) / "COMPLETE";
  if (!fs::exists(complete))
    throw IncompleteCheckpoint(fmt::format("{}: incomplete (no COMPLETE marker: the save did not finish)", step_dir));
  std::vector<uint8_t> text = read_bytes((fs::path(step_dir) / "manifest.json").string(), uint64_t(256) << 20, "the manifest");
  std::vector<uint8_t> marker = read_bytes(complete.string(), 64 << 10, "the COMPLETE marker");
  const std::string want = crc32_hex(crc32(text.data(), text.size()));
  if (std::string(marker.begin(), marker.end()).find("manifest.json crc32 " + want) == std::string::npos)
    throw CheckpointError(fmt::format("{}: manifest.json does not match its checksum in COMPLETE (corrupt)", step_dir));
  try {
    manifest_ = nlohmann::json::parse(text.begin(), text.end());
    if (manifest_.at("format") != "distlab-checkpoint" || manifest_.at("version") != 1)
      throw CheckpointError(fmt::format("{}: not a distlab checkpoint of version 1", step_dir));
    // the step is the folder's: an edited one (COMPLETE's checksum recomputed) would resume elsewhere, and
    // its run save over the checkpoints after it
    const int64_t step = manifest_.at("step").get<int64_t>(), named = step_of(fs::path(step_dir).filename().string());
    if (step < 0 || (named >= 0 && step != named))
      throw CheckpointError(fmt::format("{}/manifest.json: step {} in a folder of step {}", step_dir, step, named),
                            "a checkpoint's manifest names the step of its folder (step-NNNNNN)");
    if (const int w = manifest_.at("world_size").get<int>(); w < 1 || w > (1 << 20))
      throw CheckpointError(fmt::format("{}/manifest.json: world_size {} is impossible", step_dir, w));
    for (auto& [name, f] : manifest_.at("files").items()) {
      const int rank = f.at("rank").get<int>();
      if (rank < 0 || name != fmt::format("rank-{:05d}.safetensors", rank))  // never a path out of the folder
        throw CheckpointError(fmt::format("{}/manifest.json: a file named '{}' for rank {} (rank-NNNNN.safetensors expected)", step_dir,
                                          name.substr(0, 100), rank));
      file_name_[rank] = name;
      std::error_code ec;
      const auto size = fs::file_size(fs::path(step_dir) / name, ec);
      if (ec) throw CheckpointError(fmt::format("{}/{}: missing", step_dir, name));
      if (size != f.at("bytes").get<uint64_t>())
        throw CheckpointError(fmt::format("{}/{}: {} bytes, the manifest says {} (truncated or replaced)", step_dir, name, size,
                                          f.at("bytes").get<uint64_t>()));
    }
    // every number a read will use, checked now: a manifest is data, and data can be hostile
    constexpr int64_t kMax = int64_t(1) << 40;
    for (auto& [name, t] : manifest_.at("tensors").items()) {
      int64_t numel = 1;
      for (const auto& d : t.at("shape")) {
        const int64_t v = d.get<int64_t>();
        if (v < 0 || v > kMax || (v > 0 && numel > kMax / v))
          throw CheckpointError(fmt::format("{}/manifest.json: tensor {} has an impossible shape {}", step_dir, name, t.at("shape").dump()));
        numel *= v;
      }
      for (const auto& p : t.at("pieces")) {
        const int64_t off = p.at("offset").get<int64_t>(), n = p.at("numel").get<int64_t>();
        if (off < 0 || n <= 0 || off > numel || n > numel - off)
          throw CheckpointError(fmt::format("{}/manifest.json: tensor {} has a piece [{}, {}) outside its {} elements", step_dir, name, off,
                                            off + (n > 0 && off < kMax ? n : 0), numel));
        if (!file_name_.count(p.at("rank").get<int>()))
          throw CheckpointError(fmt::format("{}: tensor {} has a piece in rank {}'s file, which the manifest does not list", step_dir, name,
                                            p.at("rank").get<int>()));
        p.at("tensor").get<std::string>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}/manifest.json: malformed ({})", step_dir, e.what()));
  }
}

// What no run saves, field by field. A state whose bytes match their CRC (recomputed by whoever edited them)
// may still hold a negative epoch or an optimizer step of -1: such a checkpoint is not usable, and
// resume = auto falls back to the one before it instead of failing in the middle of loading.
std::vector<std::string> rank_state_problems(const nlohmann::json& st, int64_t step) {
  std::vector<std::string> bad;
  if (!st.is_object()) return {"it is not a JSON object"};
  // an integer at `path` (a/b/c) within [lo, hi]; absent is the loader's to judge (older checkpoints lack some)
  auto integer = [&](const std::string& path, int64_t lo, int64_t hi) {
    const nlohmann::json* v = &st;
    for (size_t at = 0; at <= path.size();) {
      const size_t end = std::min(path.find('/', at), path.size());
      const std::string key = path.substr(at, end - at);
      if (!v->is_object() || !v->contains(key)) return;
      v = &(*v)[key];
      at = end + 1;
    }
    const std::string name = path;
    if (!v->is_number_integer() && !v->is_number_unsigned()) bad.push_back(fmt::format("{} is {} (not an integer)", name, v->dump()));
    else if (v->is_number_unsigned() ? (v->get<uint64_t>() > uint64_t(hi) || (lo > 0 && v->get<uint64_t>() < uint64_t(lo)))
                                     : (v->get<int64_t>() < lo || v->get<int64_t>() > hi))
      bad.push_back(fmt::format("{} is {} (not in {}..{})", name, v->dump(), lo, hi));
  };
  constexpr int64_t kBig = int64_t(1) << 50;
  integer("step", step, step);
  integer("world_size", 1, 1 << 20);
  integer("dp_world", 1, 1 << 20);
  integer("micro_batch", 1, kBig);
  integer("accum_steps", 1, kBig);
  integer("data/epoch", 0, kBig);
  integer("data/position", 0, kBig);
  integer("optimizer/steps", 0, kBig);
  integer("scheduler/steps", 0, kBig);
  integer("trainer/epoch", 0, kBig);
  integer("trainer/skipped_steps", 0, std::max<int64_t>(step, 0));
  integer("scaler/growth_tracker", 0, kBig);
  integer("scaler/hysteresis_left", 0, kBig);
  if (st.contains("optimizer") && st["optimizer"].is_object() && st["optimizer"].contains("param_steps")) {
    const auto& ps = st["optimizer"]["param_steps"];
    if (!ps.is_object()) bad.push_back("optimizer/param_steps is not an object");
    else
      for (const auto& [name, v] : ps.items())
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kBig)
          bad.push_back(fmt::format("optimizer/param_steps/{} is {} (a step count is 0 or more)", name, v.dump()));
  }
  if (st.contains("scaler") && st["scaler"].is_object() && st["scaler"].contains("scale")) {
    const auto& sc = st["scaler"]["scale"];
    if (!sc.is_number() || !(sc.get<double>() > 0) || !std::isfinite(sc.get<double>()))
      bad.push_back(fmt::format("scaler/scale is {} (a loss scale is a positive finite number)", sc.dump()));
  }
  if (st.contains("rng") && st["rng"].is_object() && st["rng"].contains("dropout_calls")) {
    const auto& calls = st["rng"]["dropout_calls"];
    if (!calls.is_array()) bad.push_back("rng/dropout_calls is not a list");
    else
      for (const auto& v : calls)
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
          bad.push_back(fmt::format("rng/dropout_calls holds {} (a count of draws)", v.dump()));
          break;
        }
  }
  return bad;
}

void Checkpoint::verify_files() {
  for (const auto& [rank, name] : file_name_) {
    const StFile& f = file_of_rank(rank);
    // the counters too: bytes that match their CRC can still say what no run saved
    if (f.metadata.find("distlab.state") == f.metadata.end()) continue;
    if (const auto bad = rank_state_problems(rank_state(rank), step()); !bad.empty())
      throw CheckpointError(fmt::format("{}: rank {}'s state holds what no run saves: {}", dir_, rank, fmt::join(bad, "; ")),
                            "its bytes match their checksum, so they were written as they are (edited, or a bug): use an older "
                            "checkpoint (resume = auto skips this one) or remove this folder");
  }
}

const StFile& Checkpoint::file_of_rank(int rank) {
  auto it = files_.find(rank);
  if (it != files_.end()) return *it->second;
  auto nit = file_name_.find(rank);
  if (nit == file_name_.end()) throw CheckpointError(fmt::format("{}: no file for rank {}", dir_, rank));
  const std::string path = (fs::path(dir_) / nit->second).string();
  std::vector<uint8_t> raw = read_bytes(path, uint64_t(1) << 40, "a rank's file");
  const std::string want = manifest_["files"][nit->second].at("crc32").get<std::string>();
  const std::string got = crc32_hex(crc32(raw.data(), raw.size()));
  if (got != want)
    throw CheckpointError(fmt::format("{}: CRC-32 {} but the manifest recorded {} (the file changed after it was saved: corrupt)", path, got, want));
  try {
    auto f = std::make_unique<StFile>(parse_safetensors(raw, path));
    return *(files_[rank] = std::move(f));
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
}

Shape Checkpoint::shape(const std::string& logical) const { return manifest_.at("tensors").at(logical).at("shape").get<Shape>(); }

void Checkpoint::read(const std::string& logical, int64_t offset, int64_t numel, float* out, int prefer_rank) {
  if (numel <= 0) return;
  if (!has(logical)) throw CheckpointError(fmt::format("{}: no tensor '{}'", dir_, logical), "was it saved by a run of the same model?");
  const auto& t = manifest_["tensors"][logical];
  std::vector<nlohmann::json> pieces(t.at("pieces").begin(), t.at("pieces").end());
  std::stable_sort(pieces.begin(), pieces.end(), [&](const nlohmann::json& a, const nlohmann::json& b) {
    return (a.at("rank").get<int>() != prefer_rank) < (b.at("rank").get<int>() != prefer_rank);
  });
  std::vector<char> covered(size_t(numel), 0);
  int64_t left = numel;
  for (const auto& p : pieces) {
    const int64_t po = p.at("offset"), pn = p.at("numel");
    const int64_t lo = std::max(offset, po), hi = std::min(offset + numel, po + pn);
    if (lo >= hi) continue;
    const StFile& f = file_of_rank(p.at("rank").get<int>());
    auto it = f.tensors.find(p.at("tensor").get<std::string>());
    if (it == f.tensors.end() || it->second.dtype != "F32" || int64_t(it->second.bytes.size()) != 4 * pn)
      throw CheckpointError(fmt::format("{}: rank {}'s file lacks the piece '{}' the manifest lists", dir_, p.at("rank").get<int>(),
                                        p.at("tensor").get<std::string>()));
    const float* src = reinterpret_cast<const float*>(it->second.bytes.data());
    for (int64_t i = lo; i < hi; i++)
      if (!covered[size_t(i - offset)]) {
        out[i - offset] = src[i - po];
        covered[size_t(i - offset)] = 1;
        left--;
      }
    if (left == 0) return;
  }
  throw CheckpointError(fmt::format("{}: the pieces of '{}' do not cover elements [{}, {})", dir_, logical, offset, offset + numel));
}

nlohmann::json Checkpoint::rank_state(int rank) {
  const StFile& f = file_of_rank(rank);
  auto it = f.metadata.find("distlab.state");
  if (it == f.metadata.end()) throw CheckpointError(fmt::format("{}: rank {}'s file has no distlab.state", dir_, rank));
  try {
    return nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: rank {}'s state is not valid JSON ({})", dir_, rank, e.what()));
  }
}

// ---- the folder of checkpoints ----

static int64_t step_of(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t(1) << 50)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory()) found.push_back({s, e.path().string()});
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep) {
  std::vector<std::string> removed;
  int64_t complete = 0;
  for (const std::string& d : list_checkpoints(dir)) {
    const bool done = fs::exists(fs::path(d) / "COMPLETE");
    if (done) complete++;
    // beyond the newest `keep` complete ones, and any incomplete one older than a complete one
    if ((done && keep > 0 && complete > keep) || (!done && complete > 0)) {
      std::error_code ec;
      fs::remove_all(d, ec);
      if (!ec) removed.push_back(d);
    }
  }
  return removed;
}

std::string find_checkpoint(const std::string& dir, std::vector<Skipped>& skipped, const std::function<void(Checkpoint&)>& accept) {
  for (const std::string& d : list_checkpoints(dir)) {
    try {
      Checkpoint c(d);
      c.verify_files();
      if (accept) accept(c);
      return d;
    } catch (const IncompleteCheckpoint& e) {
      skipped.push_back({e.what(), true});
    } catch (const CheckpointError& e) {
      skipped.push_back({e.what(), false});
    }
  }
  return "";
}

std::string resolve_checkpoint_path(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json") || fs::exists(fs::path(path) / "COMPLETE") || step_of(fs::path(path).filename().string()) >= 0)
    return path;
  std::vector<Skipped> skipped;
  const std::string found = find_checkpoint(path, skipped);
  if (found.empty()) {
    std::string why;
    for (const auto& s : skipped) why += "\n  " + s.reason;
    throw CheckpointError(fmt::format("{}: no complete checkpoint{}", path, why.empty() ? " (no step-NNNNNN folders)" : ":" + why),
                          "give a checkpoint.dir or one of its step folders");
  }
  return found;
}

std::string inspect_checkpoint(const std::string& path, nlohmann::json* json) {
  Checkpoint c(resolve_checkpoint_path(path));
  c.verify_files();  // throws on the first bad file
  const auto& m = c.manifest();
  std::string s = fmt::format("{}\n  step {} | strategy {} | {} rank(s) | precision {} | optimizer {}\n  saved: {} | config hash {}\n", c.dir(),
                              c.step(), m.value("strategy", "?"), c.world_size(), m.value("precision", "?"), m.value("optimizer", "?"),
                              m.value("reason", "?"), m.value("config_hash", "?"));
  s += "  files (CRC-32 checked: OK):\n";
  for (auto& [name, f] : m.at("files").items())
    s += fmt::format("    {:<26} rank {:>3}  {:>12} bytes  crc32 {}\n", name, f.at("rank").get<int>(), f.at("bytes").get<uint64_t>(),
                     f.at("crc32").get<std::string>());
  s += "  bytes by category:\n";
  for (auto& [k, v] : m.at("bytes").items()) s += fmt::format("    {:<12} {:>14}\n", k, v.get<int64_t>());
  s += fmt::format("  tensors ({}):\n", m.at("tensors").size());
  for (auto& [name, t] : m.at("tensors").items()) {
    std::string ranks;
    for (const auto& p : t.at("pieces")) ranks += (ranks.empty() ? "" : ",") + std::to_string(p.at("rank").get<int>());
    s += fmt::format("    {:<52} {:<16} {:<11} pieces on rank {}\n", name, shape_str(t.at("shape").get<Shape>()),
                     t.at("category").get<std::string>(), ranks);
  }
  if (json) {
    *json = m;
    (*json)["dir"] = c.dir();
    (*json)["checksums_ok"] = true;
  }
  return s;
}

// the run's LoRA scaling from the manifest's config (alpha / r, or alpha / sqrt(r) under rsLoRA)
static float manifest_lora_scaling(const Checkpoint& c, const std::string& path) {
  const nlohmann::json& m = c.manifest();
  auto value = [&](const char* key) -> std::string {
    if (!m.contains("config") || !m.at("config").contains(key))
      throw CheckpointError(fmt::format("{}: its manifest has no {} (written before LoRA)", path, key), "export it without --merge");
    return m.at("config").at(key).get<std::string>();
  };
  const double r = std::stod(value("lora.r")), alpha = std::stod(value("lora.alpha"));
  if (r <= 0) throw CheckpointError(fmt::format("{}: the run had no LoRA adapters (lora.r = 0): nothing to merge", path), "export it without --merge");
  return float(value("lora.use_rslora") == "true" ? alpha / std::sqrt(r) : alpha / r);
}

// QLoRA's 4-bit weights in a checkpoint (core/nn/qlora.h): each held as its bytes (as f32 values) beside its
// quant state. The names of those that are bytes in a file (U8): the weight, its JSON, and its absmax when
// double-quantized.
static const std::string kQuantJson = ".quant_state.bitsandbytes__nf4";

static bool is_bytes(const std::map<std::string, F32Tensor>& all, const std::string& name) {
  if (name.ends_with(kQuantJson) || all.count(name + kQuantJson)) return true;
  return name.ends_with(".absmax") && all.count(name.substr(0, name.size() - 7) + ".nested_absmax");
}

// Each 4-bit weight replaced by its f32 values (bitsandbytes' dequantize_4bit), its quant state dropped:
// what --merge folds the adapters into
static void dequantize_4bit(std::map<std::string, F32Tensor>& all, const std::string& dir) {
  std::vector<std::string> names;
  for (auto& [name, t] : all)
    if (name.ends_with(kQuantJson)) names.push_back(name.substr(0, name.size() - kQuantJson.size()));
  for (const std::string& w : names) {
    auto bytes = [&](const std::string& n) {
      const F32Tensor& t = all.at(n);
      return std::vector<uint8_t>(t.v.begin(), t.v.end());
    };
    const std::vector<uint8_t> text = bytes(w + kQuantJson);
    nlohmann::json js;
    try {
      js = nlohmann::json::parse(std::string(text.begin(), text.end()));
      Nf4Weights q;
      const Shape shape = js.at("shape").get<Shape>();
      q.numel = shape_numel(shape);
      q.block = js.at("blocksize").get<int64_t>();
      q.double_quant = js.contains("nested_offset");
      q.packed = bytes(w);
      if (q.double_quant) {
        q.block2 = js.at("nested_blocksize").get<int64_t>();
        q.offset = float(js.at("nested_offset").get<double>());
        q.absmax_q = bytes(w + ".absmax");
        q.absmax2 = all.at(w + ".nested_absmax").v;
      } else {
        q.absmax = all.at(w + ".absmax").v;
      }
      F32Tensor out{shape, std::vector<float>(size_t(q.numel))};
      nf4_dequantize_weights(q, out.v.data());
      for (const char* suffix : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4"})
        all.erase(w + suffix);
      all[w] = std::move(out);
    } catch (const std::exception& e) {
      throw CheckpointError(fmt::format("{}: the 4-bit weight {} cannot be dequantized: {}", dir, w, e.what()), "the checkpoint is damaged; export it without --merge");
    }
  }
}

void export_checkpoint(const std::string& path, const std::string& out, DType dtype, bool merge) {
  const std::string dir = resolve_checkpoint_path(path);
  Checkpoint c(dir);
  std::map<std::string, F32Tensor> all;
  std::map<std::string, std::string> category;
  for (auto& [name, t] : c.manifest().at("tensors").items()) {
    const std::string cat = t.at("category");
    if (cat != "weights" && cat != "buffers") continue;
    F32Tensor& x = all[name];
    x.shape = t.at("shape").get<Shape>();
    x.v.resize(size_t(shape_numel(x.shape)));
    c.read(name, 0, int64_t(x.v.size()), x.v.data(), 0);
    category[name] = cat;
  }
  if (merge) dequantize_4bit(all, dir);  // QLoRA: the sum W + s·BA is not 4-bit; the merged model is 16 or 32-bit
  if (merge && merge_lora_tensors(all, manifest_lora_scaling(c, dir)) == 0)
    throw CheckpointError(fmt::format("{}: no LoRA adapters to merge", dir), "export it without --merge");
  StFile f;
  for (auto& [name, x] : all) {
    const std::string& cat = category.at(name);
    const Shape& shape = x.shape;
    std::vector<float>& v = x.v;
    StTensor st;
    st.shape = shape;
    if (name.ends_with(".num_batches_tracked")) {  // PyTorch keeps BatchNorm's counter as int64
      st.dtype = "I64";
      st.bytes.resize(8);
      const int64_t n = int64_t(v.at(0));
      std::memcpy(st.bytes.data(), &n, 8);
    } else {
      // running statistics stay f32; a 4-bit weight and its quant state keep their bytes (bitsandbytes' file)
      const DType d = is_bytes(all, name) ? DType::u8 : cat == "buffers" ? DType::f32 : dtype;
      st.dtype = dtype_safetensors_name(d);
      st.bytes.resize(v.size() * size_t(dtype_size(d)));
      convert(v.data(), DType::f32, st.bytes.data(), d, int64_t(v.size()));
    }
    f.tensors[name] = std::move(st);
  }
  add_tied_lm_head(f);  // PyTorch's GPT state_dict has both keys of the tied pair
  f.metadata["format"] = "pt";
  f.metadata["producer"] = "distlab";
  f.metadata["step"] = std::to_string(c.step());
  write_safetensors(out, f);
}

}  // namespace distlab
