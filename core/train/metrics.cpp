#include "core/train/metrics.h"

#include "core/util/error.h"

namespace distlab {

MetricsWriter::MetricsWriter(const std::string& path) {
  if (!path.empty()) file_ = std::make_unique<AtomicFile>(path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!file_) return;
  file_->write(record.dump() + "\n");
  file_->flush();
}

void MetricsWriter::finish() {
  if (file_) file_->commit();
}

void MetricsWriter::fail(const std::string& message) {
  if (!file_) return;
  try {
    write({{"kind", "error"}, {"message", message}});
  } catch (const Error&) {  // the metrics file itself is what failed: the run's own error says so
  }
}

nlohmann::json memory_json(const std::array<int64_t, kNumCategories>& bytes) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumCategories; i++) j[category_name(Category(i))] = bytes[size_t(i)];
  return j;
}

}  // namespace distlab
