// Metrics as JSON Lines: {"kind":"step",...} per optimizer step, {"kind":"eval",...}, and a final
// {"kind":"summary",...}. Written to "<file>.partial" and renamed to <file> only when the run finishes,
// so a failed run never leaves a file that looks complete (nor clobbers an earlier one); the .partial
// file ends with {"kind":"error",...} saying why.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/ckpt/atomic_file.h"
#include "core/tensor/memory.h"

namespace distlab {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // "" = discard everything
  void write(const nlohmann::json& record);
  void finish();                                    // renames into place
  void fail(const std::string& message);            // appends an error record; keeps the .partial
  bool enabled() const { return file_ != nullptr; }

 private:
  std::unique_ptr<AtomicFile> file_;
};

// {"params": bytes, "grads": ..., ...} of the current or peak bytes.
nlohmann::json memory_json(const std::array<int64_t, kNumCategories>& bytes);

}  // namespace distlab
