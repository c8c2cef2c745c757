// distlab export tensorboard (cli/export_cmd.h): every number of a run's metrics as a TensorBoard scalar —
// a step record's loss, lr, grad_norm, loss_scale, samples, wall_s, comm bytes, FLOPs and peak memory as
// train/<name>, an evaluation's as eval/<name> — in DIR/events.out.tfevents.<time>.distlab.
#include "cli/export_cmd.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/report/tfevents.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/read_file.h"

namespace fs = std::filesystem;

namespace distlab {

void add_export_commands(CLI::App& app, int& exit_code) {
  CLI::App* ex = app.add_subcommand("export", "a run's records in another tool's format: tensorboard");
  ex->require_subcommand(1);
  auto args = std::make_shared<std::array<std::string, 2>>();  // metrics, out
  auto* tb = ex->add_subcommand("tensorboard", "the scalars of a metrics file (JSON Lines) as TensorBoard's events file");
  tb->add_option("metrics", (*args)[0], "the run's --metrics file")->required();
  tb->add_option("-o,--out", (*args)[1], "the folder for the events file (default: the metrics file's name without .jsonl, then -tensorboard)");
  tb->callback([args, &exit_code] {
    const std::string& path = (*args)[0];
    const std::vector<uint8_t> raw = read_regular_file(path, uint64_t(1) << 30, "the metrics file");
    std::error_code ec;
    const auto mtime = fs::last_write_time(path, ec);
    // the run ended when its file was last written: its steps' wall times count back from there
    const double end = ec ? 0.0
                          : double(std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::file_clock::to_sys(mtime).time_since_epoch()).count());
    std::vector<Scalar> scalars;
    double last_wall = 0;
    int64_t records = 0, line_no = 0;
    std::string text(raw.begin(), raw.end());
    std::vector<nlohmann::json> recs;
    for (size_t at = 0; at < text.size();) {
      const size_t nl = std::min(text.find('\n', at), text.size());
      line_no++;
      auto j = nlohmann::json::parse(text.substr(at, nl - at), nullptr, false);
      at = nl + 1;
      if (j.is_discarded() || !j.is_object()) continue;  // a line cut by a crash: the rest still count
      if (j.value("kind", "") == "step") last_wall = j.value("wall_s", last_wall);
      recs.push_back(std::move(j));
    }
    const double start = end - last_wall;
    double wall = 0;
    for (const auto& j : recs) {
      const std::string kind = j.value("kind", "");
      if (kind != "step" && kind != "eval") continue;
      const int64_t step = j.value("step", int64_t(0));
      if (kind == "step") wall = j.value("wall_s", wall);
      const std::string prefix = kind == "step" ? "train/" : "eval/";
      for (const auto& [name, v] : j.items())
        if (v.is_number() && name != "step") scalars.push_back({prefix + name, step, float(v.get<double>()), start + wall});
      if (j.contains("memory") && j["memory"].is_object() && j["memory"].contains("peak_total") && j["memory"]["peak_total"].is_number())
        scalars.push_back({"memory/peak_total", step, float(j["memory"]["peak_total"].get<double>()), start + wall});
      records++;
    }
    if (records == 0)
      throw ConfigError(fmt::format("{}: no step or eval records (a metrics file of distlab train --metrics?)", path),
                        "train with --metrics FILE, then export FILE");
    std::string out = (*args)[1];
    if (out.empty()) out = (fs::path(path).parent_path() / (fs::path(path).stem().string() + "-tensorboard")).string();
    fs::create_directories(out, ec);
    if (ec) throw IoError(fmt::format("--out {}: {}", out, ec.message()));
    const std::string file = (fs::path(out) / fmt::format("events.out.tfevents.{:.0f}.distlab", start)).string();
    AtomicFile f(file);
    f.write(tfevents(scalars, start));
    f.commit();
    std::cout << fmt::format("wrote {} scalars of {} records to {}\nview them: tensorboard --logdir {}\n", scalars.size(), records, file, out);
    exit_code = 0;
  });
}

}  // namespace distlab
