#!/usr/bin/env python3
"""Writes lab 08's cases: a code case is one earlier lab's solution file with one seeded bug
(labs/08-clinic/student/<case>/<file>, what the student diagnoses and fixes); its fixed file is that lab's
solution itself (`distlab grade 08 --solution` takes it from there), so a fix to a solution reaches the
clinic. A config case is the story's job (labs/08-clinic/cases/<case>.toml) as the student's run.toml, and
the fix applied to it as solutions/08-clinic/<case>/run.toml.
  scripts/make-clinic.py            regenerate
  scripts/make-clinic.py --check    exit 1 if a case file is out of date"""
import pathlib, sys

root = pathlib.Path(__file__).resolve().parent.parent
WARMUP = "const int warmup = std::min(p - s.stage() - 1, m), steady = m - warmup;"
LOOP = "  for (int micro = 0; micro < k; micro++) step.forward_backward(micro, s.scale / float(k));\n"
# case -> (the lab's solution file, [(what the solution says, what the bug says)])
CASES = {
    "no_sampler": ("02-ddp-cifar/ddp.cpp", [(
        "  for (int64_t i = rank; i < total; i += replicas) mine.push_back(order[size_t(i)]);",
        "  mine.assign(order.begin(), order.begin() + (n + replicas - 1) / replicas * replicas);")]),
    "no_set_epoch": ("02-ddp-cifar/ddp.cpp", [("seeded_permutation(n, seed + uint64_t(epoch))", "seeded_permutation(n, seed)")]),
    "sum_not_average": ("02-ddp-cifar/ddp.cpp", [("    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());\n", "")]),
    "fp16_no_scaler": ("03-amp-accum/amp.cpp", [("  s.scale = c.init_scale;", "  s.scale = 1.0f;")]),
    "accum_no_divide": ("03-amp-accum/amp.cpp", [("s.scale / float(k))", "s.scale)")]),
    "scheduler_per_micro_step": ("03-amp-accum/amp.cpp", [
        ("  step.scheduler_step();  // once per optimizer step, never per micro-batch\n", ""),
        (LOOP, "  for (int micro = 0; micro < k; micro++) {\n    step.forward_backward(micro, s.scale / float(k));\n"
               "    step.scheduler_step();\n  }\n")]),
    "skip_not_synchronised": ("03-amp-accum/amp.cpp", [("  comm.all_reduce(&found, 1, ReduceOp::max);\n", "")]),
    "pipeline_warmup": ("06-tp-pp/tp_pp.cpp", [(WARMUP, "const int warmup = std::min(s.stage(), m), steady = m - warmup;")]),
    "rank0_extra_collective": ("02-ddp-cifar/ddp.cpp", [(
        "    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());\n  }\n",
        "    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());\n  }\n"
        "  if (comm.rank() == 0) {  // log the global gradient norm (only rank 0 prints)\n"
        "    float squares = 0;\n"
        "    for (auto& g : grads)\n"
        "      for (int64_t i = 0; i < g.numel; i++) squares += g.data[i] * g.data[i];\n"
        "    comm.all_reduce(&squares, 1, ReduceOp::sum);\n"
        "  }\n")]),
    "every_rank_one_file": ("07-checkpoint/ckpt.cpp", [(
        "const std::string final_name = state_file(st.rank()), tmp = final_name + \".tmp\";",
        "const std::string final_name = state_file(0), tmp = final_name + \".tmp\";")]),
}

# config cases: the story's job (labs/08-clinic/cases/<case>.toml) is the student's file as is; the fix edits it
CONFIG_CASES = {
    "bn_without_syncbn": [("sync_batchnorm = false", "sync_batchnorm = true")],
    "lr_not_scaled": [("lr = 0.02", "lr = 0.04  # x2: the global batch doubled (the linear scaling rule)")],
    "pipeline_few_micro_batches": [("micro_batches = 4  # the whole batch in four micro-batches of 16: as many as stages",
                                    "micro_batches = 16  # (p - 1)/(m + p - 1) = 3/19: a 16 % bubble")],
    "nan_input": [("corrupt = [13159]  # the data set as it came to us (do not change: it is the story's data)",
                   "corrupt = [13159]  # the data set as it came to us (do not change: it is the story's data)\n"
                   "exclude = [13159]  # found with data.check_finite = true: record 13159 is all NaN")],
    "oom_ladder": [("micro_batch = 8\naccum_steps = 1", "micro_batch = 1\naccum_steps = 8"),
                   ('strategy = "ddp"', 'strategy = "zero2"')],
}


def apply(case, source, text, edits):
    for before, after in edits:
        if text.count(before) != 1:
            sys.exit(f"make-clinic: case {case}: {source} no longer holds exactly one of:\n{before}")
        text = text.replace(before, after)
    return text


stale = []
jobs = []
for case, (source, edits) in CASES.items():
    lab_name, file = source.split("/")
    good = (root / "solutions" / lab_name / file).read_text()
    jobs.append((case, file, apply(case, "the solution " + source, good, edits), None))
for case, edits in CONFIG_CASES.items():
    story = (root / "labs/08-clinic/cases" / (case + ".toml")).read_text()
    jobs.append((case, "run.toml", story, apply(case, f"cases/{case}.toml", story, edits)))
for case, file, bad, good in jobs:
    if good is None:  # a code case: no copy of the lab's solution under solutions/08-clinic
        copy = root / "solutions/08-clinic" / case / file
        if copy.exists():
            if "--check" in sys.argv:
                stale.append(str(copy.relative_to(root)) + " (a copy of a lab's solution: delete it)")
            else:
                copy.unlink()
                copy.parent.rmdir()
                print("removed", copy.relative_to(root))
        jobs_files = ((root / "labs/08-clinic/student" / case / file, bad),)
    else:
        jobs_files = ((root / "labs/08-clinic/student" / case / file, bad), (root / "solutions/08-clinic" / case / file, good))
    for path, text in jobs_files:
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(root)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print("wrote", path.relative_to(root))
if stale:
    print("out of date (run scripts/make-clinic.py):", *stale)
    sys.exit(1)
