#!/usr/bin/env bash
# Packs what `python -m benchmarks.gpu_check` needs on a GPU machine without
# network: the Python 3.12 manylinux wheels of the [gpu] extra (and their
# dependencies), and the paper's pytorch/ folder if REFERENCE_DIR is set, as
# two tars, `base` (all but the CUDA 12 wheels: what the serving parts need)
# and `cuda` (the CUDA 12 wheels), each split into pieces that each fit one
# device call (base.tar.part-00 ..., cuda.tar.part-00 ...). The wheels travel
# unzipped and recompressed with xz (sitepack.py: independent streams that
# the GPU machine's Python decompresses on all its cores). See README.md here.
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
#   DROP          fnmatch patterns of paths in the wheels to leave out; default
#                 what no part of the check loads: TensorFlow's C++ headers (for
#                 building custom ops) and cuSOLVER's multi-GPU library (no
#                 library of the set needs it; TensorFlow loads libcusolver only).
#                 DROP= keeps every file.
#   STREAM_BYTES  raw bytes per xz stream (default 64 MiB; see sitepack.py)
#   PIP           the pip command (default: python3 -m pip)
#   REQUIREMENT   what to pack (default: ".[gpu]", this checkout with the extra)
set -euo pipefail

OUT=${1:-build/gpu_wheels}
PIP=${PIP:-python3 -m pip}
REQUIREMENT=${REQUIREMENT:-.[gpu]}
PIECE_BYTES=${PIECE_BYTES:-56000000}
DROP=${DROP-"tensorflow/include/* nvidia/cusolver/lib/libcusolverMg.so*"}
STREAM_BYTES=${STREAM_BYTES:-67108864}
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

rm -rf "$OUT/wheels" "$OUT/sets" "$OUT"/*.tar.part-* "$OUT/gpu_wheels.sha256"
mkdir -p "$OUT/wheels"
# pytest: the check's serving_device_tests part runs the device tests on CUDA
$PIP download --dest "$OUT/wheels" "${TARGET[@]}" "$REQUIREMENT" pytest
# the checkout itself travels as the working tree, not as a wheel
rm -f "$OUT"/wheels/txl_tf-* "$OUT"/wheels/txl-tf-*
for name in ${SKIP:-}; do
  pattern=$(echo "$name" | tr '-' '_')
  rm -fv "$OUT"/wheels/"$pattern"-[0-9]*.whl
done

if [ -n "${REFERENCE_DIR:-}" ] && [ ! -f "$REFERENCE_DIR/mem_transformer.py" ]; then
  echo "error: REFERENCE_DIR=$REFERENCE_DIR has no mem_transformer.py" >&2
  exit 2
fi
# Two sets, each its own tar and pieces: `base` (TensorFlow, onnxruntime-gpu, the rest, and
# the paper's code) and `cuda` (the CUDA 12 wheels: TensorFlow's GPU and XLA's ptxas). The
# serving parts need base alone (onnxruntime-gpu uses the machine's own CUDA libraries;
# TensorFlow runs on the CPU there): a session can carry base, run them, then carry cuda.
rm -rf "$OUT/sets" && mkdir -p "$OUT/sets/base" "$OUT/sets/cuda"
wheels=$(cd "$OUT/wheels" && pwd)
for wheel in "$wheels"/*.whl; do
  case "$(basename "$wheel")" in
    nvidia_*_cu12-*) ln -s "$wheel" "$OUT/sets/cuda/" ;;
    *) ln -s "$wheel" "$OUT/sets/base/" ;;
  esac
done
drop=()
set -f  # the patterns stay patterns
for pattern in $DROP; do drop+=(--drop="$pattern"); done
set +f
for set in base cuda; do
  if [ -z "$(ls "$OUT/sets/$set")" ]; then continue; fi  # SKIP left it empty
  # the set's files, recompressed as xz streams, with $set/site.json to unpack them
  python3 "$(dirname "${BASH_SOURCE[0]}")/sitepack.py" pack "$OUT/sets/$set" "$OUT/$set" \
      --stream_bytes="$STREAM_BYTES" "${drop[@]}"
  contents=("$set")
  if [ "$set" = base ] && [ -n "${REFERENCE_DIR:-}" ]; then
    rm -rf "$OUT/reference" && mkdir -p "$OUT/reference"
    cp -r "$REFERENCE_DIR" "$OUT/reference/pytorch"
    contents+=(reference)
  fi
  tar -cf - -C "$OUT" "${contents[@]}" | split -b "$PIECE_BYTES" -d -a 2 - "$OUT/$set.tar.part-"
  rm -rf "$OUT/$set" "$OUT/reference"  # in the pieces now
done
rm -rf "$OUT/sets"
(cd "$OUT" && sha256sum -- *.tar.part-* > gpu_wheels.sha256)
for set in base cuda; do
  count=$(find "$OUT" -maxdepth 1 -name "$set.tar.part-*" | wc -l)  # 0: SKIP left it empty
  echo "$set: $count pieces of <= $PIECE_BYTES bytes in $OUT ($set.tar.part-*)"
done
echo "($OUT/wheels stays here: only the pieces and gpu_wheels.sha256 travel)"
