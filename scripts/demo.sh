#!/usr/bin/env bash
# Sets up, builds and trains the Fashion-MNIST MLP on this machine, with a progress line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/bin/distlab train configs/fashion-mnist-mlp.toml
