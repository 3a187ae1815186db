#!/usr/bin/env bash
# Packs what `python -m benchmarks.gpu_check` needs on a GPU machine without
# network: the Python 3.12 manylinux wheels of the [gpu] extra (and their
# dependencies), and the paper's pytorch/ folder if REFERENCE_DIR is set, as
# one tar split into pieces that each fit one device call. See README.md here.
#
#   benchmarks/device/pack_wheels.sh [OUT_DIR]        # default build/gpu_wheels
#   DRY_RUN=1 benchmarks/device/pack_wheels.sh        # resolve only: list, no download
#
# Environment:
#   SKIP          package names to leave out (the lent machine has them), e.g.
#                 "numpy nvidia-nccl-cu12"
#   REFERENCE_DIR the pytorch/ folder of kimiyoung/transformer-xl (the pairs)
#   PIECE_BYTES   bytes per piece (default 56000000: a piece and the working
#                 tree fit a call's 64 MiB)
#   PIP           the pip command (default: python3 -m pip)
#   REQUIREMENT   what to pack (default: ".[gpu]", this checkout with the extra)
set -euo pipefail

OUT=${1:-build/gpu_wheels}
PIP=${PIP:-python3 -m pip}
REQUIREMENT=${REQUIREMENT:-.[gpu]}
PIECE_BYTES=${PIECE_BYTES:-56000000}
TARGET=(--python-version 3.12 --implementation cp --only-binary=:all:
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64)

mkdir -p "$OUT"
if [ -n "${DRY_RUN:-}" ]; then
  $PIP install --dry-run --ignore-installed --quiet --report "$OUT/report.json" \
    --target "$OUT/dry-run-target" "${TARGET[@]}" "$REQUIREMENT" pytest
  python3 - "$OUT/report.json" <<'EOF'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"], item["metadata"]["version"])
EOF
  exit 0
fi

rm -rf "$OUT/wheels" "$OUT"/gpu_wheels.tar*
mkdir -p "$OUT/wheels"
# pytest: the check's serving_device_tests part runs the device tests on CUDA
$PIP download --dest "$OUT/wheels" "${TARGET[@]}" "$REQUIREMENT" pytest
# the checkout itself travels as the working tree, not as a wheel
rm -f "$OUT"/wheels/txl_tf-* "$OUT"/wheels/txl-tf-*
for name in ${SKIP:-}; do
  pattern=$(echo "$name" | tr '-' '_')
  rm -fv "$OUT"/wheels/"$pattern"-[0-9]*.whl
done

contents=(wheels)
if [ -n "${REFERENCE_DIR:-}" ]; then
  if [ ! -f "$REFERENCE_DIR/mem_transformer.py" ]; then
    echo "error: REFERENCE_DIR=$REFERENCE_DIR has no mem_transformer.py" >&2
    exit 2
  fi
  rm -rf "$OUT/reference" && mkdir -p "$OUT/reference"
  cp -r "$REFERENCE_DIR" "$OUT/reference/pytorch"
  contents+=(reference)
fi
tar -cf "$OUT/gpu_wheels.tar" -C "$OUT" "${contents[@]}"
split -b "$PIECE_BYTES" -d -a 2 "$OUT/gpu_wheels.tar" "$OUT/gpu_wheels.tar.part-"
rm "$OUT/gpu_wheels.tar"
(cd "$OUT" && sha256sum gpu_wheels.tar.part-* > gpu_wheels.sha256)
count=$(ls "$OUT"/gpu_wheels.tar.part-* | wc -l)
echo "packed $(ls "$OUT"/wheels | wc -l) wheels into $count pieces of <= $PIECE_BYTES bytes in $OUT"
