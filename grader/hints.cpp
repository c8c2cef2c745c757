#include "grader/hints.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/util/atomic_file.h"

namespace fs = std::filesystem;

namespace distlab::grader {

// {"failed": ["check", ...], "shown": {"check": "how", ...}}
HintRecord HintRecord::load(const std::string& path) {
  HintRecord r;
  r.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) return r;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  try {
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    for (const auto& c : j.at("failed")) r.failed.insert(c.get<std::string>());
    for (const auto& [k, v] : j.at("shown").items()) r.shown[k] = v.get<std::string>();
  } catch (const std::exception& e) {
    r.failed.clear();
    r.shown.clear();
    r.unreadable = fmt::format("{} is not a hint record ({}): it is kept as it is; delete it to record hints again", path, e.what());
  }
  return r;
}

void HintRecord::save() const {
  if (!unreadable.empty() || path.empty()) return;
  const nlohmann::json j = {{"failed", failed}, {"shown", shown}};
  AtomicFile f(path);
  f.write(j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  f.commit();
}

void apply_hints(Grade& g, HintRecord& r, HintPolicy policy) {
  for (CheckOutcome& c : g.checks) {
    if (c.status == "pass") continue;
    const bool show = policy == HintPolicy::always || (policy == HintPolicy::after_failure && r.failed.count(c.spec.name));
    if (show && !c.hint.empty()) {
      r.shown.emplace(c.spec.name, policy == HintPolicy::always ? "shown with every failure (--hints always)" : "after a failure");
    } else if (!c.hint.empty()) {
      c.hint.clear();
      c.hint_held = policy == HintPolicy::after_failure;  // --hints never: no hint, and no promise of one
    }
    r.failed.insert(c.spec.name);
  }
  g.hints_shown = r.shown;
}

}  // namespace distlab::grader
