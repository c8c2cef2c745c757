#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs on a GPU machine that lacks this project's Debian packages (a lent
# device machine has the CUDA toolkit but no Gloo, OpenBLAS, fmt or toml++, and cannot fetch them): the
# CUDA build's programs and engine library, and every shared library they load that is neither the C/C++
# runtime nor CUDA's own (cudart, cuBLAS and NCCL come from the GPU machine, which must have CUDA 13).
# Run it here, on a machine with the toolkit; it writes .gpubundle/bundle.tar.xz (git-ignored), which
# gpu_check.sh unpacks and runs instead of building.
#   bash bench/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DISTLAB_CUDA=${DISTLAB_CUDA:-TOOLKIT} bash scripts/build.sh >/dev/null
[ -x build/tests/distlab_cuda_tests ] || {
  echo "gpu_bundle: build/ has no CUDA (no toolkit here, or DISTLAB_CUDA=OFF; TOOLKIT builds it without a GPU): nothing to pack" >&2
  exit 1
}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
progs=(build/bin/distlab build/bin/distlab-labhost build/bin/bench_gemm_cuda build/tests/distlab_cuda_tests)
cp "${progs[@]}" "$stage/bin/"
cp -L build/lib/libdistlab_core.so "$stage/lib/"
# every library the programs load, less the C/C++ runtime (the GPU machine's is newer) and CUDA's own
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libnccl|libdistlab_core)'
for p in "${progs[@]}"; do
  ldd "$p" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
done
{
  echo "distlab GPU bundle, $(git rev-parse --short HEAD) $(date -u +%FT%TZ)"
  echo "GPU code for: $(grep -o 'code=\[compute_[0-9]*,sm_[0-9]*\]' build/compile_commands.json | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')"
  ls "$stage/bin" "$stage/lib"
} > "$stage/MANIFEST"
mkdir -p .gpubundle
tar -C "$stage" -cJf .gpubundle/bundle.tar.xz.partial . && mv .gpubundle/bundle.tar.xz.partial .gpubundle/bundle.tar.xz
echo "wrote .gpubundle/bundle.tar.xz ($(du -h .gpubundle/bundle.tar.xz | cut -f1)): carry .gpubundle to the GPU machine and run bash bench/gpu_check.sh"
