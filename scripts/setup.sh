#!/usr/bin/env bash
# Installs the Debian packages distlab needs. Safe to run twice: installs only what is missing.
#   scripts/setup.sh           what building and running need
#   scripts/setup.sh --tests   and what the tests need too: Debian's PyTorch (python3-torch), the peer the
#                              parity tests compare with and the program `distlab run` must run unchanged,
#                              Chromium (headless: the HTML report's test), and Slurm with munge (the
#                              tests start a one-node cluster of their own: tests/slurm/cluster.sh)
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config zlib1g-dev libgloo-dev libopenblas-dev libfmt-dev libcli11-dev
      libtomlplusplus-dev nlohmann-json3-dev catch2 dataset-fashion-mnist bubblewrap)
if [ "${1:-}" = "--tests" ]; then pkgs+=(python3-torch chromium slurm-wlm munge); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
