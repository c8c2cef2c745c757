#pragma once
// Gradescope's autograder (https://gradescope-autograders.readthedocs.io): `distlab grade NN --gradescope`
// grades /autograder/submission and writes /autograder/results/results.json; `--gradescope-bundle DIR`
// writes the setup.sh and run_autograder an assignment's autograder zip holds, with this source beside them.
#include <string>

#include "cli/grade_batch.h"
#include "grader/hints.h"

namespace distlab {

// Grades ROOT/submission (the lab's files at its top or in one folder below) and writes
// ROOT/results/results.json; 0 once the results are written, whatever the score (Gradescope reads a non-zero
// exit as the autograder's own failure).
int grade_for_gradescope(const grader::Paths& p, const grader::Lab& l, const std::string& root, const SandboxSupport& sb,
                         grader::HintPolicy hints);
void write_gradescope_bundle(const grader::Paths& p, const grader::Lab& l, const std::string& dir);

}  // namespace distlab
