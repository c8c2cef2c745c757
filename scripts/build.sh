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
# `distlab` on PATH, as pip and cargo put their commands: a link in /usr/local/bin (root), else in
# ~/.local/bin, to this build. A file there that is not a link (another install) is left alone, and said.
# DISTLAB_NO_LINK=1 skips it.
if [ -x build/bin/distlab ] && [ "${DISTLAB_NO_LINK:-0}" != 1 ]; then
  if [ "$(id -u)" -eq 0 ]; then bindir=/usr/local/bin; else bindir="$HOME/.local/bin"; fi
  target="$(pwd)/build/bin/distlab"
  if [ -e "$bindir/distlab" ] && [ ! -L "$bindir/distlab" ]; then
    echo "build: $bindir/distlab is another program (not a link): left as it is; run $target"
  elif [ "$(readlink "$bindir/distlab" 2>/dev/null)" != "$target" ]; then
    if mkdir -p "$bindir" 2>/dev/null && ln -sfn "$target" "$bindir/distlab" 2>/dev/null; then
      echo "build: distlab is on PATH: $bindir/distlab -> $target"
      case ":$PATH:" in *":$bindir:"*) ;; *) echo "build: add $bindir to PATH (export PATH=\"$bindir:\$PATH\")";; esac
    else
      echo "build: could not link $bindir/distlab: run $target"
    fi
  fi
fi
