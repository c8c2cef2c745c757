#include "cli/slurm_grade.h"

#include "grader/gradebook.h"

#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

#include "core/comm/slurm.h"
#include "core/util/choice.h"
#include "core/util/error.h"
#include "core/util/read_file.h"
#include "grader/hints.h"

namespace fs = std::filesystem;

namespace distlab {

namespace {

constexpr const char* kFormat = "distlab-slurm-grading-1";

// A folder's name as it is on disk, whatever its bytes (JSON holds UTF-8 only: "M\xfcller" would not survive)
std::string to_hex(const std::string& raw) {
  std::string h;
  for (unsigned char c : raw) h += fmt::format("{:02x}", c);
  return h;
}
std::string from_hex(const std::string& h) {
  if (h.size() % 2) throw std::runtime_error("an odd number of hex digits");
  std::string raw;
  for (size_t i = 0; i < h.size(); i += 2) {
    const std::string byte = h.substr(i, 2);
    if (byte.find_first_not_of("0123456789abcdef") != std::string::npos) throw std::runtime_error("not hex: " + byte);
    raw += char(std::stoi(byte, nullptr, 16));
  }
  return raw;
}

struct Manifest {
  std::string lab, submissions, feedback_dir;
  std::vector<std::string> entries, feedback;  // each student's folder name and feedback file name, in order
  int per_task = 1;
  uint64_t seed = 0;
  std::string hints;
  std::string device = "auto";  // --device, decided on each task's node (its GPUs)
  int tasks() const { return int((entries.size() + size_t(per_task) - 1) / size_t(per_task)); }
};

// a grading folder's file, which anyone with access may have replaced (a FIFO, a link to /dev/zero): read
// only if it is a regular file of at most max_bytes
std::string slurp(const fs::path& f, size_t max_bytes) {
  const std::vector<uint8_t> bytes = read_regular_file(f.string(), max_bytes, "a Slurm grading's file");
  return std::string(bytes.begin(), bytes.end());
}

Manifest read_manifest(const fs::path& results) {
  const fs::path f = results / "manifest.json";
  if (!fs::exists(f)) throw ConfigError(f.string() + ": no such file", "give the folder `distlab grade NN --submissions DIR --slurm` wrote (--results)");
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(slurp(f, 64 << 20));
    if (j.at("format").get<std::string>() != kFormat) throw std::runtime_error("format is not " + std::string(kFormat));
    m.lab = j.at("lab").get<std::string>();
    m.submissions = from_hex(j.at("submissions_hex").get<std::string>());
    m.feedback_dir = from_hex(j.at("feedback_hex").get<std::string>());
    m.per_task = j.at("per_task").get<int>();
    m.seed = std::stoull(j.at("seed").get<std::string>());
    m.hints = j.at("hints").get<std::string>();
    m.device = j.value("device", std::string("auto"));
    if (!parse_choice<grader::HintPolicy>(m.hints)) throw std::runtime_error("hints '" + m.hints + "' is not a policy");
    std::set<std::string> taken;
    for (const auto& s : j.at("students")) {
      m.entries.push_back(from_hex(s.at("entry_hex").get<std::string>()));
      const std::string& e = m.entries.back();
      if (e.empty() || e == "." || e == ".." || e.find('/') != std::string::npos || e.find('\0') != std::string::npos)
        throw std::runtime_error("a student's entry is not a name in the submissions folder");
      m.feedback.push_back(feedback_name(e, taken));  // recomputed, never read: no name leads out of the folder
    }
    if (m.per_task < 1 || m.per_task > 1000000 || m.entries.empty()) throw std::runtime_error("no students, or per_task not in 1..1000000");
    if (!fs::path(m.submissions).is_absolute() || !fs::path(m.feedback_dir).is_absolute()) throw std::runtime_error("a folder that is not absolute");
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("{}: not a grading's manifest: {}", f.string(), e.what()), "it is written by `distlab grade NN --submissions DIR --slurm`");
  }
  return m;
}

fs::path row_path(const fs::path& results, size_t i) { return results / "rows" / fmt::format("{}.json", i); }

// what goes on an #SBATCH line or into --output unquoted: no blank, no '%' (Slurm's patterns), printable
void check_plain_path(const std::string& path, const std::string& what) {
  for (char c : path)
    if (std::isspace(static_cast<unsigned char>(c)) || std::string("%\"'\\").find(c) != std::string::npos || std::iscntrl(static_cast<unsigned char>(c)))
      throw ConfigError(fmt::format("{} '{}': Slurm's #SBATCH lines need a path without blanks, quotes, '\\', '%' or control characters", what, path),
                        "give --results a plain folder name");
}

std::string grading_script(const grader::Paths& p, const GradeArgs& a, const Manifest& m, const fs::path& results) {
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# distlab: lab {} graded as a Slurm array job, {} student(s), {} per task (manifest.json lists them in order).\n",
                   m.lab, m.entries.size(), m.per_task);
  s += "# Grade some tasks again alone with: sbatch --array=3,7 " + (results / "grade.sbatch").string() + "\n";
  s += fmt::format("#SBATCH --job-name=distlab-grade-{}\n", m.lab);
  s += fmt::format("#SBATCH --array=0-{}{}\n", m.tasks() - 1, a.max_running > 0 ? fmt::format("%{}", a.max_running) : "");
  s += fmt::format("#SBATCH --ntasks=1\n#SBATCH --cpus-per-task={}\n#SBATCH --time={}\n", a.cpus_per_task, a.time);
  if (!a.partition.empty()) s += "#SBATCH --partition=" + a.partition + "\n";
  s += "#SBATCH --output=" + (results / "logs" / "task-%a.out").string() + "\n";
  // students' code on a node without the sandbox could write other students' rows: a task refuses to grade
  // there (its students are then named by merge), unless the grading was started with --no-sandbox
  s += "exec " + shell_quote(p.self_exe) + " grade " + shell_quote(m.lab) + " --slurm-task " + shell_quote(results.string());
  s += a.no_sandbox ? " --no-sandbox" : " --require-sandbox";
  return s + "\n";
}

}  // namespace

int submit_slurm_grading(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport&) {
  if (!a.csv.empty() || !a.json.empty() || !a.junit.empty() || !a.html.empty() || a.jobs > 1)
    throw ConfigError("--slurm writes its rows into --results: --csv and --json belong to `distlab grade merge`; --junit, --html and --jobs to one machine",
                      "distlab grade NN --submissions DIR --slurm --results R, then distlab grade merge R --csv grades.csv");
  check_slurm_time(a.time, "--time");
  for (char c : a.partition)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != ',')
      throw ConfigError(fmt::format("--partition '{}': use letters, digits, '-', '_', '.' and ','", a.partition));
  const fs::path subs = fs::absolute(a.submissions).lexically_normal();
  const fs::path results = fs::absolute(a.results.empty() ? subs.string() + "-slurm" : a.results).lexically_normal();
  check_plain_path(results.string(), "--results");
  if (fs::exists(results / "manifest.json"))
    throw ConfigError(results.string() + " already holds a grading", "merge it (distlab grade merge " + results.string() + ") or give --results another folder");
  Manifest m;
  m.lab = l.name;
  m.submissions = subs.string();
  // --feedback: a folder kept from one grading to the next (the hints a student has seen carry over, as in a
  // local batch); by default the grading's own
  m.feedback_dir = a.feedback.empty() ? (results / "feedback").string() : fs::absolute(a.feedback).lexically_normal().string();
  m.per_task = a.per_task;
  m.seed = a.seed ? *a.seed : grader::SharedResults::draw_seed();
  m.hints = a.hints;
  m.device = a.device;
  std::set<std::string> taken;
  for (const fs::path& e : submission_entries(a.submissions)) {
    m.entries.push_back(e.filename().string());
    m.feedback.push_back(feedback_name(m.entries.back(), taken));
  }
  if (m.entries.empty()) throw ConfigError("--submissions " + a.submissions + " is empty", "one subfolder per student");
  for (const fs::path& sub : {results / "rows", results / "logs", fs::path(m.feedback_dir)}) fs::create_directories(sub);
  nlohmann::json students = nlohmann::json::array();
  for (size_t i = 0; i < m.entries.size(); i++)
    students.push_back({{"entry_hex", to_hex(m.entries[i])}, {"name", sanitize_output(m.entries[i], 300)}, {"feedback", m.feedback[i]}});
  const nlohmann::json manifest = {{"format", kFormat}, {"lab", m.lab}, {"submissions_hex", to_hex(m.submissions)}, {"feedback_hex", to_hex(m.feedback_dir)},
                                   {"per_task", m.per_task}, {"seed", std::to_string(m.seed)}, {"hints", m.hints}, {"device", m.device}, {"students", students}};
  write_atomically((results / "grade.sbatch").string(), grading_script(p, a, m, results));
  write_atomically((results / "manifest.json").string(), manifest.dump(2) + "\n");
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  if (a.wait) argv.push_back("--wait");
  argv.insert(argv.end(), a.sbatch_args.begin(), a.sbatch_args.end());
  argv.push_back((results / "grade.sbatch").string());
  std::cout << fmt::format("lab {}: {} student(s) in {} array task(s); seed {}\nsubmitting: sbatch {}\n", l.name, m.entries.size(), m.tasks(), m.seed,
                           (results / "grade.sbatch").string())
            << std::flush;
  const RunResult r = run_to_end(argv, SpawnOptions{}, a.wait ? 7 * 86400.0 : 120.0);
  std::string job;  // --parsable: "jobid" or "jobid;cluster", the first such line (--wait may print more after it)
  std::istringstream lines(r.output);
  for (std::string line; job.empty() && std::getline(lines, line);)
    if (!line.empty() && line.find_first_not_of("0123456789") == line.find(';') && line.find(';') != 0) job = line.substr(0, line.find(';'));
  if (!WIFEXITED(r.status) || (WEXITSTATUS(r.status) != 0 && !a.wait) || job.empty()) {
    std::cerr << fmt::format("distlab: error: sbatch {}{}\n{}", describe_wait_status(r.status),
                             WIFEXITED(r.status) && WEXITSTATUS(r.status) == 127 ? " (no sbatch here: run this on the cluster's login node)" : "", r.output);
    return 2;
  }
  std::cout << fmt::format("array job {}: each task's output in {}/logs/; ", job, results.string());
  if (!a.wait) {
    std::cout << "when it has ended: distlab grade merge " << shell_quote(results.string()) << "\n";
    return 0;
  }
  std::cout << "it has ended" << (WEXITSTATUS(r.status) != 0 ? " (some tasks failed)" : "") << "\n";
  return merge_slurm_grading(p, results.string(), "", "");
}

int run_slurm_grading_task(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb) {
  const fs::path results = fs::absolute(a.slurm_task);
  const Manifest m = read_manifest(results);
  if (m.lab != l.name) throw ConfigError(fmt::format("{} grades lab {}, not {}", results.string(), m.lab, l.name));
  const char* id = std::getenv("SLURM_ARRAY_TASK_ID");
  char* end = nullptr;
  const long task = id ? std::strtol(id, &end, 10) : -1;
  if (!id || *end || task < 0 || task >= m.tasks())
    throw ConfigError(fmt::format("SLURM_ARRAY_TASK_ID='{}' is not a task of this grading (0..{})", id ? id : "", m.tasks() - 1),
                      "--slurm-task runs inside the array job that `distlab grade NN --submissions DIR --slurm` submits");
  grader::SharedResults batch;
  batch.seed = m.seed;
  set_grading_device(batch, m.device);
  batch.shared_machine = "a Slurm array task may share its node (and its GPUs) with other tasks";
  const grader::HintPolicy policy = *parse_choice<grader::HintPolicy>(m.hints);
  std::cout << sb.describe() << "\n";
  for (size_t i = size_t(task) * size_t(m.per_task); i < std::min(m.entries.size(), size_t(task + 1) * size_t(m.per_task)); i++) {
    grader::Grade g = grade_submission(p, l, fs::path(m.submissions) / m.entries[i], batch, sb);
    write_feedback(g, m.feedback_dir, m.feedback[i], policy);
    const nlohmann::json row = {{"index", i}, {"entry_hex", to_hex(m.entries[i])}, {"grade", grader::to_json(g)}};
    write_atomically(row_path(results, i).string(), row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    std::cout << fmt::format("{:<24} {:>3}/{}{}\n", sanitize_output(g.student, 200), g.points(), l.max_points(), g.built ? "" : "  (" + grader::not_run_reason(g) + ")") << std::flush;
  }
  return 0;
}

int merge_slurm_grading(const grader::Paths& p, const std::string& results_arg, const std::string& csv, const std::string& json) {
  const fs::path results = fs::absolute(results_arg);
  const Manifest m = read_manifest(results);
  const grader::Lab l = grader::find_lab(p.source_dir, m.lab);
  std::vector<grader::Grade> grades;
  std::vector<std::string> missing;
  std::set<long> tasks;
  for (size_t i = 0; i < m.entries.size(); i++) {
    const fs::path f = row_path(results, i);
    std::string why = "no row: its task did not finish";
    std::optional<grader::Grade> g;
    if (fs::exists(f)) {
      try {
        const auto j = nlohmann::json::parse(slurp(f, 64 << 20));
        if (j.at("index").get<size_t>() != i || j.at("entry_hex").get<std::string>() != to_hex(m.entries[i])) why = "its row names another student";
        else if ((g = grader::grade_from_json(j.at("grade"), l, why)) && g->student != sanitize_output(m.entries[i], 300)) g.reset(), why = "its row names another student";
        else if (g && g->build_log.rfind("grading failed:", 0) == 0) g.reset(), why = "the grader failed on its node";
      } catch (const std::exception& e) {
        why = std::string("an unreadable row: ") + e.what();
      }
    }
    if (!g) {
      const long t = long(i) / m.per_task;
      tasks.insert(t);
      missing.push_back(fmt::format("{} (task {}: {}; {})", sanitize_output(m.entries[i], 200), t, why, (results / "logs" / fmt::format("task-{}.out", t)).string()));
      g = grader::Grade{};
      g->student = m.entries[i];
      g->lab = l;
      g->seed = m.seed;
      g->build_log = "not graded: " + why + " (a Slurm array task; see its log)";
      // every student has a feedback file: this one says why there is no grade (a file an earlier
      // grading wrote into a --feedback folder is kept)
      const fs::path fb = fs::path(m.feedback_dir) / (m.feedback[i] + ".txt");
      std::error_code ec;
      if (!fs::exists(fb, ec)) {
        try {
          write_atomically(fb.string(), grader::table(*g));
        } catch (const std::exception& e) {
          std::cerr << fmt::format("distlab: could not write {}: {}\n", fb.string(), e.what());
        }
      }
    }
    grades.push_back(std::move(*g));
  }
  const std::string csv_path = csv.empty() ? (results / "grades.csv").string() : csv;
  const std::string json_path = json.empty() ? (results / "grades.json").string() : json;
  write_atomically(csv_path, grader::gradebook_csv(grades, grader::batch_info(p, l, nullptr)));
  nlohmann::json all = nlohmann::json::array();
  for (const auto& g : grades) all.push_back(grader::to_json(g));
  write_atomically(json_path, all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  std::cout << fmt::format("lab {}: {} of {} student(s) graded; gradebook {} and {}; feedback in {}/\n", m.lab, grades.size() - missing.size(),
                           grades.size(), csv_path, json_path, m.feedback_dir);
  if (missing.empty()) return 0;
  std::string ids;
  for (long t : tasks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::cerr << fmt::format("{} student(s) without a result:\n", missing.size());
  for (const auto& s : missing) std::cerr << "  " << s << "\n";
  std::cerr << fmt::format("grade them alone: sbatch --array={} {}\nthen merge again: distlab grade merge {}\n", ids, shell_quote((results / "grade.sbatch").string()),
                           shell_quote(results.string()));
  return 1;
}

}  // namespace distlab
