#!/usr/bin/env bash
# Verifies a CIFAR-10 binary folder: six files of 10,000 records of 3073 bytes, labels 0..9.
set -euo pipefail
dir="${1:?usage: check-cifar10.sh DIR (the cifar-10-batches-bin folder)}"
status=0
for f in data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin; do
  p="$dir/$f"
  if [ ! -f "$p" ]; then echo "missing: $p"; status=1; continue; fi
  size=$(stat -c %s "$p")
  if [ "$size" -ne 30730000 ]; then echo "wrong size: $p is $size bytes, expected 30730000"; status=1; continue; fi
  bad=$(od -An -v -tu1 -w3073 "$p" | awk '$1 > 9 {n++} END {print n+0}')
  if [ "$bad" -ne 0 ]; then echo "corrupt: $p has $bad records with a label above 9"; status=1; continue; fi
  echo "ok: $p (10000 records)"
done
exit $status
