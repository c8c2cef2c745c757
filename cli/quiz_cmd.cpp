// `distlab quiz`: the chapters' self-tests. A quiz is chapters/NN-topic.quiz.toml (or 7.3-self-test.quiz.toml
// for the course text's section 7.3): questions with one right answer (a choice, or a number within a
// relative tolerance) and an explanation, and optional scenarios -- small runs distlab starts before a
// question to show its symptom (two ranks without a DistributedSampler: the same curve as one rank, an
// epoch just as long), printed side by side.
//
//   distlab quiz list                 every quiz with its questions' count
//   distlab quiz 7.3                  asks in the terminal (answers read from stdin, one per line)
//   distlab quiz 3 --answers a.json   grades {"id": answer, ...} without asking; JSON on stdout
// A choice's letter is the one shown (the file's order is shuffled, the same way everywhere).
//
// The file format is checked key by key: an unknown key, a missing answer or a choice answer that is not
// one of the choices is an error naming the file and line.
#include "cli/quiz_cmd.h"
#include "cli/paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "grader/bridge/sandbox.h"
#include "core/util/error.h"
#include "core/util/nesting.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace distlab {

namespace {

struct Question {
  std::string id, ask, kind, unit, explain, scenario;
  std::vector<std::string> choices;
  size_t answer_choice = 0;  // choice: the right one's index
  double answer_number = 0, tolerance = 0.02;
};

struct ScenarioRun {
  std::string label, args;
  int ranks = 1;
};

struct Scenario {
  std::string say;
  std::vector<ScenarioRun> runs;
  std::vector<std::string> show;
};

struct Quiz {
  std::string id, title, file;
  std::vector<Question> questions;
  std::map<std::string, Scenario> scenarios;
};

// "03-ddp.quiz.toml" -> "3", "7.3-self-test.quiz.toml" -> "7.3": the number before the first '-',
// each dot-separated part without leading zeros.
std::string quiz_id(const std::string& stem) {
  std::string num = stem.substr(0, stem.find('-')), out;
  std::stringstream ss(num);
  for (std::string part; std::getline(ss, part, '.');) {
    size_t i = part.find_first_not_of('0');
    out += (out.empty() ? "" : ".") + (i == std::string::npos ? std::string("0") : part.substr(i));
  }
  return out;
}

// The choices are shown in an order fixed by the quiz and question ids (FNV-1a, then a Fisher-Yates walk
// of a 64-bit LCG): the same on every machine and every run, so --answers files keep their letters, but
// not the file's order -- where authors like to put the right answer second.
void shuffle_choices(Question& x, const std::string& quiz) {
  uint64_t h = 1469598103934665603ull;
  for (char c : quiz + "/" + x.id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::vector<size_t> order(x.choices.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  for (size_t i = order.size(); i > 1; i--) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(order[i - 1], order[size_t((h >> 33) % i)]);
  }
  std::vector<std::string> shown;
  size_t answer = 0;
  for (size_t k = 0; k < order.size(); k++) {
    shown.push_back(x.choices[order[k]]);
    if (order[k] == x.answer_choice) answer = k;
  }
  x.choices = std::move(shown);
  x.answer_choice = answer;
}

std::string where(const std::string& file, const toml::node& n) {
  return fmt::format("{}:{}", file, n.source().begin.line);
}

// A quiz file's keys: what is not declared here is an error (a typo must not silently drop a question).
void only_quiz_keys(const toml::table& t, std::initializer_list<const char*> keys, const std::string& file, const std::string& what) {
  for (auto&& [k, v] : t) {
    bool known = false;
    for (const char* key : keys) known = known || k.str() == key;
    if (!known) {
      std::string list;
      for (const char* key : keys) list += (list.empty() ? "" : ", ") + std::string(key);
      throw ConfigError(fmt::format("{}: unknown key '{}' in {}", where(file, v), k.str(), what), "the keys are " + list);
    }
  }
}

std::string need_string(const toml::table& t, const char* key, const std::string& file, const std::string& what) {
  auto v = t[key].value<std::string>();
  if (!v || v->empty()) throw ConfigError(fmt::format("{}: {} has no '{}' (a string)", where(file, t), what, key));
  return *v;
}

Quiz load_quiz(const fs::path& path) {
  const std::string file = (path.parent_path().filename() / path.filename()).string();
  toml::table doc;
  try {
    doc = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}: {}", file, e.source().begin.line, e.description()));
  }
  only_quiz_keys(doc, {"title", "question", "scenario"}, file, "the quiz");
  Quiz q;
  q.file = file;
  q.id = quiz_id(path.stem().stem().string());
  q.title = need_string(doc, "title", file, "the quiz");
  if (auto* sc = doc["scenario"].as_table())
    for (auto&& [name, node] : *sc) {
      const toml::table* t = node.as_table();
      if (!t) throw ConfigError(fmt::format("{}: scenario.{} is not a table", where(file, node), name.str()));
      only_quiz_keys(*t, {"say", "runs", "show"}, file, "scenario." + std::string(name.str()));
      Scenario s;
      s.say = t->get_as<std::string>("say") ? **t->get_as<std::string>("say") : "";
      const toml::array* runs = t->get_as<toml::array>("runs");
      if (!runs || runs->empty()) throw ConfigError(fmt::format("{}: scenario.{} has no runs", where(file, *t), name.str()));
      for (auto&& r : *runs) {
        const toml::table* rt = r.as_table();
        if (!rt) throw ConfigError(fmt::format("{}: a run of scenario.{} is not a table", where(file, r), name.str()));
        only_quiz_keys(*rt, {"label", "ranks", "args"}, file, "a scenario run");
        ScenarioRun run{need_string(*rt, "label", file, "a scenario run"), need_string(*rt, "args", file, "a scenario run"),
                        int((*rt)["ranks"].value_or(int64_t(1)))};
        if (run.ranks < 1 || run.ranks > 16) throw ConfigError(fmt::format("{}: ranks {} (1 to 16)", where(file, *rt), run.ranks));
        s.runs.push_back(run);
      }
      if (const toml::array* show = t->get_as<toml::array>("show"))
        for (auto&& v : *show) s.show.push_back(v.value_or(std::string()));
      if (s.show.empty()) s.show = {"loss"};
      q.scenarios[std::string(name.str())] = s;
    }
  const toml::array* qs = doc["question"].as_array();
  if (!qs || qs->empty()) throw ConfigError(fmt::format("{}: no [[question]]", file));
  std::set<std::string> ids;
  for (auto&& node : *qs) {
    const toml::table* t = node.as_table();
    if (!t) throw ConfigError(fmt::format("{}: a question is not a table", where(file, node)));
    only_quiz_keys(*t, {"id", "ask", "kind", "choices", "answer", "tolerance", "unit", "explain", "scenario"}, file, "a question");
    Question x;
    x.id = need_string(*t, "id", file, "a question");
    const std::string what = "question '" + x.id + "'";
    if (!ids.insert(x.id).second) throw ConfigError(fmt::format("{}: two questions have the id '{}'", where(file, *t), x.id));
    x.ask = need_string(*t, "ask", file, what);
    x.kind = need_string(*t, "kind", file, what);
    x.explain = need_string(*t, "explain", file, what);
    x.unit = (*t)["unit"].value_or(std::string());
    x.scenario = (*t)["scenario"].value_or(std::string());
    if (!x.scenario.empty() && !q.scenarios.count(x.scenario))
      throw ConfigError(fmt::format("{}: {} names scenario '{}', which the file does not define", where(file, *t), what, x.scenario));
    if (x.kind == "choice") {
      const toml::array* cs = t->get_as<toml::array>("choices");
      if (!cs || cs->size() < 2 || cs->size() > 8) throw ConfigError(fmt::format("{}: {} needs 2 to 8 choices", where(file, *t), what));
      for (auto&& c : *cs) x.choices.push_back(c.value_or(std::string()));
      const std::string a = (*t)["answer"].value_or(std::string());
      if (a.size() != 1 || a[0] < 'a' || size_t(a[0] - 'a') >= x.choices.size())
        throw ConfigError(fmt::format("{}: {}'s answer '{}' is not one of the letters a..{}", where(file, *t), what, a,
                                      char('a' + x.choices.size() - 1)));
      x.answer_choice = size_t(a[0] - 'a');
      shuffle_choices(x, q.id);
    } else if (x.kind == "number") {
      auto a = (*t)["answer"].value<double>();
      if (!a) throw ConfigError(fmt::format("{}: {} has no numeric answer", where(file, *t), what));
      x.answer_number = *a;
      x.tolerance = (*t)["tolerance"].value_or(0.02);
      if (!(x.tolerance >= 0 && x.tolerance < 1)) throw ConfigError(fmt::format("{}: {}'s tolerance must be in [0, 1)", where(file, *t), what));
    } else {
      throw ConfigError(fmt::format("{}: {} has kind '{}'", where(file, *t), what, x.kind), "kind is choice or number");
    }
    q.questions.push_back(std::move(x));
  }
  return q;
}

// The quizzes' folder: chapters/ of the source tree, or $DISTLAB_CHAPTERS (a course's own, or a test's).
fs::path chapters_dir() {
  const char* env = std::getenv("DISTLAB_CHAPTERS");
  return env && *env ? fs::path(env) : fs::path(tree_source_dir()) / "chapters";
}

std::vector<Quiz> all_quizzes() {
  std::vector<Quiz> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(chapters_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 10 && name.substr(name.size() - 10) == ".quiz.toml" && std::isdigit(static_cast<unsigned char>(name[0])))
      v.push_back(load_quiz(e.path()));
  }
  auto key = [](const std::string& id) {  // "7.3" after "7", before "8"
    std::vector<int> k;
    std::stringstream ss(id);
    for (std::string p; std::getline(ss, p, '.');) k.push_back(std::stoi(p));
    return k;
  };
  std::sort(v.begin(), v.end(), [&](const Quiz& a, const Quiz& b) { return key(a.id) < key(b.id); });
  return v;
}

std::string lower_trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string expected_text(const Question& q) {
  if (q.kind == "choice") return fmt::format("{}) {}", char('a' + q.answer_choice), q.choices[q.answer_choice]);
  return fmt::format("{:g}{}{}", q.answer_number, q.unit.empty() ? "" : " ", q.unit);
}

// Whether `given` is right: a choice's letter (or its 1-based number, or its text); a number, optionally
// followed by its unit, within the question's relative tolerance.
bool grade(const Question& q, const std::string& given_raw) {
  const std::string g = lower_trim(given_raw);
  if (g.empty()) return false;
  if (q.kind == "choice") {
    size_t pick = q.choices.size();
    if (g.size() == 1 && g[0] >= 'a' && g[0] < char('a' + q.choices.size())) pick = size_t(g[0] - 'a');
    else if (g.size() == 2 && g[1] == ')' && g[0] >= 'a') pick = size_t(g[0] - 'a');
    else if (g.find_first_not_of("0123456789") == std::string::npos && g.size() < 3) pick = size_t(std::stoi(g)) - 1;
    else
      for (size_t i = 0; i < q.choices.size(); i++)
        if (lower_trim(q.choices[i]) == g) pick = i;
    return pick == q.answer_choice;
  }
  char* end = nullptr;
  const double v = std::strtod(g.c_str(), &end);
  if (end == g.c_str() || !std::isfinite(v)) return false;
  const std::string rest = lower_trim(end);
  if (!rest.empty() && rest != "%" && rest != lower_trim(q.unit)) return false;  // "14 gb" for GB; "14 apples" is not an answer
  const double a = q.answer_number;
  return a == 0 ? std::abs(v) <= q.tolerance : std::abs(v - a) <= q.tolerance * std::abs(a);
}

// ---- scenarios: small runs side by side ----

std::vector<std::string> split_args(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, any = false;
  for (char c : s) {
    if (c == '"') quoted = !quoted, any = true;
    else if (std::isspace(static_cast<unsigned char>(c)) && !quoted) {
      if (any) out.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) out.push_back(cur);
  return out;
}

struct RunOutcome {
  std::vector<double> losses;
  json summary;
};

RunOutcome run_scenario_run(const std::string& self_exe, const std::string& quiz_file, const std::string& name, const ScenarioRun& r) {
  char tmpl[] = "/tmp/distlab-quiz-XXXXXX";
  if (!mkdtemp(tmpl)) throw IoError("cannot create a temporary folder for the quiz's runs", "is /tmp writable?");
  const fs::path dir = tmpl;
  const std::string metrics = (dir / "metrics.jsonl").string();
  std::vector<std::string> argv = {self_exe, "run", "-n", std::to_string(r.ranks), "--master-port", "0"};
  for (const std::string& a : split_args(r.args)) argv.push_back(a);
  argv.insert(argv.end(), {"--metrics", metrics});
  SpawnOptions o;
  o.file_mb = 256;
  o.new_session = true;
  std::cout << fmt::format("  running \"{}\": distlab run -n {} {}\n", r.label, r.ranks, r.args) << std::flush;
  fs::current_path(tree_source_dir());  // the runs' configs are named relative to the source folder
  const RunResult res = run_to_end(argv, o, 600, 4000);
  RunOutcome out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.value("kind", "") == "step") out.losses.push_back(j.contains("loss") && j["loss"].is_number() ? j["loss"].get<double>() : NAN);
    if (j.value("kind", "") == "summary") out.summary = j;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (res.timed_out || !WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0 || !out.summary.is_object())
    throw Error(fmt::format("{}: scenario '{}', run \"{}\" failed ({}):\n{}", quiz_file, name, r.label,
                            res.timed_out ? "timed out" : describe_wait_status(res.status), res.output));
  return out;
}

std::string cell(const json& v) {
  if (v.is_number_integer()) return fmt::format("{}", v.get<int64_t>());
  if (v.is_number()) return fmt::format("{:.4g}", v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  return v.dump();
}

void run_scenario(const std::string& self_exe, const Quiz& quiz, const std::string& name) {
  const Scenario& s = quiz.scenarios.at(name);
  std::cout << "\n── scenario: " << name << " ──\n";
  if (!s.say.empty()) std::cout << s.say << "\n";
  std::vector<RunOutcome> outs;
  for (const ScenarioRun& r : s.runs) outs.push_back(run_scenario_run(self_exe, quiz.file, name, r));
  size_t w = 16, lw = 18;
  for (const ScenarioRun& r : s.runs) w = std::max(w, r.label.size() + 2);
  for (const std::string& what : s.show) lw = std::max(lw, what.size());
  std::cout << "\n" << fmt::format("{:>{}}", "", lw);
  for (const ScenarioRun& r : s.runs) std::cout << fmt::format("{:>{}}", r.label, w);
  std::cout << "\n";
  for (const std::string& what : s.show) {
    if (what == "loss") {
      size_t steps = 0;
      for (const RunOutcome& o : outs) steps = std::max(steps, o.losses.size());
      const size_t stride = std::max<size_t>(1, (steps + 9) / 10);  // about ten rows, the last always
      for (size_t i = 0; i < steps; i++) {
        if (i % stride != 0 && i + 1 != steps) continue;
        std::cout << fmt::format("{:>{}}", fmt::format("loss, step {}", i + 1), lw);
        for (const RunOutcome& o : outs)
          std::cout << fmt::format("{:>{}}", i < o.losses.size() ? fmt::format("{:.4f}", o.losses[i]) : "-", w);
        std::cout << "\n";
      }
    } else {
      std::cout << fmt::format("{:>{}}", what, lw);
      for (const RunOutcome& o : outs) std::cout << fmt::format("{:>{}}", cell(o.summary.value(what, json())), w);
      std::cout << "\n";
    }
  }
  std::cout << "\n";
}

// ---- asking and grading ----

void print_question(const Question& q, size_t i, size_t n) {
  std::cout << fmt::format("[{}/{}] {}\n", i + 1, n, q.ask);
  for (size_t c = 0; c < q.choices.size(); c++) std::cout << fmt::format("   {}) {}\n", char('a' + c), q.choices[c]);
  if (q.kind == "number") std::cout << fmt::format("   (a number{})\n", q.unit.empty() ? "" : ", in " + q.unit);
}

int ask(const std::string& self_exe, const Quiz& quiz, bool scenarios) {
  std::cout << fmt::format("quiz {}: {} ({} questions; answer a letter or a number, Enter to skip)\n\n", quiz.id, quiz.title,
                           quiz.questions.size());
  std::set<std::string> shown;
  int right = 0;
  size_t asked = 0;
  for (size_t i = 0; i < quiz.questions.size(); i++) {
    const Question& q = quiz.questions[i];
    if (scenarios && !q.scenario.empty() && shown.insert(q.scenario).second) run_scenario(self_exe, quiz, q.scenario);
    print_question(q, i, quiz.questions.size());
    std::cout << "your answer: " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line)) {
      std::cout << "\n(no more input)\n";
      break;
    }
    asked++;
    const bool ok = grade(q, line);
    right += ok;
    std::cout << (ok ? "right: " : lower_trim(line).empty() ? "skipped: " : "not quite: ") << "the answer is " << expected_text(q) << ".\n\n"
              << q.explain << "\n\n";
  }
  std::cout << fmt::format("score: {} of {} ({} asked)\n", right, quiz.questions.size(), asked);
  return 0;
}

nlohmann::ordered_json grade_file(const Quiz& quiz, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(fmt::format("cannot read answers file '{}'", path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check_nesting(text, path);
  nlohmann::ordered_json answers = nlohmann::ordered_json::parse(text, nullptr, false);
  if (answers.is_discarded() || !answers.is_object())
    throw Error(fmt::format("'{}' is not a JSON object", path), "write {\"question-id\": \"b\", \"other-id\": 14, ...}");
  std::set<std::string> ids;
  for (const Question& q : quiz.questions) ids.insert(q.id);
  for (auto it = answers.begin(); it != answers.end(); ++it)
    if (!ids.count(it.key())) {
      std::string list;
      for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
      throw Error(fmt::format("{}: no question '{}' in quiz {}", path, it.key(), quiz.id), "its questions are " + list);
    }
  nlohmann::ordered_json out = {{"quiz", quiz.id}, {"title", quiz.title}, {"file", quiz.file}, {"score", 0},
                                {"total", quiz.questions.size()}, {"questions", nlohmann::ordered_json::array()}};
  int right = 0;
  for (const Question& q : quiz.questions) {
    nlohmann::ordered_json given = answers.value(q.id, nlohmann::ordered_json());
    std::string g = given.is_string() ? given.get<std::string>() : given.is_number() ? fmt::format("{:.17g}", given.get<double>()) : "";
    const bool ok = !given.is_null() && grade(q, g);
    right += ok;
    out["questions"].push_back({{"id", q.id}, {"correct", ok}, {"given", given}, {"expected", expected_text(q)}, {"explain", q.explain}});
  }
  out["score"] = right;
  return out;
}

}  // namespace

void add_quiz_command(CLI::App& app, int& exit_code, const std::string& self_exe) {
  struct Args {
    std::string which = "list", answers;
    bool no_scenario = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("quiz", "a chapter's self-test: small runs that show a symptom, then questions");
  sub->add_option("quiz", a->which, "list (default), a chapter's number (3), or 7.3 (the course text's self-test)");
  sub->add_option("--answers", a->answers, "grade a JSON file {\"id\": answer} without asking; JSON result on stdout");
  sub->add_flag("--no-scenario", a->no_scenario, "ask without running the scenarios first");
  sub->callback([a, self_exe, &exit_code] {
    const std::vector<Quiz> all = all_quizzes();
    if (a->which == "list") {
      for (const Quiz& q : all) std::cout << fmt::format("{:>4}  {}  ({} questions{})\n", q.id, q.title, q.questions.size(),
                                                         q.scenarios.empty() ? "" : ", with a scenario");
      return;
    }
    const std::string want = a->which.find_first_not_of("0123456789.") == std::string::npos ? quiz_id(a->which) : a->which;
    for (const Quiz& q : all)
      if (q.id == want || fs::path(q.file).stem().stem().string() == a->which) {
        if (!a->answers.empty()) {
          std::cout << grade_file(q, a->answers).dump(2) << "\n";
          return;
        }
        exit_code = ask(self_exe, q, !a->no_scenario);
        return;
      }
    std::string ids;
    for (const Quiz& q : all) ids += (ids.empty() ? "" : ", ") + q.id;
    throw Error(fmt::format("no quiz '{}'", a->which), ids.empty() ? "no chapters/*.quiz.toml beside this build" : "the quizzes are " + ids);
  });
}

}  // namespace distlab
