#!/usr/bin/env bash
# Sets up, builds and runs every test through ctest. The CUDA kernels are compiled wherever the toolkit
# is, GPU or not (their tests skip without one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
DISTLAB_CUDA=${DISTLAB_CUDA:-TOOLKIT} scripts/build.sh
# -j 4 on two cores: a grading test takes two slots (tests/CMakeLists.txt), so two gradings run side by side
# as they always did, and after them four of the other tests, some of which mostly wait out a timeout
cd build && ctest --output-on-failure --timeout 600 -j 4 "$@"
