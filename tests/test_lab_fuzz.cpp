// The protocol fuzzer: the trainer's side of labs 02-07 (grader/bridge/lab_*.cpp and grader/labs/*/bridge.cpp),
// the code that runs as the grader's user outside the sandbox, driven by tests/fuzz_plugin.cpp — a plugin that
// writes seeded random and adversarial frames straight onto its socket. Two ranks, four for lab 04 (threads over
// an in-memory store), each with its own plugin process sending the same stream, so that the collectives the
// trainer runs for it meet.
// Every request must be answered or refused with a distlab::Error; a crash, a hang, a std:: exception
// escaping the checks, a file of lab 07's service outside its folder or over its quota, or (this executable is built with AddressSanitizer, whose malloc and memcpy
// interceptors cover the engine's library too) an over-read, an over-write or a double free fails it.
// FUZZ_LAB=07 runs one lab; FUZZ_DEBUG=1 prints every refusal (and lab 07's folder after each call).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "core/models/zoo.h"
#include "core/optim/optimizer.h"
#include "grader/bridge/sandbox.h"
#include "grader/bridge/lab_files.h"
#include "grader/bridge/lab_plugin.h"
#include "core/parallel/pipeline_sim.h"
#include "core/parallel/none.h"
#include "core/parallel/pipeline.h"
#include "dist_harness.h"

using namespace distlab;

extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }  // leaks are not this test's subject

namespace {

constexpr int kCalls = 1000;  // calls into the plugin per lab and rank; each serves requests until one is refused

struct Tally {
  std::mutex m;
  int calls = 0, refused = 0, returned = 0;
  std::map<std::string, int> escaped;  // std:: exceptions that are not an Error: a check that is missing
  void add(int c, int r, int ret, const std::map<std::string, int>& e) {
    std::lock_guard<std::mutex> g(m);
    calls += c, refused += r, returned += ret;
    for (const auto& [k, v] : e) escaped[k] += v;
  }
  void broke(const std::string& what) {  // an invariant of lab 07's file service that did not hold
    std::lock_guard<std::mutex> g(m);
    escaped["broken: " + what]++;
  }
};

// Calls `entries` round-robin kCalls times, counting how each ended.
void drive(Tally& tally, const std::vector<std::function<void()>>& entries) {
  int refused = 0, returned = 0;
  std::map<std::string, int> escaped;
  for (int i = 0; i < kCalls; i++) {
    try {
      entries[size_t(i) % entries.size()]();
      returned++;
    } catch (const Error& e) {
      if (getenv("FUZZ_DEBUG")) fmt::print(stderr, "refused: {}\n", sanitize_output(std::string(e.what()).substr(0, 160), 200));
      refused++;
    } catch (const std::exception& e) {
      escaped[std::string(e.what()).substr(0, 160)]++;
    }
  }
  tally.add(kCalls, refused, returned, escaped);
}

LabPluginOptions options(const std::string& lab) {
  LabPluginOptions o;
  o.host_exe = DISTLAB_LABHOST;
  o.plugin = FUZZ_PLUGIN;
  o.lab_name = lab;
  o.sandbox = "off";  // the trainer's side is under test, not the sandbox
  o.timeout_s = 20;
  return o;
}

ModelSpec mlp() {
  ModelSpec s;
  s.name = "mlp";
  s.in_channels = 1, s.height = 2, s.width = 2, s.num_classes = 3;
  s.hidden = {5};
  return s;
}

ModelSpec gpt() {
  ModelSpec s;
  s.name = "gpt";
  s.vocab_size = 16, s.block_size = 4, s.n_layer = 2, s.n_head = 2, s.n_embd = 8;
  return s;
}

// Lab 03's Step on the trainer's side, doing nothing: the request's parsing is what is fuzzed.
class IdleStep : public LabStepOps {
 public:
  explicit IdleStep(Model& m) : model_(m) {}
  double forward_backward(int64_t, float) override { return 1.0; }
  std::vector<Parameter*> parameters() override { return model_.parameters(); }
  void optimizer_step(const std::vector<float>&) override {}
  void skip_step() override {}
  void scheduler_step() override {}

 private:
  Model& model_;
};

namespace fs = std::filesystem;

// What lab 07's file service left in a rank's folder: the student's files, and whether anything else is there
struct Folder {
  int files = 0;
  uint64_t bytes = 0;
  std::string odd;  // a name that is not a plain file of a plain name, or the trainer's weights changed
};
Folder look(const fs::path& dir, const std::string& weights) {
  Folder f;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == "model.safetensors") {
      std::ifstream in(e.path(), std::ios::binary);
      if (std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) != weights) f.odd = "model.safetensors changed";
      continue;
    }
    f.files++;
    if (e.is_symlink() || !e.is_regular_file() || name[0] == '.') f.odd = name;
    else f.bytes += e.file_size();
  }
  return f;
}

// Lab 07: save_state and load_state served by a LabFileServer over a folder of this rank's, checked after every
// call: at most kMaxFiles files more and the quota's bytes more than before, nothing but plain files, the
// trainer's weights untouched, nothing outside the folder; load_state's answer parsed against a small model.
void lab07_entries(std::vector<std::function<void()>>& entries, LabPlugin& plugin, ProcessGroup& pg, Runtime& rt, Tally& tally,
                   const fs::path& root) {
  const fs::path dir = root / ("rank" + std::to_string(pg.rank()));
  fs::create_directories(dir);
  const std::string weights = "the trainer's weights, rank " + std::to_string(pg.rank());
  std::ofstream(dir / "model.safetensors", std::ios::binary) << weights;
  // a snapshot as the trainer sends it (Trainer::lab_snapshot): 4 parameters, exp_avg and exp_avg_sq, one stream
  std::vector<char> snap;
  auto i64 = [&](int64_t v) { snap.insert(snap.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 8); };
  auto str = [&](const std::string& v) { snap.insert(snap.end(), v.c_str(), v.c_str() + v.size() + 1); };
  const std::vector<int64_t> numels = {20, 5, 15, 3};
  i64(pg.rank()), i64(pg.size()), i64(2), i64(10), i64(4), i64(2);
  str("exp_avg"), str("exp_avg_sq");
  for (size_t i = 0; i < numels.size(); i++) i64(numels[i]), str("p" + std::to_string(i));
  i64(10);
  for (int64_t n : numels)
    for (int k = 0; k < 2; k++) {
      i64(n);
      snap.resize(snap.size() + size_t(n) * 4);
    }
  i64(1), i64(42), i64(0), i64(3);
  const uint64_t quota = 64 << 10;  // smaller than the trainer's (4 x snapshot + 1 MiB): the stream's writes reach it
  auto serve = [&plugin, &pg, &rt, &tally, dir, root, weights, snap, numels, quota](labproto::Fn fn, const char* during) {
    const Folder before = look(dir, weights);
    std::ostringstream log;
    auto check = [&] {
      const Folder after = look(dir, weights);
      if (!after.odd.empty()) tally.broke(fmt::format("{} left '{}' in the folder", during, after.odd));
      if (after.files > before.files + LabFileServer::kMaxFiles) tally.broke(fmt::format("{} opened {} files", during, after.files - before.files));
      if (after.bytes > before.bytes + quota) tally.broke(fmt::format("{} wrote {} bytes, over the quota of {}", during, after.bytes - before.bytes, quota));
      for (const auto& e : fs::directory_iterator(root))
        if (e.path().filename().string().rfind("rank", 0) != 0) tally.broke(fmt::format("{} made {} outside its folder", during, e.path().string()));
    };
    std::vector<char> back;
    try {
      LabFileServer files(plugin, dir.string(), pg.rank(), false, log, quota);
      back = plugin.call(fn, {}, snap.data(), snap.size(), &pg, &rt, during, [&](const wire::Frame& f, std::vector<char>& p) { files.serve(f, p); });
      files.finish();
    } catch (...) {
      check();
      throw;
    }
    check();
    if (getenv("FUZZ_DEBUG")) {
      const Folder after = look(dir, weights);
      fmt::print(stderr, "{} returned; the folder holds {} files, {} bytes\n", during, after.files, after.bytes);
    }
    if (fn == labproto::kLoadState) parse_load_answer(back, numels, 2, 1);
  };
  entries.push_back([serve] { serve(labproto::kSaveState, "save_state"); });
  entries.push_back([serve] { serve(labproto::kLoadState, "load_state"); });
}

void fuzz_lab(const std::string& lab, Tally& tally) {
  ProcessGroupOptions po;
  po.timeout = Millis(15000);
  // lab 07's folders on a tmpfs where there is one: fsync there costs nothing, and the test is about the requests
  const fs::path tmp = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  const fs::path root = tmp / fmt::format("distlab-fuzz-{}-{}", ::getpid(), lab);
  fs::remove_all(root);
  // lab 04 on 4 ranks: where a reduce_scatter's n·world can wrap to a small size (n = 2^62 + 16)
  const int ranks = lab == "04-zero" ? 4 : 2;
  // each rank's Runtime outlives its process group, as in `distlab train`: the memory a collective left in
  // flight when a request was refused is freed only after the group's connections are closed
  std::vector<std::unique_ptr<Runtime>> rts;
  for (int r = 0; r < ranks; r++) rts.push_back(std::make_unique<Runtime>());
  distlab::testing::run_ranks(ranks, [&](ProcessGroup& pg) {
    Runtime& rt = *rts[size_t(pg.rank())];
    auto model = build_model(rt, lab == "05-fsdp-1b" ? gpt() : mlp());
    for (auto* p : model->parameters()) p->grad_for_accumulate();
    LabPlugin plugin(options(lab));
    std::vector<std::function<void()>> entries;
    std::unique_ptr<DataParallel> ddp;
    std::unique_ptr<Strategy> strategy;
    std::unique_ptr<TpKernels> tp;
    std::unique_ptr<Optimizer> opt;
    IdleStep step(*model);
    int stage = 1;  // lab 04: ZeRO-1 and ZeRO-2 in turn
    if (lab == "02-ddp-cifar") {
      entries.push_back([&] { plugin.make_sampler(100, 2, pg.rank(), 7, true)->indices(1); });
      entries.push_back([&] { ddp = plugin.make_ddp("naive", pg, *model, rt, 25); });
      entries.push_back([&] { if (ddp) ddp->finish_backward(rt); });
    } else if (lab == "03-amp-accum") {
      const float cfg[3] = {65536, 2, 0.5f};
      entries.push_back([&, cfg] { plugin.train_step(step, 2, 1.0, cfg, 3, &pg, rt); });
    } else if (lab == "04-zero") {
      // each phase its own entry, so that a refusal in one leaves the others reachable (a step's set_weights
      // after a reduce that failed)
      entries.push_back([&] {
        stage = 3 - stage;
        strategy = plugin.make_zero(stage, pg, *model, rt, stage == 2 ? 1.0 : 0.0);
        opt = std::make_unique<AdamW>(strategy->optimizer_parameters(*model), AdamWOptions{});
        strategy->begin_backward(true);
      });
      entries.push_back([&] {
        for (int u = int(model->units().size()) - 1; u >= 0; u--) strategy->after_layer_backward(u, model->units()[size_t(u)]);
      });
      entries.push_back([&] { strategy->finish_backward(rt); });
      entries.push_back([&] { strategy->step(rt, *opt, 0.01f, 1.0f); });
      entries.push_back([&] { strategy->step(rt, *opt, 0.01f, 1.0f); });
    } else if (lab == "05-fsdp-1b") {
      strategy = plugin.make_fsdp(pg, *model, rt, "full_shard", true, false, 0);
      const int units = int(model->units().size());
      for (int u = 0; u < units; u++) {  // every hook its own entry
        entries.push_back([&, u] { strategy->before_forward(u); });
        entries.push_back([&, u] { strategy->after_forward(u); });
      }
      entries.push_back([&] { strategy->begin_backward(true); });
      for (int u = units - 1; u >= 0; u--) entries.push_back([&, u] { strategy->after_layer_backward(u, model->units()[size_t(u)]); });
      entries.push_back([&] { strategy->finish_backward(rt); });
    } else if (lab == "07-checkpoint") {
      lab07_entries(entries, plugin, pg, rt, tally, root);
    } else {  // 06-tp-pp
      tp = plugin.make_tp_kernels(rt);
      std::vector<float> x(2 * 3, 0.5f), w(4 * 3, 0.25f), b(4, 0.1f), y(2 * 4), dy(2 * 4, 1.0f), dx(2 * 3), dw(4 * 3), db(4);
      entries.push_back([&, x, w, b, y]() mutable { tp->column_forward(pg, x.data(), w.data(), b.data(), y.data(), 2, 3, 4); });
      entries.push_back([&, x, w, dy, dx, dw, db]() mutable {
        tp->row_backward(pg, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), 2, 3, 4);
      });
      // sequence parallel: 2 rows over 2 ranks, the stream's side one row each; their gathers and scatters
      entries.push_back([&, x, w, dy, dx, dw, db]() mutable {
        tp->sp_column_backward(pg, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), 2, 3, 4);
      });
      entries.push_back([&, x, w, b, y]() mutable { tp->sp_row_forward(pg, x.data(), w.data(), b.data(), y.data(), 2, 3, 4); });
      entries.push_back([&, b]() mutable { tp->sp_norm_grads(pg, b.data(), 4); });
      entries.push_back([&] {  // the executor drives a middle stage of 3 (both neighbours) over a fake group, on meta
        Runtime meta(DeviceKind::meta, pg.rank());
        ProcessGroup fake(ProcessGroup::Fake{}, 1, 3, &meta.trace, "pipeline");
        auto stage_model = synthetic_stage(1e6, 4);
        NoParallel none;
        Pipeline pipe(fake, *stage_model, PipeSchedule::one_f_one_b, 4);
        Batch b;
        b.B = b.T = 1;
        const Pipeline::Executor ex = plugin.pipeline_executor();
        pipe.train_step(
            meta, [&] { return b; },
            [&](Runtime& r, const Tensor& logits, const Batch&, float, Tensor& d) {
              d = r.empty(logits.shape(), Category::activations, "dlogits");
              return 0.0;
            },
            1.0f, none, nullptr, nullptr, &ex);
      });
    }
    drive(tally, entries);
  }, po);
  fs::remove_all(root);
}

}  // namespace

TEST_CASE("the trainer's side of labs 02-07 answers or refuses every request of a plugin that sends random and adversarial frames", "[lab][fuzz]") {
  for (const std::string lab : {"02-ddp-cifar", "03-amp-accum", "04-zero", "05-fsdp-1b", "06-tp-pp", "07-checkpoint"}) {
    if (getenv("FUZZ_LAB") && lab.rfind(getenv("FUZZ_LAB"), 0) != 0) continue;
    INFO(lab);
    Tally t;
    fuzz_lab(lab, t);
    std::string escaped;
    for (const auto& [what, n] : t.escaped) escaped += fmt::format("\n  {} x {}", n, what);
    INFO(fmt::format("{}: {} calls, {} refused with an Error, {} returned{}", lab, t.calls, t.refused, t.returned,
                     escaped.empty() ? "" : ", escaped:" + escaped));
    WARN(fmt::format("{}: {} calls, {} refused, {} returned", lab, t.calls, t.refused, t.returned));
    CHECK(t.calls == (lab == "04-zero" ? 4 : 2) * kCalls);
    CHECK(t.refused > t.calls / 2);  // the stream is mostly garbage: most calls end in a refusal
    CHECK(t.escaped.empty());
  }
}
