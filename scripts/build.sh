#!/usr/bin/env bash
# Configures and builds distlab into build/ (Release). Extra arguments go to cmake --build (a target:
# `scripts/build.sh --target distlab` builds the CLI and what it needs, not the tests and benchmarks).
# DISTLAB_CUDA=AUTO|TOOLKIT|ON|OFF in the environment chooses whether the CUDA kernels are built
# (CMakeLists.txt; default AUTO: where a GPU and the toolkit are). DISTLAB_UNITY=OFF on a first configure
# compiles file by file (slower from scratch, faster to rebuild after editing one file).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_now=$(sed -n 's/^DISTLAB_CUDA:STRING=//p' build/CMakeCache.txt 2>/dev/null || true)
if [ ! -f build/build.ninja ] || { [ -n "${DISTLAB_CUDA:-}" ] && [ "$DISTLAB_CUDA" != "$cuda_now" ]; }; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${DISTLAB_CUDA:+-DDISTLAB_CUDA=$DISTLAB_CUDA} \
    ${DISTLAB_UNITY:+-DDISTLAB_UNITY=$DISTLAB_UNITY}
fi
cmake --build build -j "${DISTLAB_JOBS:-2}" "$@"
