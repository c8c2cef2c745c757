// Lab 05's host: the student's FSDP. flat_layout is asked directly. Each hook call carries the unit, the
// options and what the Fsdp answers locally (the flats, their units, their parameters' sizes and names — not
// the order the units run in, nor the root: the plugin learns those); every buffer, copy, collective and view
// is a request the trainer runs on its own memory
// and process group (bridge.cpp, beside this file), checks, counts and answers.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/05-fsdp-1b/api.h"

namespace labhost {

using namespace distlab;

namespace {

struct Flat {
  int unit = 0;
  std::vector<int64_t> numel;
  std::vector<std::string> name;
};

struct LabReader : Reader {  // the lab's records on top of take<T>() (host.h)
  std::string cstr() {
    const void* end = at < in.size() ? std::memchr(in.data() + at, 0, in.size() - at) : nullptr;
    if (!end) _exit(3);
    std::string s(in.data() + at, static_cast<const char*>(end));
    at += s.size() + 1;
    return s;
  }
};

void append(std::vector<char>& out, const void* p, size_t n) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
}

class RemoteFsdp : public lab05::Fsdp {
 public:
  RemoteFsdp(int rank, int world, std::vector<Flat> flats) : rank_(rank), world_(world), flats_(std::move(flats)) {
    for (const Flat& f : flats_) units_ = std::max(units_, f.unit + 1);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int num_units() const override { return units_; }
  std::vector<int> flats(int unit) const override {
    if (unit < 0 || unit >= units_) throw std::out_of_range("flats(" + std::to_string(unit) + "): there are units 0.." + std::to_string(units_ - 1));
    std::vector<int> v;
    for (size_t i = 0; i < flats_.size(); i++)
      if (flats_[i].unit == unit) v.push_back(int(i));
    return v;
  }
  std::vector<int64_t> numels(int flat) const override { return at(flat).numel; }
  std::string name(int flat, int k) const override {
    const Flat& f = at(flat);
    if (k < 0 || size_t(k) >= f.name.size())
      throw std::out_of_range("name(" + std::to_string(flat) + ", " + std::to_string(k) + "): flat " + std::to_string(flat) + " has " +
                              std::to_string(f.name.size()) + " parameters");
    return f.name[size_t(k)];
  }

  lab05::Buffer alloc(int64_t n, lab05::Kind kind) override { return handle(labproto::kFsdpAlloc, {n, int64_t(kind)}); }
  void release(lab05::Buffer b) override { request(labproto::kFsdpRelease, {b}); }
  lab05::Buffer part(int flat) override { return handle(labproto::kFsdpPart, {flat}); }
  void copy(lab05::Buffer dst, int64_t dst_at, lab05::Buffer src, int64_t src_at, int64_t n) override {
    request(labproto::kFsdpCopy, {dst, dst_at, src, src_at, n});
  }
  void fill(lab05::Buffer b, int64_t at, int64_t n, float value) override {
    put(labproto::kFsdpFill, &value, 4, {b, at, n});
    expect_data(0);
  }
  lab05::Work all_gather(lab05::Buffer in, lab05::Buffer out, int64_t n) override { return handle(labproto::kFsdpAllGather, {in, out, n}); }
  lab05::Work reduce_scatter(lab05::Buffer in, lab05::Buffer out, int64_t n) override {
    return handle(labproto::kFsdpReduceScatter, {in, out, n});
  }
  void wait(lab05::Work w) override { request(labproto::kFsdpWait, {w}); }
  void view(int flat, int k, lab05::Buffer b, int64_t at) override { request(labproto::kFsdpView, {flat, k, b, at}); }
  void take_grad(int flat, int k, lab05::Buffer b, int64_t at) override { request(labproto::kFsdpTakeGrad, {flat, k, b, at}); }
  void keep_grad(int flat, lab05::Buffer b) override { request(labproto::kFsdpKeepGrad, {flat, b}); }

 private:
  const Flat& at(int flat) const {
    if (flat < 0 || size_t(flat) >= flats_.size())
      throw std::out_of_range("flat " + std::to_string(flat) + " of " + std::to_string(flats_.size()) + " (0.." +
                              std::to_string(int(flats_.size()) - 1) + ")");
    return flats_[size_t(flat)];
  }
  void request(labproto::Op op, std::initializer_list<int64_t> args) {
    put(op, nullptr, 0, args);
    expect_data(0);
  }
  int handle(labproto::Op op, std::initializer_list<int64_t> args) {
    put(op, nullptr, 0, args);
    int32_t v;
    std::memcpy(&v, expect_data(4).data(), 4);
    return v;
  }
  int rank_, world_;
  std::vector<Flat> flats_;
  int units_ = 0;
};

}  // namespace

int serve_lab05(void* plugin) {
  auto* t = load_table<const Lab05Plugin>(plugin, "distlab_lab05", kLab05Abi, "fsdp.cpp", "labs/05-fsdp-1b/api.h");
  if (!t) return 2;
  return serve_calls([t](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    if (f.arg[0] == labproto::kFlatLayout) {
      const int64_t world = f.arg[1], count = f.arg[2];
      if (count < 0 || count > 1 << 20 || in.size() != size_t(count) * 8) _exit(3);
      std::vector<int64_t> sizes(static_cast<size_t>(count));
      if (count) std::memcpy(sizes.data(), in.data(), in.size());
      need(t->flat_layout, "flat_layout");
      const lab05::FlatLayout l = t->flat_layout(sizes, int(world));
      for (int64_t v : {l.numel, l.padded, l.shard}) append(out, &v, 8);
      const int64_t n = int64_t(l.offset.size());
      append(out, &n, 8);
      append(out, l.offset.data(), l.offset.size() * 8);
      return true;
    }
    const int64_t rank = f.arg[1], size = f.arg[2], hook = f.arg[3], unit = f.arg[4], flags = f.arg[5], nflats = f.arg[6];
    if (f.arg[0] != labproto::kFsdpHook || hook < 0 || hook > 4 || nflats < 0 || nflats > 1 << 20) return false;
    LabReader r{{in}};
    std::vector<Flat> flats(static_cast<size_t>(nflats));
    for (Flat& fl : flats) {
      fl.unit = r.take<int32_t>();
      const int32_t n = r.take<int32_t>();
      if (fl.unit < 0 || fl.unit > 1 << 20 || n < 0 || n > 1 << 20) _exit(3);
      for (int32_t k = 0; k < n; k++) {
        fl.numel.push_back(r.take<int64_t>());
        fl.name.push_back(r.cstr());
      }
    }
    RemoteFsdp fs(int(rank), int(size), std::move(flats));
    lab05::Options o;
    o.reshard_after_forward = flags & 1;
    o.prefetch = flags & 2;
    o.sync = flags & 4;
    o.offload = flags & 8;
    o.gather_budget = std::max<int64_t>(0, f.arg[7]);
    if (hook == 4) {
      need(t->finish_backward, "finish_backward");
      t->finish_backward(fs, o);
      return true;
    }
    void (*fns[4])(lab05::Fsdp&, const lab05::Options&, int) = {t->before_forward, t->after_forward, t->before_backward, t->after_backward};
    const char* names[4] = {"before_forward", "after_forward", "before_backward", "after_backward"};
    need(fns[hook], names[hook]);
    fns[hook](fs, o, int(unit));
    return true;
  });
}

}  // namespace labhost
