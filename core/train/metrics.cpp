#include "core/train/metrics.h"

#include <filesystem>
#include <fstream>

#include "core/util/error.h"

namespace distlab {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {}

void MetricsWriter::open() {
  if (!file_ && !path_.empty()) file_ = std::make_unique<AtomicFile>(path_);
}

int64_t MetricsWriter::continue_from(int64_t step) {
  if (path_.empty()) return 0;
  const std::string partial = path_ + ".partial";
  const std::string source = std::filesystem::exists(partial) ? partial : path_;
  std::vector<std::string> kept;
  std::ifstream in(source);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      continue;  // a line torn by a kill
    }
    if (!j.is_object()) continue;
    const std::string kind = j.value("kind", "");
    const int64_t s = j.contains("step") && j["step"].is_number_integer() ? j["step"].get<int64_t>() : -1;
    if ((kind == "step" || kind == "eval" || kind == "resume" || kind == "checkpoint") && s >= 0 && s <= step) kept.push_back(line);
  }
  in.close();
  open();  // truncates the .partial we just read: its records are in `kept`, written back at once
  for (const auto& line : kept) file_->write(line + "\n");
  file_->sync();
  return int64_t(kept.size());
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  open();
  file_->write(record.dump() + "\n");
  file_->flush();
}

void MetricsWriter::sync() {
  if (file_) file_->sync();
}

void MetricsWriter::finish() {
  if (path_.empty()) return;
  open();
  file_->commit();
}

void MetricsWriter::fail(const std::string& message) {
  if (path_.empty()) return;
  const nlohmann::json rec = {{"kind", "error"}, {"message", message}};
  // a run that failed before its first record: an earlier run's .partial (an interrupted run a resume
  // continues) is kept, the error appended; else a .partial holds the error alone
  if (!file_ && std::filesystem::exists(path_ + ".partial")) {
    std::ofstream(path_ + ".partial", std::ios::app) << rec.dump() << "\n";
    return;
  }
  try {
    write(rec);
  } catch (const Error&) {  // the metrics file itself is what failed: the run's own error says so
  }
}

nlohmann::json memory_json(const std::array<int64_t, kNumCategories>& bytes) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumCategories; i++) j[category_name(Category(i))] = bytes[size_t(i)];
  return j;
}

}  // namespace distlab
