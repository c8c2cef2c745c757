#include "grader/lab.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <toml++/toml.h>

#include "core/util/error.h"

namespace fs = std::filesystem;

namespace distlab::grader {

int Lab::max_points() const {
  int p = 0;
  for (const auto& c : checks) p += c.points;
  return p;
}

// grader/labs/NN-name/hints.toml: `engine` (text) and [hint] (check = text). Every check has a hint and every
// hint a check: a renamed check can't silently lose its hint.
static void read_hints(Lab& lab, const fs::path& path) {
  const std::string file = path.string();
  if (!fs::exists(path)) throw ConfigError(file + " is missing", fmt::format("lab {}'s hints and the engine's answer live there", lab.id));
  toml::table t;
  try {
    t = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}: {}", file, e.source().begin.line, e.description()));
  }
  for (const auto& [key, node] : t)
    if (key.str() != "engine" && key.str() != "hint")
      throw ConfigError(fmt::format("{}: unknown key '{}'", file, key.str()), "a hints file has engine = \"...\" and a [hint] table");
  lab.engine = t["engine"].value_or(std::string());
  const toml::table* hints = t["hint"].as_table();
  if (lab.engine.empty() || !hints) throw ConfigError(file + ": needs engine = \"...\" and a [hint] table");
  for (const auto& [key, node] : *hints) {
    auto it = std::find_if(lab.checks.begin(), lab.checks.end(), [&](const CheckSpec& c) { return c.name == key.str(); });
    if (it == lab.checks.end() || !node.is_string())
      throw ConfigError(fmt::format("{}: hint.{} {}", file, key.str(), it == lab.checks.end() ? "names no check of the lab" : "is not a string"));
    it->hint = *node.value<std::string>();
  }
  for (const CheckSpec& c : lab.checks)
    if (c.hint.empty()) throw ConfigError(fmt::format("{}: check '{}' has no hint", file, c.name), "add hint." + c.name + " = \"...\"");
}

static Lab read_lab(const fs::path& dir) {
  const std::string file = (dir / "lab.toml").string();
  toml::table t;
  try {
    t = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}: {}", file, e.source().begin.line, e.description()));
  }
  Lab lab;
  lab.dir = dir.string();
  lab.name = dir.filename().string();
  lab.id = lab.name.substr(0, 2);
  lab.title = t["lab"]["title"].value_or(std::string(lab.name));
  if (auto* files = t["lab"]["files"].as_array())
    for (auto& f : *files) lab.files.push_back(f.value_or(std::string()));
  if (lab.files.empty()) throw ConfigError(file + ": [lab] files is missing", "list the student's files: files = [\"ring.cpp\"]");
  lab.trains = t.contains("model");
  const std::string kind = t["lab"]["kind"].value_or(std::string("code"));
  if (kind != "code" && kind != "answers" && kind != "clinic")
    throw ConfigError(fmt::format("{}: [lab] kind = '{}'", file, kind), "kind is code (a plugin), answers (TOML files) or clinic (cases of other labs)");
  lab.answers = kind == "answers" || kind == "clinic";  // both: the files are bundled, not compiled, at the build
  lab.clinic = kind == "clinic";
  lab.ranks = int(t["lab"]["ranks"].value_or(int64_t(2)));
  if (lab.ranks < 1 || lab.ranks > 64) throw ConfigError(fmt::format("{}: [lab] ranks = {} (1 to 64)", file, lab.ranks));
  if (auto* checks = t["check"].as_array()) {
    for (auto& node : *checks) {
      auto* c = node.as_table();
      if (!c) continue;
      CheckSpec s;
      s.name = (*c)["name"].value_or(std::string());
      s.points = (*c)["points"].value_or(0);
      s.timeout_s = (*c)["timeout_s"].value_or(60.0);
      s.memory_mb = (*c)["memory_mb"].value_or(int64_t(4096));
      s.what = (*c)["what"].value_or(std::string());
      s.case_lab = (*c)["lab"].value_or(std::string());
      s.case_file = (*c)["file"].value_or(std::string());
      if (auto* cc = (*c)["checks"].as_array())
        for (auto& x : *cc) s.case_checks.push_back(x.value_or(std::string()));
      s.case_config = (*c)["config"].value_or(std::string());
      s.case_expect = (*c)["expect"].value_or(std::string());
      s.case_ranks = int((*c)["ranks"].value_or(int64_t(2)));
      s.case_reference_ranks = int((*c)["reference_ranks"].value_or(int64_t(1)));
      s.case_limit = (*c)["limit"].value_or(0.0);
      if (auto* cc = (*c)["change"].as_array())
        for (auto& x : *cc) s.case_change.push_back(x.value_or(std::string()));
      if (auto* cc = (*c)["reference"].as_array())
        for (auto& x : *cc) s.case_reference.push_back(x.value_or(std::string()));
      if (s.name.empty() || s.points <= 0)
        throw ConfigError(fmt::format("{}: a [[check]] needs a name and positive points", file));
      lab.checks.push_back(s);
    }
  }
  read_hints(lab, dir.parent_path().parent_path() / "grader" / "labs" / lab.name / "hints.toml");
  return lab;
}

std::string solution_folder(const std::string& source_dir, const std::string& build_dir, const Lab& lab) {
  const fs::path own = fs::path(source_dir) / "solutions" / lab.name;
  if (!lab.clinic) return own.string();
  const fs::path dir = fs::path(build_dir) / "labs" / lab.name / "solution-src";
  std::error_code ec;
  fs::remove_all(dir, ec);
  for (const CheckSpec& c : lab.checks) {
    if (c.case_file.empty()) continue;
    fs::path from = own / c.case_file;
    if (!c.case_lab.empty()) from = fs::path(source_dir) / "solutions" / find_lab(source_dir, c.case_lab).name / fs::path(c.case_file).filename();
    fs::create_directories((dir / c.case_file).parent_path(), ec);
    if (!ec) fs::copy_file(from, dir / c.case_file, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(fmt::format("cannot assemble lab {}'s solution: {} -> {}: {}", lab.id, from.string(), (dir / c.case_file).string(), ec.message()));
  }
  return dir.string();
}

std::vector<Lab> all_labs(const std::string& source_dir) {
  std::vector<Lab> labs;
  const fs::path root = fs::path(source_dir) / "labs";
  if (!fs::exists(root)) return labs;
  for (const auto& d : fs::directory_iterator(root))
    if (d.is_directory() && fs::exists(d.path() / "lab.toml")) labs.push_back(read_lab(d.path()));
  std::sort(labs.begin(), labs.end(), [](const Lab& a, const Lab& b) { return a.name < b.name; });
  return labs;
}

Lab find_lab(const std::string& source_dir, const std::string& key) {
  std::string names;
  for (auto& lab : all_labs(source_dir)) {
    if (lab.id == key || lab.name == key || (key.size() == 1 && lab.id == "0" + key)) return lab;
    names += (names.empty() ? "" : ", ") + lab.name;
  }
  throw ConfigError(fmt::format("no lab '{}'", key), "the labs: " + names + " (distlab lab list)");
}

Lab with_only_checks(const Lab& lab, const std::vector<std::string>& names) {
  std::string all;
  for (const CheckSpec& c : lab.checks) all += (all.empty() ? "" : ", ") + c.name;
  for (const std::string& n : names)
    if (std::none_of(lab.checks.begin(), lab.checks.end(), [&](const CheckSpec& c) { return c.name == n; }))
      throw ConfigError(fmt::format("--check {}: lab {} has no such check", n, lab.name), "its checks: " + all);
  Lab only = lab;
  only.partial = true;
  std::erase_if(only.checks, [&](const CheckSpec& c) { return std::find(names.begin(), names.end(), c.name) == names.end(); });
  return only;
}

}  // namespace distlab::grader
