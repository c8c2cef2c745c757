// A class graded on a Slurm cluster: one array task per student (or per --per-task students), each task's
// result written atomically into the grading's folder, merged afterwards.
//   distlab grade NN --submissions DIR --slurm [--results R] [--max-running M] [--wait]
//       writes R/manifest.json (the students in order, the batch's seed), R/grade.sbatch, and submits it:
//       sbatch --array=0-(T-1)%M R/grade.sbatch
//   (each task)  distlab grade NN --slurm-task R     grades its students as `--submissions` would, with the
//       same sandbox: R/rows/<i>.json and R/feedback/<name>.txt, each written to a temporary name and renamed
//   distlab grade merge R [--csv F] [--json F]
//       the gradebook (R/grades.csv, R/grades.json by default) from every row; a student whose task left no
//       valid row gets a row that says so, is named, and the command to grade them alone is printed.
// A task that fails, is killed or runs out of time loses its own students' rows and nobody else's.
// Read next: cli/grade_batch.h (one submission graded), grader/report.h (rows, the CSV).
#pragma once
#include <string>

#include "cli/grade_batch.h"

namespace distlab {

int submit_slurm_grading(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb);
int run_slurm_grading_task(const grader::Paths& p, const grader::Lab& l, const GradeArgs& a, const SandboxSupport& sb);
// Returns 0 when every student has a row, 1 when some are missing (named on stderr with the resubmit command).
int merge_slurm_grading(const grader::Paths& p, const std::string& results, const std::string& csv, const std::string& json);

}  // namespace distlab
