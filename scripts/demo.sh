#!/usr/bin/env bash
# Sets up, builds, trains lab 02's reference solution (DDP on CIFAR-shaped data) on two CPU ranks, and
# grades it: the table explains every point.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target distlab  # the CLI and the lab host only: no tests, benchmarks or (without a GPU) CUDA kernels
bin=build/bin/distlab
$bin lab build 02 --solution
$bin run -n 2 --master-port 0 train labs/02-ddp-cifar/lab.toml --set lab.plugin=build/labs/02-ddp-cifar/solution.so
$bin grade 02 --solution
