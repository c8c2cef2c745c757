// Lab 07's host: the student's save_state and load_state. The State is a snapshot the trainer sends with
// the call (its getters answer locally; load_state's setters are collected and sent back with the return,
// so a refused or failed load changes nothing). Files is the trainer's: every open, write, fsync, rename
// and read is a request the trainer runs in the checkpoint's folder, checks and records
// (bridge.cpp, beside this file).
// Read next: grader/host/host.h (what every lab's host shares).
#include <unistd.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/07-checkpoint/api.h"

namespace labhost {

using namespace distlab;

namespace {

struct LabReader : Reader {
  std::string str() {
    std::string s;
    for (char ch; (ch = take<char>()) != '\0';) s += ch;
    return s;
  }
  int64_t count(int64_t limit) {
    const int64_t n = take<int64_t>();
    if (n < 0 || n > limit) _exit(3);
    return n;
  }
};

class Snapshot : public lab07::State {
 public:
  explicit Snapshot(const std::vector<char>& in) {
    LabReader r{{in}};
    rank_ = int(r.take<int64_t>());
    world_ = int(r.take<int64_t>());
    micro_ = r.take<int64_t>();
    step_ = r.take<int64_t>();
    const int64_t nparams = r.count(1 << 20), nnames = r.count(16);
    for (int64_t k = 0; k < nnames; k++) names_.push_back(r.str());
    for (int64_t i = 0; i < nparams; i++) {
      numel_.push_back(r.count(int64_t(1) << 40));
      pnames_.push_back(r.str());
    }
    steps_ = r.take<int64_t>();
    state_.resize(size_t(nparams));
    for (int64_t i = 0; i < nparams; i++)
      for (int64_t k = 0; k < nnames; k++) {
        std::vector<float> v(size_t(r.count(numel_[size_t(i)])));
        for (auto& x : v) x = r.take<float>();
        state_[size_t(i)].push_back(std::move(v));
      }
    streams_.resize(size_t(r.count(1 << 20)));
    for (auto& s : streams_) s = r.take<uint64_t>();
    epoch_ = r.take<int64_t>();
    position_ = r.take<int64_t>();
    set_state_.assign(size_t(nparams), std::vector<bool>(size_t(nnames), false));
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int64_t micro_batch() const override { return micro_; }
  int64_t step() const override { return step_; }
  int num_params() const override { return int(pnames_.size()); }
  std::string param_name(int i) const override { return pnames_.at(index(i)); }
  int64_t param_numel(int i) const override { return numel_.at(index(i)); }
  std::vector<std::string> optimizer_state_names() const override { return names_; }
  std::vector<float> optimizer_state(int i, const std::string& name) const override { return state_.at(index(i)).at(name_index(name)); }
  void set_optimizer_state(int i, const std::string& name, const std::vector<float>& v) override {
    const size_t k = name_index(name);
    if (int64_t(v.size()) != numel_.at(index(i)))
      throw std::invalid_argument("set_optimizer_state(" + std::to_string(i) + ", \"" + name + "\"): " + std::to_string(v.size()) +
                                  " values for " + pnames_[index(i)] + " of " + std::to_string(numel_[index(i)]) + " elements");
    state_[index(i)][k] = v;
    set_state_[index(i)][k] = true;
  }
  int64_t optimizer_steps() const override { return steps_; }
  void set_optimizer_steps(int64_t t) override {
    if (t < 0) throw std::invalid_argument("set_optimizer_steps(" + std::to_string(t) + "): steps are not negative");
    steps_ = t;
    set_steps_ = true;
  }
  std::vector<uint64_t> rng_streams() const override { return streams_; }
  void set_rng_streams(const std::vector<uint64_t>& d) override {
    if (d.size() != streams_.size())
      throw std::invalid_argument("set_rng_streams: " + std::to_string(d.size()) + " streams for a model with " + std::to_string(streams_.size()));
    streams_ = d;
    set_streams_ = true;
  }
  int64_t epoch() const override { return epoch_; }
  int64_t position() const override { return position_; }
  void set_sampler(int64_t epoch, int64_t position) override {
    if (epoch < 0 || position < 0) throw std::invalid_argument("set_sampler: epoch and position are not negative");
    epoch_ = epoch;
    position_ = position;
    set_sampler_ = true;
  }

  // what load_state set, for the trainer
  void encode(const std::string& refusal, std::vector<char>& out) const {
    auto put = [&](const void* p, size_t n) { out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); };
    const int32_t len = int32_t(refusal.size());
    put(&len, 4);
    put(refusal.data(), refusal.size());
    const int64_t fs = set_steps_;
    put(&fs, 8);
    put(&steps_, 8);
    for (size_t i = 0; i < state_.size(); i++)
      for (size_t k = 0; k < names_.size(); k++) {
        const int64_t n = set_state_[i][k] ? int64_t(state_[i][k].size()) : -1;
        put(&n, 8);
        if (n > 0) put(state_[i][k].data(), size_t(n) * 4);
      }
    const int64_t fr = set_streams_, ns = int64_t(streams_.size());
    put(&fr, 8);
    put(&ns, 8);
    put(streams_.data(), streams_.size() * 8);
    const int64_t fsa = set_sampler_;
    put(&fsa, 8);
    put(&epoch_, 8);
    put(&position_, 8);
  }

 private:
  size_t index(int i) const {
    if (i < 0 || i >= int(pnames_.size()))
      throw std::out_of_range("parameter " + std::to_string(i) + " of " + std::to_string(pnames_.size()) + " (0.." +
                              std::to_string(int(pnames_.size()) - 1) + ")");
    return size_t(i);
  }
  size_t name_index(const std::string& name) const {
    for (size_t k = 0; k < names_.size(); k++)
      if (names_[k] == name) return k;
    throw std::invalid_argument("no optimizer state named \"" + name + "\" (optimizer_state_names() lists them)");
  }
  int rank_ = 0, world_ = 1;
  int64_t micro_ = 0, step_ = 0, steps_ = 0, epoch_ = 0, position_ = 0;
  std::vector<std::string> names_, pnames_;
  std::vector<int64_t> numel_;
  std::vector<std::vector<std::vector<float>>> state_;
  std::vector<uint64_t> streams_;
  std::vector<std::vector<bool>> set_state_;
  bool set_steps_ = false, set_streams_ = false, set_sampler_ = false;
};

class RemoteFiles : public lab07::Files {
 public:
  int open(const std::string& name) override {
    put(labproto::kFileOpen, name.data(), name.size());
    auto back = expect_data(4);
    int32_t h;
    std::memcpy(&h, back.data(), 4);
    return h;
  }
  void write(int handle, const void* data, size_t n) override {
    if (n > labproto::kMaxPayload) throw std::invalid_argument("write of " + std::to_string(n) + " bytes: at most 256 MiB per call");
    if (n && !data) throw std::invalid_argument("write: no data");
    put(labproto::kFileWrite, data, n, {handle});
    expect_data(0);
  }
  void fsync(int handle) override {
    put(labproto::kFileSync, nullptr, 0, {handle});
    expect_data(0);
  }
  void close(int handle) override {
    put(labproto::kFileClose, nullptr, 0, {handle});
    expect_data(0);
  }
  void rename(const std::string& from, const std::string& to) override {
    std::string both = from;
    both.push_back('\0');
    both += to;
    put(labproto::kFileRename, both.data(), both.size());
    expect_data(0);
  }
  bool exists(const std::string& name) override {
    put(labproto::kFileExists, name.data(), name.size());
    auto back = expect_data(4);
    int32_t v;
    std::memcpy(&v, back.data(), 4);
    return v != 0;
  }
  std::vector<uint8_t> read(const std::string& name) override {
    put(labproto::kFileRead, name.data(), name.size());
    auto back = expect_data(-1);
    return std::vector<uint8_t>(back.begin(), back.end());
  }
};

}  // namespace

int serve_lab07(void* plugin) {
  auto* t = load_table<const Lab07Plugin>(plugin, "distlab_lab07", kLab07Abi, "ckpt.cpp", "labs/07-checkpoint/api.h");
  if (!t) return 2;
  return serve_calls([t](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    Snapshot st(in);
    RemoteFiles files;
    switch (f.arg[0]) {
      case labproto::kSaveState:
        need(t->save_state, "save_state");
        t->save_state(st, files);
        return true;
      case labproto::kLoadState: {
        need(t->load_state, "load_state");
        const std::string refusal = t->load_state(st, files);
        st.encode(refusal, out);
        return true;
      }
      default:
        return false;
    }
  });
}

}  // namespace labhost
