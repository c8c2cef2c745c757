#!/usr/bin/env python3
"""Writes lab 08's cases from the earlier labs' solutions: each case is one solution file with one seeded bug
(labs/08-clinic/student/<case>/<file>, what the student diagnoses and fixes) and the file as it should be
(solutions/08-clinic/<case>/<file>). One source for both, so a fix to a solution reaches the clinic.
  scripts/make-clinic.py            regenerate
  scripts/make-clinic.py --check    exit 1 if a case file is out of date"""
import pathlib, sys

root = pathlib.Path(__file__).resolve().parent.parent
WARMUP = "const int warmup = std::min(stages - stage - 1, micro_batches);"
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
    "pipeline_warmup": ("06-tp-pp/tp_pp.cpp", [(WARMUP, "const int warmup = std::min(stage, micro_batches);")]),
}

stale = []
for case, (source, edits) in CASES.items():
    lab_name, file = source.split("/")
    good = (root / "solutions" / lab_name / file).read_text()
    bad = good
    for before, after in edits:
        if bad.count(before) != 1:
            sys.exit(f"make-clinic: case {case}: the solution {source} no longer holds exactly one of:\n{before}")
        bad = bad.replace(before, after)
    for path, text in ((root / "labs/08-clinic/student" / case / file, bad), (root / "solutions/08-clinic" / case / file, good)):
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
