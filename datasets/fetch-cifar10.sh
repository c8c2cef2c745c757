#!/usr/bin/env bash
# On a machine with internet access: downloads CIFAR-10 (binary version), checks it, unpacks it into DIR.
set -euo pipefail
dest="${1:?usage: fetch-cifar10.sh DIR}"
url="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
md5="c32a1d4ab5d03f1284b67883e8d87530"  # published on the data set's page
mkdir -p "$dest"
tgz="$dest/cifar-10-binary.tar.gz"
[ -f "$tgz" ] || curl -fL -o "$tgz" "$url"
echo "$md5  $tgz" | md5sum -c -
tar -xzf "$tgz" -C "$dest"
bash "$(dirname "$0")/check-cifar10.sh" "$dest/cifar-10-batches-bin"
echo "export DISTLAB_DATA=$dest   # then: distlab train configs/cifar-cnn.toml"
