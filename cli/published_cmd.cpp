// `distlab bench published` — the cost model against published training runs (bench/published.toml).
//
// Each run of the table names its source, its configuration (a config file and --set keys) and what was
// published: a step time or tokens/s per GPU, and where given the peak memory and MFU. We train one rank of
// the same job on the meta device, in a fake world of the job's size (every allocation and collective of
// that rank counted, no data: seconds), replay its step on the run's hardware profile, and print published
// beside modeled with their ratio. The table's `band` says how close is close enough; a run that the model
// does not reach carries an `outside` text saying why, and then must stay outside (an excuse that is no
// longer needed is an error too). A [[gain]] divides two runs of one source that differ in one thing
// (torch.compile on and off): what both share cancels, and the modeled gain must match the published one.
// Nothing is tuned per run. Read next: core/perf/hardware.cpp (the profiles
// and their calibration), core/perf/cost_model.cpp (the replay).
#include "cli/published_cmd.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <toml++/toml.h>

#include "core/comm/process_group.h"
#include "core/train/trainer.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/read_file.h"
#include "grader/bridge/lab_extension.h"

namespace distlab {

namespace {

struct PublishedRun {
  std::string id, source, what, config, outside;
  std::string peak_is = "reserved";  // published_peak_is: reserved | allocated
  std::vector<std::string> sets;
  std::optional<double> step_s, tokens_per_s_per_gpu, peak_gib, mfu;  // as published
};

// Two runs of the same job that differ in one thing (torch.compile on or off): the published speed-up of
// `run` over `over` against the modeled one. A systematic error that both runs share (the hardware's real
// efficiency, a power limit) cancels in the quotient; what is left tests the one thing that differs.
struct PublishedGain {
  std::string id, what, run, over, outside;
};

struct Table {
  double band = 0.15;
  std::vector<PublishedRun> runs;
  std::vector<PublishedGain> gains;
};

std::string at(const std::string& file, const toml::node& n) { return fmt::format("{}:{}", file, n.source().begin.line); }

void only_table_keys(const toml::table& t, const std::vector<std::string>& keys, const std::string& file, const std::string& what) {
  for (auto&& [k, v] : t) {
    bool known = false;
    for (const std::string& key : keys) known = known || k.str() == key;
    if (!known) {
      std::string list;
      for (const std::string& key : keys) list += (list.empty() ? "" : ", ") + key;
      throw ConfigError(fmt::format("{}: unknown key '{}' in {}", at(file, v), k.str(), what), "the keys are " + list);
    }
  }
}

std::optional<double> positive(const toml::table& t, const char* key, const std::string& file, const std::string& what) {
  const toml::node* n = t.get(key);
  if (!n) return std::nullopt;
  const std::optional<double> v = n->value<double>();
  if (!v || !std::isfinite(*v) || *v <= 0) throw ConfigError(fmt::format("{}: {}.{} is not a positive number", at(file, *n), what, key));
  return v;
}

std::string text(const toml::table& t, const char* key, const std::string& file, const std::string& what, bool required) {
  const toml::node* n = t.get(key);
  if (!n) {
    if (required) throw ConfigError(fmt::format("{}: {} has no '{}' (a string)", at(file, t), what, key));
    return "";
  }
  const std::optional<std::string> v = n->value<std::string>();
  if (!v || (required && v->empty())) throw ConfigError(fmt::format("{}: {}.{} is not a string", at(file, *n), what, key));
  return *v;
}

Table load_table(const std::string& path) {
  const std::vector<uint8_t> bytes = read_regular_file(path, 1 << 20, "the table of published runs");
  toml::table doc;
  try {
    doc = toml::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}: {}", path, e.source().begin.line, e.description()));
  }
  only_table_keys(doc, {"band", "run", "gain"}, path, "the table");
  Table t;
  if (auto b = positive(doc, "band", path, "the table")) t.band = *b;
  if (t.band >= 1) throw ConfigError(fmt::format("{}: band {} is not below 1", path, t.band), "0.15 means within ±15 %");
  const toml::array* runs = doc.get_as<toml::array>("run");
  if (!runs || runs->empty()) throw ConfigError(path + ": no [[run]] tables", "each published run is a [[run]] table");
  for (const toml::node& node : *runs) {
    const toml::table* r = node.as_table();
    if (!r) throw ConfigError(at(path, node) + ": a run is not a table");
    only_table_keys(*r, {"id", "source", "what", "config", "set", "published_step_s", "published_tokens_per_s_per_gpu", "published_peak_gib",
                   "published_peak_is", "published_mfu", "outside"},
              path, "a [[run]]");
    PublishedRun p;
    p.id = text(*r, "id", path, "a [[run]]", true);
    const std::string what = "run " + p.id;
    p.source = text(*r, "source", path, what, true);
    p.what = text(*r, "what", path, what, true);
    p.config = text(*r, "config", path, what, true);
    p.outside = text(*r, "outside", path, what, false);
    if (const toml::array* sets = r->get_as<toml::array>("set"))
      for (const toml::node& s : *sets) {
        const std::optional<std::string> v = s.value<std::string>();
        if (!v) throw ConfigError(at(path, s) + ": " + what + ".set holds a non-string", "each entry is key=value, as for --set");
        p.sets.push_back(*v);
      }
    p.step_s = positive(*r, "published_step_s", path, what);
    p.tokens_per_s_per_gpu = positive(*r, "published_tokens_per_s_per_gpu", path, what);
    p.peak_gib = positive(*r, "published_peak_gib", path, what);
    // what the source's peak counts: the caching allocator's reserved bytes (torch.cuda.max_memory_reserved,
    // torchtitan's "memory"), or the tensors' (max_memory_allocated)
    p.peak_is = text(*r, "published_peak_is", path, what, false);
    if (p.peak_is.empty()) p.peak_is = "reserved";
    if (p.peak_is != "reserved" && p.peak_is != "allocated")
      throw ConfigError(at(path, *r) + ": " + what + ".published_peak_is = \"" + p.peak_is + "\"",
                        "\"reserved\" (torch.cuda.max_memory_reserved) or \"allocated\" (max_memory_allocated)");
    p.mfu = positive(*r, "published_mfu", path, what);
    if (p.step_s.has_value() == p.tokens_per_s_per_gpu.has_value())
      throw ConfigError(at(path, *r) + ": " + what + " needs exactly one of published_step_s and published_tokens_per_s_per_gpu",
                        "the step time or the throughput, as the source gives it");
    for (const PublishedRun& q : t.runs)
      if (q.id == p.id) throw ConfigError(at(path, *r) + ": two runs are called " + p.id);
    t.runs.push_back(std::move(p));
  }
  if (const toml::node* gains = doc.get("gain")) {
    if (!gains->is_array_of_tables()) throw ConfigError(at(path, *gains) + ": 'gain' is not a list of [[gain]] tables");
    for (const toml::node& node : *gains->as_array()) {
      const toml::table& r = *node.as_table();
      only_table_keys(r, {"id", "what", "run", "over", "outside"}, path, "a [[gain]]");
      PublishedGain g;
      g.id = text(r, "id", path, "a [[gain]]", true);
      const std::string what = "gain " + g.id;
      g.what = text(r, "what", path, what, true);
      g.run = text(r, "run", path, what, true);
      g.over = text(r, "over", path, what, true);
      g.outside = text(r, "outside", path, what, false);
      for (const std::string& id : {g.run, g.over}) {
        bool known = false;
        for (const PublishedRun& q : t.runs) known = known || q.id == id;
        if (!known) throw ConfigError(at(path, r) + ": " + what + " names run '" + id + "', which the table does not have", "run and over are ids of [[run]] tables");
      }
      if (g.run == g.over) throw ConfigError(at(path, r) + ": " + what + " compares run '" + g.run + "' with itself");
      t.gains.push_back(std::move(g));
    }
  }
  return t;
}

// One rank of the run's job on the meta device, as `distlab plan` models a row: the summary record.
nlohmann::json model_run(const PublishedRun& p, const std::string& root) {
  const std::string config = (std::filesystem::path(root) / p.config).string();
  const std::vector<uint8_t> bytes = read_regular_file(config, 1 << 20, "run " + p.id + "'s config");
  std::vector<std::string> sets = p.sets;
  sets.insert(sets.end(), {"train.device=meta", "train.steps=2", "log.trace_step=2", "train.eval_every=0", "checkpoint.dir="});
  RunConfig cfg = parse_config(std::string(bytes.begin(), bytes.end()), p.config, sets, {}, lab_config_sections());
  if (cfg.log.profile.empty()) throw ConfigError("run " + p.id + ": no log.profile", "name the hardware the run was published on");
  return run_planned(cfg);
}

std::string ratio_text(std::optional<double> r) { return r ? fmt::format("{:.3f}", *r) : "-"; }

}  // namespace

int run_published(const PublishedArgs& a) {
  const Table table = load_table(a.table);
  const std::string root = a.root.empty() ? "." : a.root;
  nlohmann::json rows = nlohmann::json::array();
  int wrong = 0;
  std::map<std::string, double> modeled_s, published_s;  // step times by run id, for the gains
  auto inside = [&](double r) { return std::abs(r - 1) <= table.band; };
  // A row with an `outside` text must stay outside (an excuse no longer needed is an error too).
  auto judge = [](bool in_band, const std::string& outside) -> std::pair<bool, std::string> {
    if (outside.empty()) return {in_band, in_band ? "within the band" : "OUTSIDE the band, and the table does not say why"};
    return {!in_band, in_band ? "now within the band: remove its `outside`" : "outside the band (known: see `outside`)"};
  };
  std::cout << fmt::format("published runs against the cost model (band ±{:.0f} %; ratio = modeled / published)\n", 100 * table.band);
  std::cout << fmt::format("{:<38} {:>10} {:>10} {:>6} {:>9} {:>9} {:>6} {:>7} {:>7}  {}\n", "run", "step pub.", "modeled", "ratio",
                           "peak pub.", "modeled", "ratio", "MFU pub", "modeled", "verdict");
  for (const PublishedRun& p : table.runs) {
    const nlohmann::json s = model_run(p, root);
    const double step_s = s.value("modeled_step_s", 0.0);
    const int world = s.value("world_size", 1);
    const double tokens_per_gpu = double(s.value("tokens_per_step", int64_t(0))) / double(world);
    if (step_s <= 0 || tokens_per_gpu <= 0)
      throw Error("run " + p.id + ": the model gave no step time or no tokens", "a language model with log.profile set");
    const double published_step_s = p.step_s ? *p.step_s : tokens_per_gpu / *p.tokens_per_s_per_gpu;
    const double peak_gib = double(s.value(p.peak_is == "reserved" ? "peak_memory_reserved" : "peak_memory_total", int64_t(0))) / double(1LL << 30);
    const double mfu = s.value("modeled_mfu", 0.0);
    const double time_ratio = step_s / published_step_s;
    const std::optional<double> mem_ratio = p.peak_gib ? std::optional<double>(peak_gib / *p.peak_gib) : std::nullopt;
    const bool in_band = inside(time_ratio) && (!mem_ratio || inside(*mem_ratio));
    const auto [ok, verdict] = judge(in_band, p.outside);
    wrong += ok ? 0 : 1;
    modeled_s[p.id] = step_s;
    published_s[p.id] = published_step_s;
    // the time ratio to 3 places: a row 0.001 outside the band (0.849) must not print as inside it (0.85)
    std::cout << fmt::format("{:<38} {:>8.1f}ms {:>8.1f}ms {:>6.3f} {:>9} {:>9.1f} {:>6} {:>7} {:>6.1f}%  {}\n", p.id, 1e3 * published_step_s,
                             1e3 * step_s, time_ratio, p.peak_gib ? fmt::format("{:.1f}", *p.peak_gib) : "-", peak_gib, ratio_text(mem_ratio),
                             p.mfu ? fmt::format("{:.1f}%", 100 * *p.mfu) : "-", 100 * mfu, verdict);
    rows.push_back({{"id", p.id}, {"source", p.source}, {"what", p.what}, {"config", p.config}, {"set", p.sets},
                    {"profile", s.value("profile", "")}, {"world_size", world}, {"tokens_per_step_per_gpu", tokens_per_gpu},
                    {"published_step_s", published_step_s}, {"modeled_step_s", step_s}, {"step_ratio", time_ratio},
                    {"published_tokens_per_s_per_gpu", tokens_per_gpu / published_step_s}, {"modeled_tokens_per_s_per_gpu", tokens_per_gpu / step_s},
                    {"published_peak_gib", p.peak_gib ? nlohmann::json(*p.peak_gib) : nlohmann::json(nullptr)}, {"modeled_peak_gib", peak_gib},
                    {"peak_ratio", mem_ratio ? nlohmann::json(*mem_ratio) : nlohmann::json(nullptr)},
                    {"published_mfu", p.mfu ? nlohmann::json(*p.mfu) : nlohmann::json(nullptr)}, {"modeled_mfu", mfu},
                    {"modeled_hfu", s.value("modeled_hfu", 0.0)}, {"modeled_compute_s", s.value("modeled_compute_s", 0.0)},
                    {"modeled_exposed_comm_s", s.value("modeled_exposed_comm_s", 0.0)}, {"in_band", in_band},
                    {"outside", p.outside}, {"agrees_with_table", ok}});
  }
  nlohmann::json gain_rows = nlohmann::json::array();
  if (!table.gains.empty()) {
    std::cout << fmt::format("\n{:<38} {:>10} {:>10} {:>6}  {}\n", "gain (run over other)", "published", "modeled", "ratio", "verdict");
    for (const PublishedGain& g : table.gains) {
      const double published = published_s.at(g.over) / published_s.at(g.run), modeled = modeled_s.at(g.over) / modeled_s.at(g.run);
      const double ratio = modeled / published;
      const auto [ok, verdict] = judge(inside(ratio), g.outside);
      wrong += ok ? 0 : 1;
      std::cout << fmt::format("{:<38} {:>9.3f}x {:>9.3f}x {:>6.3f}  {}\n", g.id, published, modeled, ratio, verdict);
      gain_rows.push_back({{"id", g.id}, {"what", g.what}, {"run", g.run}, {"over", g.over}, {"published_gain", published},
                           {"modeled_gain", modeled}, {"ratio", ratio}, {"in_band", inside(ratio)}, {"outside", g.outside},
                           {"agrees_with_table", ok}});
    }
  }
  for (const PublishedRun& p : table.runs)
    if (!p.outside.empty()) std::cout << fmt::format("\n{} is outside the band:\n  {}\n", p.id, p.outside);
  for (const PublishedGain& g : table.gains)
    if (!g.outside.empty()) std::cout << fmt::format("\n{} is outside the band:\n  {}\n", g.id, g.outside);
  if (!a.json.empty()) {
    const std::filesystem::path parent = std::filesystem::path(a.json).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    AtomicFile out(a.json);
    out.write(nlohmann::json{{"table", a.table}, {"band", table.band}, {"runs", rows}, {"gains", gain_rows}}.dump(2) + "\n");
    out.commit();
    std::cout << "wrote " << a.json << "\n";
  }
  if (wrong > 0) {
    std::cerr << fmt::format("distlab bench published: {} row(s) disagree with the table (see the verdicts above)\n", wrong);
    return 1;
  }
  return 0;
}

void add_published_command(CLI::App* bench, int& exit_code) {
  auto a = std::make_shared<PublishedArgs>();
  CLI::App* sub = bench->add_subcommand("published", "the cost model against published runs (llm.c, torchtitan): step time, peak memory, MFU");
  sub->add_option("--table", a->table, "the table of published runs (default bench/published.toml)");
  sub->add_option("--root", a->root, "where the runs' config paths are relative to (default: the current folder)");
  sub->add_option("--json", a->json, "also write the rows as JSON to this file");
  sub->callback([a, &exit_code]() { exit_code = run_published(*a); });
}

}  // namespace distlab
