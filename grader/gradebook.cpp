// The gradebook, Gradescope's results and the copies (grader/gradebook.h).
#include "grader/gradebook.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <unordered_set>

#include "core/util/error.h"
#include "core/util/read_file.h"
#include "grader/harness.h"

namespace distlab::grader {

namespace fs = std::filesystem;

namespace {

// One CSV line's fields: commas outside double quotes split, "" inside quotes is a quote.
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> f;
  std::string cur;
  bool q = false;
  for (size_t i = 0; i < line.size(); i++) {
    const char c = line[i];
    if (q && c == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', i++;
    else if (c == '"') q = !q;
    else if (c == ',' && !q) f.push_back(cur), cur.clear();
    else if (c != '\r') cur += c;
  }
  f.push_back(cur);
  for (auto& s : f) {  // spaces around a field are not part of it
    const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    s = a == std::string::npos ? "" : s.substr(a, b - a + 1);
  }
  return f;
}

// A cell a spreadsheet would run as a formula is shown as text; one line per student.
std::string quote(const std::string& s) {
  std::string o = "\"";
  if (!s.empty() && std::string("=+-@\t\r").find(s[0]) != std::string::npos) o += "'";
  for (char c : s) o += c == '"' ? std::string("\"\"") : c == '\n' ? std::string(" ") : std::string(1, c);
  return o + "\"";
}

std::string crc_of_files(const std::vector<std::string>& files) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
      crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(in.gcount()));
  }
  return fmt::format("{:08x}", crc);
}

std::string error_of(const Grade& g) {
  if (!g.built) return not_run_reason(g) == "not graded" ? g.build_log.substr(0, 300) : "build failed: " + g.build_log.substr(0, 300);
  for (const auto& c : g.checks)
    if (c.status != "pass" && c.status != "fail") return c.spec.name + ": " + c.status + ": " + c.seen.substr(0, 200);
  return "";
}

// A source file as tokens, normalized: comments and spacing gone, every identifier and number one token
// ("I", "N"), string and character literals one token ("S"), keywords and punctuation as they are.
std::vector<std::string> tokens(const std::string& s) {
  static const std::set<std::string> keywords = {
      "auto", "bool", "break", "case", "char", "const", "constexpr", "continue", "default", "delete", "do", "double", "else", "enum",
      "false", "float", "for", "if", "inline", "int", "long", "namespace", "new", "nullptr", "return", "short", "signed", "sizeof",
      "static", "struct", "switch", "template", "this", "true", "typename", "unsigned", "using", "void", "while", "class", "public",
      "private", "include", "define", "std", "vector", "int64_t", "size_t", "int32_t", "uint64_t"};
  std::vector<std::string> t;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) { i++; continue; }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') { while (i < s.size() && s[i] != '\n') i++; continue; }
    if (c == '#' ) { t.push_back("#"); i++; continue; }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      const size_t e = s.find("*/", i + 2);
      i = e == std::string::npos ? s.size() : e + 2;
      continue;
    }
    if (c == '"' || c == '\'') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) j += s[j] == '\\' ? 2 : 1;
      t.push_back("S");
      i = std::min(s.size(), j + 1);
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) j++;
      const std::string w = s.substr(i, j - i);
      t.push_back(keywords.count(w) ? w : "I");
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.' || s[j] == '\'')) j++;
      t.push_back("N");
      i = j;
      continue;
    }
    t.push_back(std::string(1, c));
    i++;
  }
  return t;
}

}  // namespace

Roster read_roster(const std::string& path) {
  std::string text;
  try {
    const auto bytes = read_regular_file(path, 16 << 20, "the roster");
    text.assign(bytes.begin(), bytes.end());
  } catch (const IoError& e) {
    throw ConfigError(fmt::format("--roster {}: {}", path, e.what()), "a CSV file: folder,id,name,email");
  }
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    if (nl > at) lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  if (lines.empty()) throw ConfigError(fmt::format("--roster {}: the file is empty", path), "a header line: folder,id,name,email");
  const auto header = csv_fields(lines[0]);
  auto col = [&](std::initializer_list<const char*> names) {
    for (size_t k = 0; k < header.size(); k++)
      for (const char* n : names) {
        std::string h = header[k];
        std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return char(std::tolower(c)); });
        if (h == n) return int(k);
      }
    return -1;
  };
  const int folder = col({"folder", "student", "submission"}), id = col({"id", "student_id", "sid"}), name = col({"name"}), email = col({"email"});
  if (folder < 0)
    throw ConfigError(fmt::format("--roster {}:1: no 'folder' column (the header is: {})", path, lines[0].substr(0, 200)),
                      "the first line names the columns: folder,id,name,email (folder: the submission's folder name)");
  Roster r;
  for (size_t i = 1; i < lines.size(); i++) {
    const auto f = csv_fields(lines[i]);
    auto at = [&](int k) { return k >= 0 && size_t(k) < f.size() ? f[size_t(k)] : std::string(); };
    if (at(folder).empty()) continue;
    if (!r.emplace(at(folder), RosterEntry{at(id), at(name), at(email)}).second)
      throw ConfigError(fmt::format("--roster {}:{}: the folder '{}' is listed twice", path, i + 1, at(folder)), "one line per student");
  }
  return r;
}

BatchInfo batch_info(const Paths& p, const Lab& lab, const Roster* roster) {
  BatchInfo b;
  b.lab_version = crc_of_files({(fs::path(lab.dir) / "lab.toml").string(), (fs::path(lab.dir) / "api.h").string()});
  b.grader_version = crc_of_files(engine_files(p));
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  b.date = buf;
  b.roster = roster;
  return b;
}

std::string gradebook_csv(const std::vector<Grade>& grades, const BatchInfo& info) {
  if (grades.empty() && (!info.roster || info.roster->empty())) return "";
  const Lab& lab = grades.empty() ? Lab{} : grades.front().lab;
  std::string csv = "student,id,name,email,lab,lab_version";
  for (const auto& c : lab.checks) csv += "," + c.name;
  csv += ",points,max,percent,error,grader_version,date\n";
  auto row = [&](const std::string& student, const Grade* g) {
    RosterEntry who;
    if (info.roster)
      if (auto it = info.roster->find(student); it != info.roster->end()) who = it->second;
    // --check: the lab's name says so, where an LMS import shows it (the points, max and percent are those checks')
    const std::string lab_name = lab.partial ? fmt::format("{} (--check: {} of its checks)", lab.name, lab.checks.size()) : lab.name;
    csv += fmt::format("{},{},{},{},{},{}", quote(sanitize_output(student, 300)), quote(who.id), quote(who.name), quote(who.email), quote(lab_name),
                       info.lab_version);
    for (const auto& spec : lab.checks) {
      int pts = 0;
      if (g)
        for (const auto& c : g->checks)
          if (c.spec.name == spec.name) pts = c.points;
      csv += "," + std::to_string(pts);
    }
    const int points = g ? g->points() : 0, max = lab.max_points();
    csv += fmt::format(",{},{},{:.1f},{},{},{}\n", points, max, max > 0 ? 100.0 * points / max : 0.0,
                       quote(g ? error_of(*g) : "no submission (the roster lists this student)"), info.grader_version, info.date);
  };
  std::set<std::string> graded;
  for (const auto& g : grades) {
    row(g.student, &g);
    graded.insert(g.student);
  }
  if (info.roster)
    for (const auto& [folder, who] : *info.roster)
      if (!graded.count(folder)) row(folder, nullptr);
  return csv;
}

nlohmann::json gradescope_results(const Grade& g) {
  nlohmann::json tests = nlohmann::json::array();
  if (!g.built)
    tests.push_back({{"name", not_run_reason(g)}, {"score", 0}, {"max_score", g.lab.max_points()},
                     {"output", sanitize_output(g.build_log, 20000)}, {"visibility", "visible"}});
  for (const auto& c : g.checks) {
    std::string out = c.spec.what;
    if (c.status != "pass" && !c.expected.empty()) out += "\nexpected: " + c.expected;
    if (!c.seen.empty()) out += "\nseen: " + c.seen;
    if (c.status != "pass" && !c.hint.empty()) out += "\nhint: " + c.hint;
    tests.push_back({{"name", c.spec.name}, {"score", c.points}, {"max_score", c.spec.points}, {"status", c.status == "pass" ? "passed" : "failed"},
                     {"output", sanitize_output(out, 20000)}, {"visibility", "visible"}});
  }
  return {{"score", g.points()}, {"output", sanitize_output(table(g), 60000)}, {"tests", tests}, {"visibility", "visible"}};
}

std::vector<Similar> similar_submissions(const std::vector<std::pair<std::string, std::string>>& texts, const std::string& baseline,
                                         double min_share) {
  constexpr size_t kRun = 8;  // tokens per shingle
  struct Doc {
    std::string name;
    std::vector<std::string> toks;
    std::unordered_set<uint64_t> runs;
  };
  auto runs_of = [&](Doc& d) {
    for (size_t i = 0; i + kRun <= d.toks.size(); i++) {
      uint64_t h = 1469598103934665603ULL;
      for (size_t k = 0; k < kRun; k++)
        for (char c : d.toks[i + k] + "\x1f") h = (h ^ uint8_t(c)) * 1099511628211ULL;
      d.runs.insert(h);
    }
  };
  // what the lab hands out (its skeleton) is everyone's: neither a copy nor evidence of one
  Doc given{"", tokens(baseline), {}};
  runs_of(given);
  std::vector<Doc> docs;
  for (const auto& [name, text] : texts) {
    Doc d{name, tokens(text), {}};
    if (d.toks == given.toks) continue;  // not started: the skeleton as handed out
    runs_of(d);
    for (uint64_t h : given.runs) d.runs.erase(h);
    docs.push_back(std::move(d));
  }
  std::vector<Similar> out;
  for (size_t i = 0; i < docs.size(); i++)
    for (size_t j = i + 1; j < docs.size(); j++) {
      const Doc &a = docs[i], &b = docs[j];
      if (a.toks.empty() || b.toks.empty() || a.runs.empty() || b.runs.empty()) continue;
      if (a.toks == b.toks) {
        out.push_back({a.name, b.name, 1.0, true});
        continue;
      }
      size_t common = 0;
      for (uint64_t h : a.runs) common += b.runs.count(h);
      const size_t all = a.runs.size() + b.runs.size() - common;
      const double share = all ? double(common) / double(all) : 0.0;
      if (share >= min_share) out.push_back({a.name, b.name, share, false});
    }
  return out;
}

}  // namespace distlab::grader
