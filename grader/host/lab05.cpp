// Lab 05's host: the student's FSDP hooks. Each hook call carries the unit, the options and what the Fsdp
// answers locally (sizes, the root, the recorded orders); every gather, wait, free and reduce-scatter is a
// request the trainer runs on its sharding machinery (grader/bridge/lab_fsdp.cpp), checks, and answers.
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/05-fsdp-1b/api.h"

namespace labhost {

using namespace distlab;

namespace {

struct LabReader : Reader {  // the lab's records on top of take<T>() (host.h)
  std::vector<int> order() {
    const int32_t n = take<int32_t>();
    if (n < 0 || n > 1 << 20) _exit(3);
    std::vector<int> v;
    for (int32_t k = 0; k < n; k++) v.push_back(take<int32_t>());
    return v;
  }
};

class RemoteFsdp : public lab05::Fsdp {
 public:
  RemoteFsdp(std::vector<int64_t> numel, int root, std::vector<int> fwd, std::vector<int> bwd)
      : numel_(std::move(numel)), root_(root), fwd_(std::move(fwd)), bwd_(std::move(bwd)) {}
  int num_units() const override { return int(numel_.size()); }
  int64_t numel(int unit) const override { return numel_.at(size_t(index(unit))); }
  int root() const override { return root_; }
  const std::vector<int>& forward_order() const override { return fwd_; }
  const std::vector<int>& backward_order() const override { return bwd_; }
  bool is_whole(int unit) override {
    ask(labproto::kFsdpIsWhole, unit);
    int32_t v;
    std::memcpy(&v, expect_data(4).data(), 4);
    return v != 0;
  }
  void gather(int unit) override { request(labproto::kFsdpGather, unit); }
  void wait(int unit) override { request(labproto::kFsdpWait, unit); }
  void free(int unit) override { request(labproto::kFsdpFree, unit); }
  void reduce_scatter(int unit) override { request(labproto::kFsdpReduceScatter, unit); }

 private:
  int index(int unit) const {
    if (unit < 0 || unit >= int(numel_.size()))
      throw std::out_of_range("unit " + std::to_string(unit) + " of " + std::to_string(numel_.size()) + " (0.." +
                              std::to_string(int(numel_.size()) - 1) + ")");
    return unit;
  }
  void ask(labproto::Op op, int unit) { put(op, nullptr, 0, {index(unit)}); }
  void request(labproto::Op op, int unit) {
    ask(op, unit);
    expect_data(0);
  }
  std::vector<int64_t> numel_;
  int root_;
  std::vector<int> fwd_, bwd_;
};

}  // namespace

int serve_lab05(void* plugin) {
  auto* t = load_table<const Lab05Plugin>(plugin, "distlab_lab05", kLab05Abi, "fsdp.cpp", "labs/05-fsdp-1b/api.h");
  if (!t) return 2;
  return serve_calls([t](const wire::Frame& f, const std::vector<char>& in, std::vector<char>&) {
    const int64_t hook = f.arg[3], unit = f.arg[4], flags = f.arg[5], units = f.arg[6], root = f.arg[7];
    if (f.arg[0] != labproto::kFsdpHook || hook < 0 || hook > 3 || units < 0 || units > 1 << 20) return false;
    LabReader r{{in}};
    std::vector<int64_t> numel;
    for (int64_t k = 0; k < units; k++) numel.push_back(r.take<int64_t>());
    std::vector<int> fwd = r.order();
    std::vector<int> bwd = r.order();
    RemoteFsdp fs(std::move(numel), int(root), std::move(fwd), std::move(bwd));
    lab05::Options o;
    o.reshard_after_forward = flags & 1;
    o.prefetch = flags & 2;
    o.sync = flags & 4;
    void (*fns[4])(lab05::Fsdp&, const lab05::Options&, int) = {t->before_forward, t->after_forward, t->before_backward, t->after_backward};
    const char* names[4] = {"before_forward", "after_forward", "before_backward", "after_backward"};
    need(fns[hook], names[hook]);
    fns[hook](fs, o, int(unit));
    return true;
  });
}

}  // namespace labhost
