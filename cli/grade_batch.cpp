#include "cli/grade_batch.h"
#include "cli/paths.h"

#include "grader/gradebook.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <iostream>
#include <mutex>
#include <thread>

#include "core/tensor/device.h"
#include "core/util/atomic_file.h"
#include "core/util/choice.h"
#include "core/util/error.h"
#include "grader/scratch.h"

namespace fs = std::filesystem;

namespace distlab {

grader::Paths grader_paths(const std::string& self_exe) { return {tree_source_dir(), tree_build_dir(), self_exe}; }

void set_grading_device(grader::SharedResults& batch, const std::string& device) {
  std::string why;
  const int gpus = device == "auto" || device == "cuda" ? cuda_device_count(&why) : 0;
  if (device == "auto") batch.device = gpus > 0 ? "cuda" : "cpu";
  else if (device == "cpu" || device == "cuda-sim") batch.device = device;
  else if (device == "cuda" && gpus > 0) batch.device = device;
  else if (device == "cuda")
    throw ConfigError("--device cuda: this build or machine has no GPU to grade on: " + why,
                      "grade on --device cpu, or on cuda-sim (the GPU's code path on the CPU)");
  else throw ConfigError("--device '" + device + "' is not one a grading runs on", "use auto, cpu, cuda or cuda-sim");
  batch.gpus = batch.device == "cuda" ? gpus : 0;
}

void write_atomically(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

// Shows the hints a grading may show, then records the failures and the hints; a record that can't be
// read or written is said on stderr and costs nothing else.
void hints_for(grader::Grade& g, const std::string& record_path, grader::HintPolicy policy) {
  grader::HintRecord r = grader::HintRecord::load(record_path);
  if (!r.unreadable.empty()) std::cerr << "distlab: " << r.unreadable << "\n";
  grader::apply_hints(g, r, policy);
  try {
    r.save();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("distlab: could not record the hints shown in {}: {}\n", record_path, e.what());
  }
}

grader::Grade grade_folder(const grader::Paths& p, const grader::Lab& lab, const std::string& src, const std::string& who,
                           const std::string& plugin, const SandboxSupport& sb, grader::SharedResults& shared, bool quiet) {
  grader::Grade g;
  g.student = who;
  g.lab = lab;
  g.device = shared.device;
  if (!quiet) std::cout << fmt::format("building {} from {} ...\n", lab.name, src) << std::flush;
  grader::BuildResult b = grader::build_plugin(p, lab, src, plugin, sb);
  g.built = b.ok;
  g.build_log = b.log;
  if (b.ok) {
    if (!quiet) std::cout << fmt::format("running {} checks ({})\n", lab.checks.size(), sb.describe()) << std::flush;
    g.checks = grader::run_checks(p, lab, b.plugin, sb, shared);
  }
  return g;
}

// A feedback file's name from a submission's folder name: letters, digits, '.', '_' and '-' kept, anything
// else '_', at most 80 characters; a name that had to change, or that another folder's name already took,
// gets a hash of the whole folder name, so that no two students share a file and none is too long.
std::string feedback_name(const std::string& student, std::set<std::string>& taken) {
  std::string base;
  for (char c : student) base += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
  if (base.empty() || base[0] == '.') base = "_" + base;
  bool changed = base != student;
  if (base.size() > 80) {
    base.resize(80);
    changed = true;
  }
  std::string name = base;
  for (uint64_t salt = 0; changed || taken.count(name); salt++, changed = false)
    name = fmt::format("{}-{:08x}", base, uint32_t(std::hash<std::string>{}(student + std::string(salt, '+'))));
  taken.insert(name);
  return name;
}

std::vector<fs::path> submission_entries(const std::string& dir) {
  if (!fs::is_directory(dir)) throw ConfigError("--submissions " + dir + " is not a folder", "give a folder with one subfolder per student");
  std::vector<fs::path> dirs;
  for (const auto& d : fs::directory_iterator(dir)) dirs.push_back(d.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

grader::Grade grade_submission(const grader::Paths& p, const grader::Lab& l, const fs::path& d, const grader::SharedResults& batch,
                               const SandboxSupport& sb) {
  grader::Grade g;
  g.student = d.filename().string();
  g.lab = l;
  g.seed = batch.seed;
  g.device = batch.device;
  std::error_code ec;
  const auto st = fs::symlink_status(d, ec);
  if (ec || fs::is_symlink(st) || !fs::is_directory(st)) {
    g.build_log = fmt::format("{}: not graded: {}", d.string(),
                              ec ? ec.message() : fs::is_symlink(st) ? "a symbolic link, not a folder (links are refused at any depth)"
                                                                     : "not a folder (a submission is a folder holding the lab's files)");
    return g;
  }
  std::string tmpl;  // each plugin in a folder of its own, gone after its grading
  try {
    grader::SharedResults shared = batch.next_student();  // this student's own results, the batch's references
    tmpl = grader::make_scratch_dir(p, "plugin");
    g = grade_folder(p, l, d.string(), g.student, tmpl + "/plugin.so", sb, shared, true);
  } catch (const std::exception& e) {  // the grader's own failure on this folder: recorded, the batch goes on
    g.student = d.filename().string();
    g.lab = l;
    g.built = false;
    g.checks.clear();
    g.build_log = std::string("grading failed: ") + e.what();
  }
  g.seed = batch.seed;
  if (!tmpl.empty()) fs::remove_all(tmpl, ec);
  return g;
}

void write_feedback(grader::Grade& g, const fs::path& feedback, const std::string& name, grader::HintPolicy policy) {
  try {
    hints_for(g, (feedback / (name + ".hints.json")).string(), policy);  // this student's earlier gradings into this folder
    write_atomically((feedback / (name + ".txt")).string(), grader::table(g));
  } catch (const std::exception& e) {
    std::cerr << fmt::format("distlab: could not write {}'s feedback: {}\n", sanitize_output(g.student, 200), e.what());
  }
}

// `--submissions DIR`: every subfolder built and graded on its own; a CSV row and a feedback file each. An
// entry that is not a folder (a file, a link) gets a row that says why; whatever goes wrong in one
// student's grading becomes that student's error row, never the batch's end.
int grade_submissions(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb) {
  if (!fs::is_directory(a.submissions))
    throw ConfigError("--submissions " + a.submissions + " is not a folder", "give a folder with one subfolder per student");
  if (!a.junit.empty() || !a.html.empty())
    throw ConfigError("--junit and --html write one student's report: with --submissions, use --csv, --json and the feedback folder",
                      "or grade one student's folder at a time with --junit/--html");
  const std::vector<fs::path> dirs = submission_entries(a.submissions);
  // --check: a folder of its own unless --feedback names one, so a regrade never replaces the whole grading's feedback
  const std::string fb_name = l.partial ? "feedback-check" : "feedback";
  const fs::path feedback = !a.feedback.empty() ? fs::path(a.feedback)
                            : !a.csv.empty()    ? fs::absolute(a.csv).parent_path() / fb_name
                                                : fs::path(a.submissions).parent_path() / (fs::path(a.submissions).filename().string() + "-" + fb_name);
  fs::create_directories(feedback);
  std::cout << sb.describe() << "\nfeedback for each student: " << feedback.string() << "/\n";
  if (l.partial)
    std::cout << fmt::format("--check: {} of the lab's checks, {} of its points: the CSV's and the feedback's points, max and percent are "
                             "theirs, not the lab's (the CSV's lab column says so)\n",
                             l.checks.size(), l.max_points());
  std::set<std::string> taken;
  std::vector<std::string> fb_names;  // decided in the folders' order, whatever order they finish in
  for (const auto& d : dirs) fb_names.push_back(feedback_name(d.filename().string(), taken));
  grader::SharedResults batch;  // the references, computed once for the batch (the first grading to need one)
  if (a.seed) batch.seed = *a.seed;
  batch.load = std::max(1.0, 2.0 * a.jobs / std::max(1u, std::thread::hardware_concurrency()));
  batch.jobs = a.jobs;
  set_grading_device(batch, a.device);
  batch.measure_speedup = a.measure_speedup;
  const grader::HintPolicy policy = *parse_choice<grader::HintPolicy>(a.hints);
  std::vector<grader::Grade> grades(dirs.size());
  // --jobs N: N students at once, each taking the next folder; every line printed as its grading ends
  std::atomic<size_t> next{0};
  std::mutex print;
  auto worker = [&] {
    for (size_t i; (i = next++) < dirs.size();) {
      try {
        grades[i] = grade_submission(p, l, dirs[i], batch, sb);
        write_feedback(grades[i], feedback, fb_names[i], policy);
      } catch (const std::exception& e) {  // whatever escapes (memory): that student's row says so, the batch goes on
        grades[i].student = dirs[i].filename().string();
        grades[i].lab = l;
        grades[i].built = false;
        grades[i].checks.clear();
        grades[i].build_log = std::string("grading failed: ") + e.what();
      }
      const grader::Grade& g = grades[i];
      std::lock_guard<std::mutex> lk(print);
      std::cout << fmt::format("{:<24} {:>3}/{}{}\n", sanitize_output(g.student, 200), g.points(), l.max_points(),
                               g.built ? "" : "  (" + grader::not_run_reason(g) + ")")
                << std::flush;
    }
  };
  std::vector<std::thread> workers;
  for (int k = 1; k < a.jobs && size_t(k) < dirs.size(); k++) workers.emplace_back(worker);
  worker();
  for (auto& t : workers) t.join();
  // submissions that look copied: listed for the instructor to look at, never a grade's business
  std::vector<std::pair<std::string, std::string>> texts;
  for (const auto& d : dirs) {
    std::string all;
    for (const auto& f : l.files) {
      std::error_code ec;
      const fs::path file = d / f;
      if (!fs::is_regular_file(fs::symlink_status(file, ec)) || fs::file_size(file, ec) > (1u << 20)) continue;
      std::ifstream in(file, std::ios::binary);
      all += std::string(std::istreambuf_iterator<char>(in), {}) + "\n";
    }
    texts.emplace_back(d.filename().string(), all);
  }
  std::string skeleton;
  for (const auto& f : l.files) {
    std::ifstream in(fs::path(l.dir) / "student" / f, std::ios::binary);
    skeleton += std::string(std::istreambuf_iterator<char>(in), {}) + "\n";
  }
  const auto copies = grader::similar_submissions(texts, skeleton);
  if (!copies.empty()) {
    std::cout << fmt::format("{} pair(s) of submissions look copied (comments, spacing and names normalized; the skeleton left out):\n",
                             copies.size());
    for (const auto& c : copies)
      std::cout << fmt::format("  {} and {}: {}\n", sanitize_output(c.a, 200), sanitize_output(c.b, 200),
                               c.identical ? "identical" : fmt::format("{:.0f} % of their 8-token runs in common", 100 * c.share));
  }
  const grader::Roster roster = a.roster.empty() ? grader::Roster{} : grader::read_roster(a.roster);
  if (!a.roster.empty())
    for (const auto& d : dirs)
      if (!roster.count(d.filename().string()))
        std::cout << fmt::format("not on the roster: {} (its row has no id)\n", sanitize_output(d.filename().string(), 200));
  const grader::BatchInfo info = grader::batch_info(p, l, a.roster.empty() ? nullptr : &roster);
  if (!a.csv.empty()) write_atomically(a.csv, grader::gradebook_csv(grades, info));
  if (!a.json.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& g : grades) {
      nlohmann::json j = grader::to_json(g);
      if (auto it = roster.find(g.student); it != roster.end()) j["roster"] = {{"id", it->second.id}, {"name", it->second.name}, {"email", it->second.email}};
      j["lab_version"] = info.lab_version;
      j["grader_version"] = info.grader_version;
      j["date"] = info.date;
      all.push_back(j);
    }
    write_atomically(a.json, all.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  return 0;
}

}  // namespace distlab
