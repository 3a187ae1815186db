#!/usr/bin/env bash
# On the GPU machine, from the repository root: joins the pieces made by
# pack_wheels.sh, unpacks the wheels' files into one folder (once a set, with
# sitepack.py: Python's lzma, one xz stream a core), points Python,
# the loader and XLA at it, and runs the GPU check. With the base set's
# pieces alone the serving parts run (`--parts=serving`); the cuda set's
# pieces, carried later, are unpacked beside it (a set gpu_wheels.sha256
# lists more pieces of than PIECES holds waits for the rest). See README.md here.
#
#   benchmarks/device/run_check.sh [gpu_check flags...]
#   PREPARE_ONLY=1 benchmarks/device/run_check.sh     # unpack and print the environment
#
# Environment:
#   PIECES  where the pieces (base.tar.part-*, cuda.tar.part-*) are (default /tmp)
#   SITE    where the wheels' files are unpacked (default /tmp/txl_site)
#   OUT     where gpu_check.json and the parts' JSON go (on the device machine the
#           call's own $OUT, so they come back; else default /tmp/gpu_check)
#   PYTHON  the Python 3.12 interpreter (default python3); the paper's code
#           runs in it with its own packages (torch), without SITE
#   LIB_ORDER unset (or auto): the packed CUDA 12 libraries first in
#           LD_LIBRARY_PATH, as TensorFlow needs, and both lists exported
#           (TXL_PACKED_LIBS, TXL_MACHINE_LIBS): the check's probe gives the
#           parts that need onnxruntime-gpu the machine's own first where its
#           CUDA provider works only so. packed or machine: that order for
#           every part (the lists not exported; the check chooses nothing)
#   EXPORTS the serving exports made beforehand (gpu_check --make_serving_exports;
#           default build/gpu_exports of the checkout), passed as --serving_exports
#           where the folder exists
set -euo pipefail

PIECES=${PIECES:-/tmp}
SITE=${SITE:-/tmp/txl_site}
OUT=${OUT:-/tmp/gpu_check}
PYTHON=${PYTHON:-python3}
EXPORTS=${EXPORTS:-$PWD/build/gpu_exports}
UNPACKED=$(dirname "$SITE")/txl_unpacked

# The sets whose pieces are here (pack_wheels.sh: base, cuda), each unpacked once into SITE.
sets=()
for set in base cuda; do
  if compgen -G "$PIECES/$set.tar.part-*" > /dev/null; then sets+=("$set"); fi
done
if [ ${#sets[@]} -eq 0 ]; then
  echo "error: no pieces in $PIECES (base.tar.part-00 ...; gpu_wheels.tar.part-* are an" \
       "older pack_wheels.sh's: pack them again with this checkout's" \
       "benchmarks/device/pack_wheels.sh)" >&2
  exit 2
fi
sums="$PIECES/gpu_wheels.sha256"  # it lists both sets' pieces: each set checks its own
set_sums() {  # gpu_wheels.sha256's lines of the set $1, sorted (none: no file, none listed)
  if [ -f "$sums" ]; then
    grep -E "^[0-9a-f]{64} [ *]$1\.tar\.part-[0-9]+\$" "$sums" | LC_ALL=C sort || true
  fi
}
# A set's marker holds the sums of the pieces it was unpacked from: a set unpacked from
# another pack's (packed again since) is stale, and SITE is unpacked afresh.
for set in "${sets[@]}"; do
  marker="$SITE/.complete-$set"
  if [ -s "$marker" ] && [ -f "$sums" ] && [ "$(cat "$marker")" != "$(set_sums "$set")" ]; then
    echo "note: $SITE holds the $set set of another pack: unpacking these pieces afresh" >&2
    rm -rf "$SITE" "$UNPACKED"
    break
  fi
done
if ! ls "$SITE"/.complete-* > /dev/null 2>&1; then  # nothing unpacked yet: start clean
  rm -rf "$SITE" "$UNPACKED"
fi
mkdir -p "$SITE" "$UNPACKED"
for set in "${sets[@]}"; do
  if [ -f "$SITE/.complete-$set" ]; then continue; fi
  if [ ! -f "$sums" ] && [ ! -f "$PIECES/$set.tar.part-00" ]; then
    echo "note: $set: $set.tar.part-00 is not in $PIECES yet: not unpacked until it is" \
         "carried" >&2
    continue
  fi
  if [ -f "$sums" ]; then
    listed=$(set_sums "$set" | sed 's/^[0-9a-f]* [ *]//' | LC_ALL=C sort)
    if [ -z "$listed" ]; then
      echo "error: $sums lists no $set.tar.part-* (another pack's?): copy the" \
           "gpu_wheels.sha256 packed with these pieces" >&2
      exit 2
    fi
    present=$(cd "$PIECES" && ls -1 -- "$set".tar.part-* | LC_ALL=C sort)
    unlisted=$(LC_ALL=C comm -13 <(echo "$listed") <(echo "$present"))
    if [ -n "$unlisted" ]; then
      echo "error: gpu_wheels.sha256 does not list" $unlisted "in $PIECES (left from another" \
           "pack?): remove them, or copy the gpu_wheels.sha256 packed with them" >&2
      exit 2
    fi
    if [ -n "$(LC_ALL=C comm -23 <(echo "$listed") <(echo "$present"))" ]; then
      # partly carried (a piece a call): unpacked by a call that finds them all
      echo "note: $set: $(echo "$present" | wc -l) of $(echo "$listed" | wc -l) pieces in" \
           "$PIECES: not unpacked until the rest are carried" >&2
      continue
    fi
    bad=$(cd "$PIECES" && grep -E " [ *]$set\.tar\.part-[0-9]+\$" gpu_wheels.sha256 \
          | sha256sum --check 2>/dev/null | sed -n 's/: FAILED.*$//p' || true)
    if [ -n "$bad" ]; then
      echo "error:" $bad "does not match gpu_wheels.sha256 in $PIECES (damaged on the way?):" \
           "carry it again" >&2
      exit 2
    fi
  fi
  rm -rf "${UNPACKED:?}/$set"
  if [ -f "$sums" ]; then  # checked whole above: tar's own words on a failure
    cat "$PIECES/$set".tar.part-* | tar -x -C "$UNPACKED"
  else  # nothing says whether all are here: a cut archive is said below
    cat "$PIECES/$set".tar.part-* | tar -x -C "$UNPACKED" 2>/dev/null || true
  fi
  if [ ! -f "$UNPACKED/$set/site.json" ]; then
    if [ -f "$sums" ]; then
      echo "error: the pieces $PIECES/$set.tar.part-* hold no $set/site.json: pack them again" \
           "with this checkout's benchmarks/device/pack_wheels.sh" >&2
    else
      echo "error: the pieces $PIECES/$set.tar.part-* hold no $set/site.json: some not carried" \
           "yet (carry them, with the gpu_wheels.sha256 that counts them), or packed by an" \
           "older pack_wheels.sh (pack them again with this checkout's)" >&2
    fi
    exit 2
  fi
  "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/sitepack.py" unpack "$UNPACKED/$set/site.json" "$SITE"
  rm -rf "${UNPACKED:?}/$set/site"  # the streams (GBs): SITE holds their files now
  # where a wheel's zip kept no exec bits: ptxas and the other CUDA tools
  find "$SITE"/nvidia -path '*/bin/*' -type f -exec chmod +x {} + 2>/dev/null || true
  set_sums "$set" > "$SITE/.complete-$set"  # the sums it was unpacked from
done
if ! ls "$SITE"/.complete-* > /dev/null 2>&1; then
  echo "error: no set of pieces in $PIECES is whole (gpu_wheels.sha256 lists more) and none" \
       "is unpacked in $SITE: carry the rest of the base set's pieces" >&2
  exit 2
fi

# every nvidia/*/lib of the wheels (none where SKIP left out all CUDA libraries)
packed=""
for lib in "$SITE"/nvidia/*/lib; do
  if [ -d "$lib" ]; then packed+="$lib:"; fi
done
# the machine's own CUDA wheels (e.g. torch's), for any left out with SKIP
own=$(env -u PYTHONPATH "$PYTHON" -c "import glob, site
libs = [f for p in site.getsitepackages() for f in sorted(glob.glob(p + '/nvidia/*/lib'))]
print(''.join(f + ':' for f in libs))")
# Both hold a libcudnn.so.9: TensorFlow was built with the CUDA 12 one (packed),
# onnxruntime-gpu 1.31 is a CUDA 13 build (the H200's own wheels hold its
# libraries); a process loads the first one found. Each of the check's parts is
# a process of its own: with both lists exported, gpu_check gives the parts that
# need onnxruntime's GPU the order its probe found working.
unset TXL_PACKED_LIBS TXL_MACHINE_LIBS
case "${LIB_ORDER:-auto}" in
  auto) libs="$packed$own"
        export TXL_PACKED_LIBS="${packed%:}" TXL_MACHINE_LIBS="${own%:}" ;;
  packed) libs="$packed$own" ;;
  machine) libs="$own$packed" ;;
  *) echo "error: LIB_ORDER=$LIB_ORDER: use auto (the default: the packed CUDA 12 libraries" \
          "first, onnxruntime's parts in the order its probe finds working), packed (the" \
          "packed first for every part) or machine (the machine's own first for every part)" >&2
     exit 2 ;;
esac
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
# no empty entry (the loader reads one as the current folder): none at the end, none before
# the caller's own
libs="${libs%:}"
if [ -n "${LD_LIBRARY_PATH:-}" ]; then libs="${libs:+$libs:}$LD_LIBRARY_PATH"; fi
export LD_LIBRARY_PATH="$libs"
export PATH="$SITE/nvidia/cuda_nvcc/bin:$PATH"
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
# XLA looks for libdevice under a CUDA folder: the nvcc wheel is one
export XLA_FLAGS="--xla_gpu_cuda_data_dir=$SITE/nvidia/cuda_nvcc ${XLA_FLAGS:-}"

reference=()
if [ -d "$UNPACKED/reference/pytorch" ]; then
  # the paper's code runs with the machine's own torch, not the wheels above
  cat > "$UNPACKED/torch_python" <<EOF
#!/bin/sh
exec env -u PYTHONPATH -u LD_LIBRARY_PATH "$(command -v "$PYTHON")" "\$@"
EOF
  chmod +x "$UNPACKED/torch_python"
  reference=(--reference_dir="$UNPACKED/reference/pytorch"
             --reference_python="$UNPACKED/torch_python")
fi

exports=()
if [ -d "$EXPORTS" ]; then
  exports=(--serving_exports="$EXPORTS")
fi

if [ -n "${PREPARE_ONLY:-}" ]; then
  echo "PYTHONPATH=$PYTHONPATH"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "TXL_PACKED_LIBS=${TXL_PACKED_LIBS-(not set: LIB_ORDER=$LIB_ORDER)}"
  echo "TXL_MACHINE_LIBS=${TXL_MACHINE_LIBS-(not set: LIB_ORDER=$LIB_ORDER)}"
  echo "PATH=$PATH"
  echo "reference: ${reference[*]:-none}"
  echo "serving exports: ${exports[*]:-none (the serving part exports; no float16 parts)}"
  exit 0
fi
mkdir -p "$OUT"
# The parts' own files stay here: the call brings back 8 files of $OUT at most, and
# gpu_check.json holds their content (each row's "json").
exec "$PYTHON" -m benchmarks.gpu_check --output="$OUT/gpu_check.json" \
    --parts_dir=/tmp/gpu_check_parts "${reference[@]}" \
    "${exports[@]}" "$@"
