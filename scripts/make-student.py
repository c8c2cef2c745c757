#!/usr/bin/env python3
"""Writes a lab's student files from its solution: every `/// BEGIN SOLUTION ... /// END SOLUTION` region
becomes a stub that fails with the task's name, and a `/// BEGIN SOLUTION ONLY ... /// END SOLUTION ONLY`
region (a helper whose shape is part of the answer) is left out. One source, two views (needle's convention).
  scripts/make-student.py            regenerate every lab
  scripts/make-student.py --check    exit 1 if a student file is out of date"""
import pathlib, re, sys

root = pathlib.Path(__file__).resolve().parent.parent
only = re.compile(r"^[ \t]*/// BEGIN SOLUTION ONLY\n.*?^[ \t]*/// END SOLUTION ONLY\n\n?", re.S | re.M)
pattern = re.compile(r"^([ \t]*)/// BEGIN SOLUTION[ \t]*(.*?)\n.*?^[ \t]*/// END SOLUTION\n", re.S | re.M)
stale = []
for sol_dir in sorted((root / "solutions").glob("*-*")):
    lab = next((root / "labs").glob(sol_dir.name.split("-")[0] + "-*"))
    for src in sorted(sol_dir.glob("*.cpp")):
        text = only.sub("", src.read_text())
        def stub(m, counter=[0]):
            counter[0] += 1
            func = re.findall(r"\n\w[^\n;{]*\b(\w+)\([^)]*\)[^;{]*\{[^{}]*$", text[:m.start()])
            name = m.group(2).strip() or (func[-1] if func else f"task {counter[0]}")
            ind = m.group(1)
            return (f"{ind}// TODO({lab.name}): implement {name}. Read labs/{lab.name}/README.md.\n"
                    f"{ind}throw std::logic_error(\"{lab.name}: {name} is not implemented yet: \"\n"
                    f"{ind}                       \"fill in the TODO in labs/{lab.name}/student/{src.name}\");\n")
        student = pattern.sub(stub, text)
        student = student.replace('#include "labs/', '#include <stdexcept>\n\n#include "labs/', 1)
        dst = lab / "student" / src.name
        if "--check" in sys.argv:
            if not dst.exists() or dst.read_text() != student:
                stale.append(str(dst))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(student)
            print("wrote", dst.relative_to(root))
if stale:
    print("out of date (run scripts/make-student.py):", *stale)
    sys.exit(1)
