// When a grading shows a check's hint, and what it remembers about it. A first failure shows what the check
// wanted and what it measured; the hint (grader/labs/<lab>/hints.toml, or the one the check wrote from what it
// saw) comes once the same check has failed in an earlier grading of the same student, or when the student
// asks for it (`distlab lab hint NN CHECK`). Every hint shown is recorded, and the report lists them, so an
// instructor sees which hints a grade needed. The engine's own answer (Lab::engine) comes with full marks.
//
// Where the record lives: build/labs/NN-name/hints.json for a student's own `distlab grade NN`, and
// <feedback>/<student>.hints.json beside each student's feedback file for `--submissions`.
#pragma once
#include <map>
#include <set>
#include <string>

#include "core/util/choice.h"
#include "grader/report.h"

namespace distlab::grader {

enum class HintPolicy { after_failure, always, never };
}  // namespace distlab::grader

template <>
struct distlab::ChoiceTable<distlab::grader::HintPolicy> {
  using P = distlab::grader::HintPolicy;
  static constexpr std::array names = {choice(P::after_failure, "after-failure"), choice(P::always, "always"), choice(P::never, "never")};
};

namespace distlab::grader {

struct HintRecord {
  std::set<std::string> failed;              // checks that failed in a grading so far
  std::map<std::string, std::string> shown;  // check -> how its hint was first shown ("after a failure", "asked", ...)
  std::string path;                          // the file it was read from and is saved to
  std::string unreadable;                    // the file exists but is not a record: why (it is then never overwritten)

  static HintRecord load(const std::string& path);  // a missing file is an empty record
  void save() const;                                // atomically; nothing when unreadable is set
};

// For each failed check of `g`: shows its hint (policy always, or after_failure with the check in
// r.failed) or holds it back (CheckOutcome::hint_held); then adds g's failed checks to r.failed and the
// hints shown to r.shown, and copies r.shown into g.hints_shown for the report.
void apply_hints(Grade& g, HintRecord& r, HintPolicy policy);

}  // namespace distlab::grader
