#!/usr/bin/env bash
# Configures and builds distlab into build/ (Release). Extra arguments go to cmake --build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "${DISTLAB_JOBS:-2}" "$@"
