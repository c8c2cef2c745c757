// Metrics as JSON Lines: {"kind":"step",...} per optimizer step, {"kind":"eval",...}, and a final
// {"kind":"summary",...}. Written to "<file>.partial" and renamed to <file> only when the run finishes,
// so a failed run never leaves a file that looks complete (nor clobbers an earlier one); the .partial
// file ends with {"kind":"error",...} saying why. A run resumed from a checkpoint continues the file of
// the run that saved it (continue_from).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/util/atomic_file.h"
#include "core/tensor/memory.h"

namespace distlab {

class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);  // "" = discard everything; nothing is opened before the first record
  // A resumed run: the records of the run that saved the checkpoint at `step` (read from <file>.partial,
  // or <file> when that run had finished) up to that step come first; its later records, its error and
  // summary are dropped, so no step appears twice or goes missing. Returns how many records it kept.
  int64_t continue_from(int64_t step);
  void write(const nlohmann::json& record);
  void sync();                                      // on disk now (before a checkpoint that counts on it)
  void finish();                                    // renames into place
  void fail(const std::string& message);            // appends an error record; keeps the .partial
  bool enabled() const { return !path_.empty(); }

 private:
  void open();
  std::string path_;
  std::unique_ptr<AtomicFile> file_;
};

// {"params": bytes, "grads": ..., ...} of the current or peak bytes.
nlohmann::json memory_json(const std::array<int64_t, kNumCategories>& bytes);

}  // namespace distlab
