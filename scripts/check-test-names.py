#!/usr/bin/env python3
"""Fails when a Catch2 test's name holds a ';'. catch_discover_tests hands the names to CMake, which splits
lists at ';': the halves become two ctest entries that match no test, run nothing and pass. A test that
never runs proves nothing."""
import pathlib, re, sys

bad = [f"{p.name}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
       for p in sorted(pathlib.Path(__file__).resolve().parent.parent.glob("tests/*.cpp"))
       for text in [p.read_text()]
       for m in re.finditer(r'TEST_CASE\("[^"]*;[^"]*"', text)]
if bad:
    print("test names with ';' (ctest would split them and run nothing):", *bad, sep="\n  ")
    sys.exit(1)
