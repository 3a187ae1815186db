r"""The one GPU check (issue 52): a machine with one NVIDIA GPU and the `[gpu]`
extra runs it within `--total_s` (by default what one device session leaves,
`SESSION_S`; each part has its own share, `BUDGETS`) and prints one table.
All its parts do not fit one session: `--parts=training` and
`--parts=serving` (`GROUPS`) each do; the parts in neither run by name.

    python -m benchmarks.gpu_check [--reference_dir=.../transformer-xl/pytorch] \
        [--reference_python=python] [--output=gpu_check.json] [--parts=training]
    python -m benchmarks.gpu_check --parts=parity,losses,mirrored   # groups and parts
    python -m benchmarks.gpu_check --device=cpu --tiny   # its logic, on the CPU, tiny sizes
    python -m benchmarks.gpu_check --make_serving_exports=build/gpu_exports   # beforehand
    python -m benchmarks.gpu_check --serving_exports=build/gpu_exports        # then

Parts, each a command line of `COMMANDS` run in its own process with its own
time budget (`BUDGETS`, plus what the parts before it left unused, cut to what
is left of `--total_s`: `part_limit`); a part of `SETTINGS` runs its command
once per setting, each in a process whose environment adds the setting's
variables (`run_settings`); a part that
fails, runs out of time or cannot run is one line of the table (`failed
(...)`, `skipped (...)`), and the check goes on:

- `gpu`: the GPU TensorFlow sees, onnxruntime's providers, the ptxas XLA
  will use and its version (CUDA 12.6.3's, 12.6.85, or newer: older ones
  compile wrong sm_90 code where values are clamped).
- `compile_flags`: `benchmarks.throughput --part=train` of enwik8_base
  bf16+jit (`mixed_bfloat16`, the training job's default on a GPU, whose
  compile outran its budget on 2026-12-01; no paper row), once with
  `--xla_gpu_enable_triton_gemm=false` added to `XLA_FLAGS`, once with
  `--xla_gpu_autotune_level=0` and once with
  `--xla_gpu_enable_llvm_module_compilation_parallelism=true`: each
  setting's first step's seconds (XLA's compile) and tok/s.
- `parity`: log-probs of the enwik8 base model (random weights, seed 0) on
  the GPU against the CPU, TF32 off, two 512-token segments of batch 2 with
  the memory carried: the largest difference, <= 1e-4.
- `losses`: a seeded run of 50 `train_on_batch` steps on the GPU and on the
  CPU (the `small` shape, same initial weights, dropout 0: a dropout mask is
  not the same draw on two devices; TF32 off): the largest loss difference in
  each window of 10 steps; the first window must stay within 1e-4 (round-off
  grows with the steps after it: the later windows are reported as seen).
- `mirrored`: 10 steps of `fit` under `MirroredStrategy` over the one GPU
  against `OneDeviceStrategy`, same weights and data, TF32 off: losses and
  weights.
- `pair_enwik8_base`, `pair_wt103_base`: `benchmarks.throughput --part=train`
  with XLA (enwik8_base: bf16, the must-show row not yet measured;
  wt103_base: f32 with TF32; the other rows left out to fit, `GROUPS`), beside the paper's
  PyTorch code in the matching precision (with `--reference_dir`): tok/s,
  the ratio, peak GPU memory, the first step's seconds, and that first step's XLA compile by
  phase (the timers `compile_flags` logs: the row's `compile_phases`). A part stopped at its budget
  shows the rows its JSON holds so far and the variant it was on; where the
  paper's code fails, its rows say why and this library's are still timed
  (the part fails). At enwik8_base each of this library's variants then
  runs 2 more steps under TensorFlow's profiler: where the time goes, by
  XLA op category (`benchmarks/tf_profile.py`), in its row.
- `train`: `python -m training.train` (what `txl-train` runs) for 40 steps
  with a checkpoint at 20, SIGKILLed after its log shows a step past 20,
  then run again: it must say it resumed at step 20, feed the batches the
  killed run fed at those steps, end at step 40 and exit 0; the first step's
  compile seconds from the progress line, and the resume's (both runs use
  XLA's persistent cache in `--work_dir`/xla_cache, cleared at the start:
  the resume loads the program the first run compiled). Stopped at its
  budget, it shows how far each run got.
- `decode_xla`: the Keras side's decoder on TensorFlow's GPU
  (`benchmarks.long_memory --backends=xla --xla_device=gpu`: `Decoder.generate`
  compiled by XLA, the whole loop one program), ms a token at batch 1 and 16
  on the serving preset's memory, against the GPU's bound: beside the ONNX
  step of `serving_long_memory`. In no group (run by name).
- `serving_long_memory`, `serving_evaluation`, `serving_soak`,
  `serving_device_tests`, `serving_parity`: the serving suite of issue 53
  (`benchmarks.long_memory --device=cuda --noturns`: ms a token and the
  session table at batch 1 and 16, a token's parts, and the same export
  stepped as before `decode_token` (`onnx_step_write`) beside it; then
  `--part=evaluation` over the
  export it made: 512-token segments on its memory of 2,100 through the
  runtime API against the graph with bound buffers, and the paper's code
  with `--reference_dir`; `--part=soak`: 32 sessions, up to 16 open at
  once, on the device slab, each checked against the session run alone;
  the device slab's, the device memory's and the fixed-shape segments'
  tests on CUDA, `TXL_DEVICE_TESTS=cuda pytest tests/test_device_ring.py
  tests/test_sessions.py tests/test_fixed_segments.py -k device`; then `--part=cuda_parity` over the
  export (float32, TF32 off: within issue 53's 1e-5 of the CPU), with the step's kernel count
  on CUDA; then
  `benchmarks.inference --part=profile`: the decode step's and the segment
  graph's time by op type, ONNX Runtime's profiler with blocking launches,
  at batch 1 and 16).
- `serving_float16`, `serving_parity_float16`: the same export with its
  decode graphs in float16 (`python -m export --decode_dtype=float16`):
  ms per token at batch 1 and 16, and its parity to the CPU (<= 5e-2).
  Only with `--serving_exports`.
- `serving_precision`: the float16 export option on a trained model, the
  shipped `pystdlib_small`: held-out text (this Python's standard library)
  read one token at a time through its ONNX exports with a float32 cache,
  a float16 cache and float16 decode graphs, on the GPU's own float16
  kernels: each one's perplexity, and the 16-bit ones' largest log-prob
  change and most likely tokens changed against float32's
  (`benchmarks.long_memory --part=cache_precision --nokeras_rows`: no
  Keras model and no TensorFlow op, so TensorFlow's runtime never starts
  on the GPU beside ONNX Runtime; its import still lists the GPUs).
  Only with `--serving_exports` (which holds those exports, trained
  weights and all, made beforehand).
- `attention_forms`: one layer's attention of the cached decode step in
  ONNX Runtime's fused forms (MultiHeadAttention, the opset-23/24
  Attention, DecoderMaskedMultiHeadAttention, GroupQueryAttention) beside
  today's, float32 and float16, batch 1 and 16: parity, ms a call as a
  CUDA graph, kernels, the bound (`benchmarks.attention_forms`). In no
  group (run by name).
- `fused_step`: the whole cached decode step (`decode_token.onnx` of the
  float32 and float16 exports brought along) rewritten into each of those
  forms, batch 1 and 16: parity to the exported step over 4 steps, ms a
  step as a CUDA graph, nodes and kernels, the bound, and whether the
  fastest form meets issue 53's 0.78 ms (batch 1) and 2x the bound (batch
  16) (`benchmarks.fused_step`); stopped at its budget, its row has the
  forms measured so far. In no group (run by name); only with
  `--serving_exports`.

`--serving_exports=DIR` brings the serving exports made beforehand on
another machine (`--make_serving_exports=DIR` there, with TensorFlow: the
graphs without their large weights, megabytes): they are copied into the
work folder and their weights filled at random (a row of the table, its
seconds taken from `--total_s`), so the serving parts time instead of
exporting (an export of enwik8_base is about a minute of CPU).

Without a GPU (and not `--device=cpu`) it exits at once with one `error:`
line and status 2, saying why each of TensorFlow and onnxruntime has none
(their own warnings, which the check's environment hides, from a child
process: `probe_gpu`); where only one of them has it, the `gpu` row fails
saying why and the parts that need the other are skipped, the rest run.
Under `benchmarks/device/run_check.sh` (its two lists of CUDA library
folders, `LIBRARY_LISTS`), where onnxruntime's CUDA provider does not load
with the check's `LD_LIBRARY_PATH` but does with the other order of the two
lists, the parts that need it run with that order (`part_envs`; the `gpu`
row says which order each side got, and why).
With a failed part, status 1 after the table. After it, the issues'
numeric must-show targets judged from the parts' figures
(`benchmarks/issue_targets.py`: met, short, shown or not measured, and why;
none judged with `--device=cpu` or `--tiny`). Writes the table, each part's
details (its command, seconds, output tail, results) and the targets
(`targets`) as JSON, after every part (`"partial": true` until the last is
done), so a check killed at a time limit keeps what it measured. SIGTERM (a time limit's
first signal) kills the part running with its children, skips the rest and
still prints the table and writes the JSON.
"""
import collections
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from benchmarks import issue_targets
from benchmarks.common import BenchmarkError, names_from
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

# Every command line the check runs (formatted with `sizes()` and the flags):
# rename a benchmark here.
COMMANDS = {
    "compile_flags": "{python} -m benchmarks.throughput --part=train --shapes={pair_enwik8} "
                     "--variants={compile_variant} --warmup=1 --iters=3 "
                     "--output={out}/compile_flags.json",
    "parity": "{python} -m benchmarks.gpu_check --run_part=parity --shape={check_shape} "
              "--device={device}",
    "losses": "{python} -m benchmarks.gpu_check --run_part=losses --shape={loss_shape} "
              "--device={device}",
    "mirrored": "{python} -m benchmarks.gpu_check --run_part=mirrored --shape={loss_shape} "
                "--device={device}",
    "pair_enwik8_base": "{python} -m benchmarks.throughput --part=train --shapes={pair_enwik8} "
                        "--variants={enwik8_variants} --nointerleave --warmup=2 "
                        "--iters={pair_iters} --profile_steps=2 "
                        "--output={out}/pair_enwik8_base.json {reference}",
    "pair_wt103_base": "{python} -m benchmarks.throughput --part=train --shapes={pair_wt103} "
                       "--variants={wt103_variants} --nointerleave --warmup=2 "
                       "--iters={pair_iters} --output={out}/pair_wt103_base.json {reference}",
    "train": "{python} -m training.train --model_dir={work}/train --preset={train_preset} "
             "--dataset=pystdlib --cache_dir={work}/cache --batch_size={train_batch} "
             "--train_steps=40 --checkpoint_every=20 --log_every=1 --log_batches "
             "--nofinal_eval --seed=0 --verbose=1",
    "decode_xla": "{python} -m benchmarks.long_memory --presets={serving_preset} "
                  "--batch_sizes=1,16 --backends=xla --xla_device={xla_device} --noturns "
                  "--nosessions --work_dir={work}/decode_xla --output={out}/long_memory_xla.json",
    "serving_long_memory": "{python} -m benchmarks.long_memory --device={ort_device} "
                           "--presets={serving_preset} --batch_sizes=1,16 "
                           "--backends=onnx,onnx_step_write "
                           "--noturns --work_dir={work}/serving {reuse} "
                           "--output={out}/long_memory.json",
    "serving_evaluation": "{python} -m benchmarks.long_memory --part=evaluation "
                          "--device={ort_device} --presets={serving_preset} "
                          "--segment_len={eval_segment} --batch_sizes=1,16 --segments=2 "
                          "--repeats=3 --reuse_exports --work_dir={work}/serving "
                          "--output={out}/long_memory_evaluation.json {reference}",
    "serving_soak": "{python} -m benchmarks.long_memory --part=soak --device={ort_device} "
                    "--export_dir={work}/serving/{serving_preset}/out --soak_sessions=32 "
                    "--max_open=16 --report_every=16 --output={out}/session_soak.json",
    "serving_device_tests": "{python} -m pytest -q "
                            "-p no:cacheprovider tests/test_device_ring.py "
                            "tests/test_sessions.py tests/test_fixed_segments.py -k device",
    "serving_parity": "{python} -m benchmarks.long_memory --part=cuda_parity "
                      "--device={ort_device} --exports={work}/serving/{serving_preset}/out "
                      "--tolerance={decode_tolerance} --output={out}/cuda_parity.json",
    "serving_profile": "{python} -m benchmarks.inference --part=profile "
                       "--export_dir={work}/serving/{serving_preset}/out --device={ort_device} "
                       "--segment_len={eval_segment} --output={out}/profile.json",
    "serving_float16": "{python} -m benchmarks.long_memory --device={ort_device} "
                       "--presets={serving_preset} --batch_sizes=1,16 --backends=onnx "
                       "--noturns --nosessions --work_dir={work}/serving_float16 "
                       "--reuse_exports --decode_dtype=float16 "
                       "--output={out}/long_memory_float16.json",
    "serving_parity_float16": "{python} -m benchmarks.long_memory --part=cuda_parity "
                              "--device={ort_device} "
                              "--exports={work}/serving_float16/{serving_preset}/out "
                              "--tolerance=5e-2 --output={out}/cuda_parity_float16.json",
    "serving_precision": "{python} -m benchmarks.long_memory --part=cache_precision "
                         "--device={ort_device} --model_dir={precision_model} "
                         "--dataset=pystdlib --split=valid --mem_len={precision_mem_len} "
                         "--tokens={precision_tokens} --streams=4 --cache_dir={work}/cache "
                         "--work_dir={precision_exports} --reuse_exports --nokeras_rows "
                         "--output={out}/cache_precision.json",
    "attention_forms": "{python} -m benchmarks.attention_forms --device={ort_device} "
                       "--shape={serving_preset} --dtypes=float32,float16 "
                       "--output={out}/attention_forms.json",
    "fused_step": "{python} -m benchmarks.fused_step --device={ort_device} "
                  "--exports={work}/serving/{serving_preset}/out,"
                  "{work}/serving_float16/{serving_preset}/out --iters=30 "
                  "--forms={fused_forms} --output={out}/fused_step.json",
}
# Parts run once per setting, each run a process of its own with these variables added
# to the check's environment (after any value it has: run_check.sh's XLA_FLAGS holds
# --xla_gpu_cuda_data_dir), each with an equal share of the part's time (`run_settings`).
# compile_flags: the bf16 training step's first seconds (XLA's compile: GEMM autotuning, LLVM,
# ptxas) and tok/s with Triton's GEMMs off, with no autotuning, and with the LLVM module
# split and compiled on every core (one thread by default); a setting that finishes early
# leaves its time to the next. The three flags parse in TensorFlow 2.21; an unknown XLA flag
# aborts the process: check one with
# `XLA_FLAGS=--flag python -c "import tensorflow as tf; tf.function(lambda x: x + 1,
# jit_compile=True)(tf.ones(1))"` before adding it.
# Each compile_flags run also logs XLA's own compile timers (XLA_SCOPED_LOGGING_TIMER, on at
# VLOG 1 in these files; INFO lines, hence the log level): where its first step's compile
# goes, by phase (`compile_phases`: HLO passes, autotuning, LLVM and ptxas).
COMPILE_TIMERS = {"TF_CPP_MIN_LOG_LEVEL": "0",
                  "TF_CPP_VMODULE": "gpu_compiler=1,nvptx_compiler=1,gemm_fusion_autotuner=1,"
                                    "autotuner_util=1,device_compiler=1,cpu_compiler=1"}
# The pairs' runs log the timers too: the default flags' compile by phase (the row's
# `compile_phases`), beside compile_flags' settings.
TIMED_COMPILES = ("pair_enwik8_base", "pair_wt103_base")
# The autotuning settings first: the bf16 pair's log on 2026-12-01 ended, at its budget, in
# XLA's GEMM autotuner compiling candidate programs (`gemm_fusion_MatMul...`).
SETTINGS = {"compile_flags": {
    "triton_gemm_off": {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false", **COMPILE_TIMERS},
    "autotune_level_0": {"XLA_FLAGS": "--xla_gpu_autotune_level=0", **COMPILE_TIMERS},
    "llvm_parallel": {"XLA_FLAGS": "--xla_gpu_enable_llvm_module_compilation_parallelism=true",
                      **COMPILE_TIMERS}}}
# The variables a setting adds to (a list of flags); a setting sets the others.
FLAG_LISTS = ("XLA_FLAGS", "TF_XLA_FLAGS")
# TensorFlow's timer of a whole XLA compile. XLA's own timers nest inside it and in each
# other (the costliest is an outer one: the HLO passes, autotuning among them, or the
# backend's codegen), and timers of parallel compiles add up their threads' time.
WHOLE_COMPILE = "Compilation of XLA executable"
# An XLA timer's log line: "... ] <label> time: 1.2 s (1234567 us) (cumulative: ...)".
TIMER_LINE = re.compile(r"\] (.+?) time: [^(\n]*\((\d+) us\)")  # one line
# Seconds each part may take, from the check's run of 2026-11-30 on an H200
# (benchmarks/device/README.md, Next GPU session): a part that finished there has its seconds
# and a margin (parity, serving_long_memory, serving_evaluation, serving_soak); one that
# timed out has what that run showed it needs: its process's start (TensorFlow's and
# onnxruntime's imports, the GPU opened: the gpu and parity rows), one compile per XLA
# program as the enwik8_base pair's f32+jit first step measured it (mostly GPU-only work:
# GEMM autotuning, ptxas; the small shape's programs are given the same), then its work.
# losses: its seconds to the GPU program's compile there, the compile, 50 steps on each
# device; mirrored: two programs, the second given less (its GEMMs are the first's, whose
# autotuning XLA keeps in the process);
# pair_enwik8_base: its one variant (`sizes`), the paper's row and 2 profiled steps, and
# room for a bf16 compile longer than f32's minute (on 2026-12-01 its 95 s, of which the paper's
# row took about 20, ended with XLA still autotuning);
# pair_wt103_base: its paper row as measured, one program; compile_flags: each setting
# its start and a compile short of f32's 61 s (the bf16 step's, with a setting that works;
# one still compiling then shows how far it got); train: the first run's compile
# (`mixed_bfloat16`, as the bf16 pair's: more than a minute) and 21 steps, then the resume,
# which loads the program from XLA's cache; decode_xla (never run on a GPU):
# its start and four XLA programs (two loop lengths at each batch size) of the decode step,
# each given a third of a training step's compile; serving_device_tests: the
# tests it got through there, 39 in all; serving_profile, serving_float16: the rows they
# had printed, then the rest.
# fused_step's forms, the two to watch first (benchmarks/device/README.md): a part stopped at
# its budget has measured those (its JSON is written after each form); the plain ONNX one
# before the contrib kernel that reads its own chunked layout (a CUDA error there would
# leave the process's later forms nothing to run on).
FUSED_FORMS = ("today", "attention24_pad", "dmmha", "attention23", "mha", "mha_pad",
               "attention23_pad", "dmmha_inflight", "gqa")
# attention_forms (never run on a GPU): its process's start and about a minute of work
# (its author's estimate from the CPU run). fused_step (never run on a GPU): its process's
# start, the two exports loaded, and per form and dtype (18 of them) a rewrite, two sessions,
# 8 parity steps and 30 timed steps a batch, guessed at 5 s each (on the 2-core CPU at
# enwik8_base, 2026-12-01: a rewrite up to 1.2 s, the opset conversion's; its serialization
# 0.4 s; a CPU session 0.3 to 0.5 s; on the GPU a session also moves the weights there and
# captures CUDA graphs; each form's `form_seconds` in its JSON will say). serving_precision
# (never run on a GPU): its process's start (TensorFlow imported, not started), the corpus
# read, three exports opened on CUDA and 300 steps of 4 rows each. The serving parts
# time exports brought along (--serving_exports): serving_long_memory exports enwik8_base
# otherwise.
BUDGETS = {"compile_flags": 145, "parity": 30, "losses": 120, "mirrored": 120,
           "pair_enwik8_base": 170, "pair_wt103_base": 100, "train": 180, "decode_xla": 120,
           "serving_long_memory": 50, "serving_evaluation": 60, "serving_soak": 40,
           "serving_device_tests": 75, "serving_parity": 45, "serving_profile": 40,
           "serving_float16": 35, "serving_parity_float16": 45, "serving_precision": 40,
           "attention_forms": 90, "fused_step": 120}
# What one device session leaves for the check (its device time less the machine's start,
# the pieces and their unpacking, as on 2026-11-30): the whole check does not fit one, so
# it runs as named groups of parts (`--parts=training`, `--parts=serving`), one a
# session, each group's budgets and the gpu and serving_exports rows within SESSION_S.
SESSION_S = 540.0
# Left out of the groups to fit (run by name, e.g. `--parts=parity,losses,mirrored`): mirrored
# (two XLA programs), losses (its GPU program's compile and 100 steps), pair_wt103_base
# (its rows are shown, not judged) and decode_xla (the Keras side's decoder on the GPU,
# shown beside the ONNX step), attention_forms (one layer's attention in ONNX Runtime's
# fused forms: what to build next for issue 53's decode step), fused_step (the whole step in
# those forms: whether one meets issue 53's targets); and of the pairs'
# rows (`sizes`) enwik8_base's f32+jit (5.19x the paper's on 2026-11-30) and f16+jit, and
# wt103_base's bf16+jit and f16+jit.
GROUPS = {"training": ("compile_flags", "parity", "pair_enwik8_base", "train"),
          "serving": ("serving_long_memory", "serving_evaluation", "serving_soak",
                      "serving_device_tests", "serving_parity", "serving_profile",
                      "serving_float16", "serving_parity_float16", "serving_precision")}
# The parts that time the float16 decode step: only over --serving_exports (an export
# of its own would take more than their budget on the GPU machine).
FLOAT16_PARTS = ("serving_float16", "serving_parity_float16")
# The parts in neither group that time onnxruntime's GPU (no TensorFlow's).
ONNXRUNTIME_PARTS = ("attention_forms", "fused_step")
# The parts that read the exports --serving_exports brings (copied and filled first).
EXPORT_PARTS = (*FLOAT16_PARTS, "fused_step", "serving_precision")
# serving_precision's model, the shipped one, with its trained weights, and its memory; its
# exports go into --make_serving_exports' folder whole, <folder>/PRECISION_FOLDER (read in
# place: not filled at random).
PRECISION_MODEL, PRECISION_MEM_LEN, PRECISION_FOLDER = "pystdlib_small", 128, "precision"
# The skeletons --make_serving_exports writes and --serving_exports reads:
# <folder>/<decode dtype>/<preset>/out, the layout of benchmarks.long_memory's --work_dir.
SERVING_DTYPES = {"float32": "serving", "float16": "serving_float16"}
CHECKS = list(COMMANDS)
# The progress line's first-step compile time (training.train: "... compile <seconds>s";
# else the first `compile_s` of its train_log.jsonl).
COMPILE_SECONDS = re.compile(r"\bcompile (\d+(?:\.\d+)?) ?s\b")
# The progress line's step (training.train: "step 23/40 loss ...").
STEP_LINE = re.compile(r"^step (\d+)/\d+ ", re.MULTILINE)
# The job's line every 30 s while the train step's first call runs (its tracing and compile).
FIRST_CALL_LINE = re.compile(r"^first call: (\d+)s so far", re.MULTILINE)
# The two libraries whose GPU the parts use (`sides_needed`).
SIDES = ("tensorflow", "onnxruntime")
# TensorFlow's problem where it is not installed (a serving-only pack: its parts need none).
NO_TENSORFLOW = "TensorFlow is not installed"
PTXAS_FLOOR = (12, 6, 85)  # CUDA 12.6.3's ptxas, the oldest XLA accepts for Hopper
RESULT_PREFIX = "gpu_check result: "

SPEC = (
    option("enum", "device", "gpu", "gpu: the check; cpu: its logic on the CPU (no GPU "
           "needed; with --tiny).", ["gpu", "cpu"]),
    option("bool", "tiny", False, "Tiny sizes everywhere (the CPU test of the logic)."),
    option("list", "parts", CHECKS, f"Parts to run, in this order: of {CHECKS}, or a group's "
           "name for its parts (" + "; ".join(f"{g}: {', '.join(p)}" for g, p in GROUPS.items())
           + ")."),
    option("float", "total_s", SESSION_S, "Seconds for the whole check (what a device session "
           "leaves: one group's parts fit)."),
    option("float", "budget_scale", 1.0, "Multiplies every part's budget (a rerun of one part)."),
    option("string", "reference_dir", None, "The pytorch/ folder of kimiyoung/transformer-xl "
           "(the paper's rows of the pairs)."),
    option("string", "reference_python", sys.executable, "A Python with torch for it."),
    option("string", "work_dir", "/tmp/txl_gpu_check", "Scratch folder (its train/, "
           "serving/, serving_float16/ and xla_cache/ are removed first)."),
    option("bool", "xla_cache", True, "The train part with XLA's persistent cache (its resume "
           "loads the program the first run compiled); --noxla_cache: without, should "
           "TensorFlow fail to save or load it."),
    option("string", "serving_exports", None, "Export skeletons made on another machine by "
           "--make_serving_exports: the serving parts refill their weights at random (seed 0) "
           "and time them instead of exporting here, and the float16 decode step is timed "
           "too (serving_float16, serving_parity_float16; skipped without)."),
    option("string", "make_serving_exports", None, "Write those skeletons into this folder "
           "and exit: the serving preset exported with random weights, its decode graphs in "
           "float32 and in float16, the large weights stripped (megabytes; needs TensorFlow)."),
    option("string", "output", "gpu_check.json", "The JSON file (the parts' own JSON files go "
           "beside it, or into --parts_dir; each is copied into its row too)."),
    option("string", "parts_dir", None, "Where the parts' own JSON files go (default: beside "
           "--output). Their content is in the check's JSON too (each row's `json`), so that "
           "one file brings everything back from a machine that returns few files."),
    option("enum", "run_part", None, "Internal: run one in-process part and print its result.",
           ["parity", "losses", "mirrored"]),
    option("string", "shape", None, "Internal: the --run_part's shape (benchmarks.throughput)."),
)


class GpuCheckError(BenchmarkError):
    """The check cannot start (no GPU)."""


def sizes(tiny, device):
    """The values `COMMANDS` is formatted with (besides paths and flags)."""
    if tiny:
        return dict(check_shape="tiny", loss_shape="tiny", pair_enwik8="tiny", pair_wt103="tiny",
                    enwik8_variants="f32", wt103_variants="f32", compile_variant="f32",
                    pair_iters=2, train_preset="tiny", train_batch=4,
                    serving_preset="tiny", eval_segment=32, device=device, ort_device="cpu",
                    xla_device="cpu", precision_tokens=20)
    return dict(check_shape="enwik8_base", loss_shape="small", pair_enwik8="enwik8_base",
                pair_wt103="wt103_base", enwik8_variants="bf16+jit", wt103_variants="f32+jit",
                compile_variant="bf16+jit", pair_iters=8,
                train_preset="enwik8_base", train_batch=22, serving_preset="enwik8_base",
                eval_segment=512, device=device, ort_device="cuda" if device == "gpu" else "cpu",
                xla_device="gpu" if device == "gpu" else "cpu", precision_tokens=300)


# ------------------------------------------------------------------ the GPU
def ptxas_version(text):
    """`(major, minor, patch)` of `ptxas --version`'s output (`... V12.6.85`), or None."""
    found = re.search(r"\bV(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(g) for g in found.groups()) if found else None


def find_ptxas():
    """The ptxas XLA will find (PATH, then the nvidia-cuda-nvcc-cu12 wheel), or None."""
    found = shutil.which("ptxas")
    if found:
        return found
    for folder in sys.path:
        candidate = os.path.join(folder, "nvidia", "cuda_nvcc", "bin", "ptxas")
        if os.path.isfile(candidate):
            return candidate
    return None


# What runs in a child process with TensorFlow's warnings shown (the check's
# environment hides them): TensorFlow's GPUs, and a one-node graph (a
# convolution, so that cuDNN loads too) run on
# onnxruntime's CUDA provider, which `get_available_providers` lists even
# where its libraries (cuDNN, cuBLAS) do not load. With the argument
# `onnxruntime` (`python -c PROBE onnxruntime`), onnxruntime's side only:
# TensorFlow is not imported and loads none of its CUDA libraries.
PROBE = """
import json
import sys
import numpy as np
import onnxruntime as ort
found = {"tensorflow_gpus": None, "onnxruntime": None}
if "onnxruntime" not in sys.argv[1:]:
    import tensorflow as tf
    found["tensorflow_gpus"] = len(tf.config.list_physical_devices("GPU"))
from onnx import TensorProto, helper
sys.stderr.write("%s\\n" % {split!r})  # onnxruntime's lines below, TensorFlow's above
sys.stderr.flush()
if "CUDAExecutionProvider" in ort.get_available_providers():
    # a 1x1 convolution: cuDNN's, which onnxruntime opens only when a kernel needs it
    shape = [1, 1, 1, 1]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, shape, [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnx's own default can be newer than onnxruntime reads
    try:
        # enable_fallback=0: a provider that cannot start raises (its error the reason below),
        # where onnxruntime's Python would print it on stdout and go on with the CPU
        session = ort.InferenceSession(model.SerializeToString(), enable_fallback=0,
                                       providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        y = session.run(None, {"x": np.full(shape, 3.0, np.float32)})[0]
        assert y.ravel().tolist() == [6.0], f"the probe's convolution gave {y.ravel().tolist()}"
        found["onnxruntime"] = session.get_providers()[0]
    except Exception as error:
        found["onnxruntime"] = " ".join(str(error).split())[:300]
print("probe: " + json.dumps(found), flush=True)
"""
# The probe's line between TensorFlow's log and onnxruntime's.
PROBE_SPLIT = "probe: onnxruntime's log follows"
PROBE = PROBE.replace("{split!r}", repr(PROBE_SPLIT))
# Log lines that say why TensorFlow or onnxruntime have no GPU (the first two are kept).
PROBE_REASONS = re.compile(r"dlopen|could not load|cannot open shared|cuinit|cuda driver|"
                           r"skipping registering|failed to load|libcu|libnv", re.IGNORECASE)


# onnxruntime's status words before its message ("[ONNXRuntimeError] : 1 : FAIL : ..."),
# whole or as far as a reason's start cut them.
ORT_STATUS = re.compile(r"^.*?\b(?:EP_)?FAIL : ")


def probe_reasons(log):
    """The lines of a probe's log (TensorFlow's and onnxruntime's) that say
    why a GPU is missing, without their log prefix (at most two, joined)."""
    lines = []
    for line in log.splitlines():
        found = PROBE_REASONS.search(line)
        if found:  # from just before the words that matched (a long line's reason is late)
            prefix = line.rfind("] ", 0, found.start())  # -1: a line without a log prefix
            text = line[max(prefix + 2 if prefix >= 0 else 0, found.start() - 60):]
            text = ORT_STATUS.sub("", " ".join(text.split()))[:200]
            if text not in lines:
                lines.append(text)
    return " / ".join(lines[:2])


def probe_gpu(timeout=300, ld_library_path=None, onnxruntime_only=False):
    """`({"tensorflow": problem, "onnxruntime": problem}, what the probe
    said)`: each problem None where that side works, else why, from a child
    process with TensorFlow's and onnxruntime's warnings shown (`PROBE`);
    `(None, why)` where the probe itself failed. `ld_library_path`: the
    child's `LD_LIBRARY_PATH` (default: this process's); `onnxruntime_only`:
    TensorFlow is not imported (its problem None)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    if ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = ld_library_path
    command = [sys.executable, "-c", PROBE] + ["onnxruntime"] * bool(onnxruntime_only)
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"the probe did not end within {timeout} s"
    found = [line for line in done.stdout.splitlines() if line.startswith("probe: ")]
    if not found:
        return None, f"the probe failed: {_last_line(done.stderr, f'exit {done.returncode}')}"
    found = json.loads(found[-1][len("probe: "):])
    tensorflow, onnxruntime = probe_reasons_by_side(done.stderr)
    if onnxruntime_only:  # every line is onnxruntime's, its import's too
        tensorflow, onnxruntime = "", probe_reasons(done.stderr)
    problems = {"tensorflow": None if onnxruntime_only or found["tensorflow_gpus"] else (
        "TensorFlow sees no GPU" + (f" ({tensorflow})" if tensorflow else "")),
        "onnxruntime": None}
    provider = found["onnxruntime"]
    if provider is None:
        problems["onnxruntime"] = "onnxruntime has no CUDA provider"
    elif provider != "CUDAExecutionProvider":
        problems["onnxruntime"] = ("onnxruntime's CUDA provider does not load "
                                   f"({onnxruntime or provider})")
    return problems, found


def probe_onnxruntime(ld_library_path, timeout=120):
    """onnxruntime's problem with `ld_library_path` (None: its CUDA provider
    runs the probe's graph), from a child process that imports no TensorFlow
    (`probe_gpu`, `onnxruntime_only`); where the probe itself failed, why."""
    problems, found = probe_gpu(timeout, ld_library_path, onnxruntime_only=True)
    return problems["onnxruntime"] if problems else found


def probe_reasons_by_side(log):
    """`(TensorFlow's reasons, onnxruntime's)` in a probe's log
    (`probe_reasons` of the lines before and after `PROBE_SPLIT`: each
    side's problem is said in its own library's words)."""
    tensorflow, _, onnxruntime = log.partition(PROBE_SPLIT)
    return probe_reasons(tensorflow), probe_reasons(onnxruntime)


# run_check.sh's two lists of CUDA library folders ("folder:folder:..."):
# the packed CUDA 12 wheels' (TensorFlow 2.21's) and the machine's own (where
# onnxruntime-gpu 1.31, a CUDA 13 build, finds its libraries). Both hold a
# libcudnn.so.9 and a process loads the first one on LD_LIBRARY_PATH, which
# the loader reads as the process starts: each part, a process of its own, may
# get its own order. Not set (a machine with its own pip wheels, or LIB_ORDER
# given): every part runs with the check's own LD_LIBRARY_PATH.
LIBRARY_LISTS = {"packed": "TXL_PACKED_LIBS", "machine": "TXL_MACHINE_LIBS"}
ORDER_WORDS = {"packed": "the packed libraries", "machine": "the machine's libraries"}


def library_orders(environ):
    """Both orders of run_check.sh's two library lists (`LIBRARY_LISTS`).

    Args:
        environ: an environment (`os.environ`, a part's env).

    Returns:
        `[(order, LD_LIBRARY_PATH), (other order, LD_LIBRARY_PATH)]`: the
        order `environ` runs with (its `LD_LIBRARY_PATH` starts with the two
        lists in that order), then the other, each with what followed them;
        `[]` where either list is unset or empty (one order only) or
        `LD_LIBRARY_PATH` starts with neither order."""
    lists = {order: [f for f in environ.get(name, "").split(":") if f]
             for order, name in LIBRARY_LISTS.items()}
    if not all(lists.values()):
        return []
    current = environ.get("LD_LIBRARY_PATH", "")
    folders = current.split(":")
    both = {"packed": lists["packed"] + lists["machine"],
            "machine": lists["machine"] + lists["packed"]}
    for order, first in both.items():
        if folders[:len(first)] == first:
            other = "machine" if order == "packed" else "packed"
            return [(order, current), (other, ":".join(both[other] + folders[len(first):]))]
    return []


def onnxruntime_order(orders, problem, probe_other):
    """The library order the parts that need onnxruntime's GPU run with: the
    current one where its CUDA provider works there, else the other where it
    works there, else the current one.

    Args:
        orders: `library_orders`'s two, the current first.
        problem: onnxruntime's problem in the current order (None: it works;
            else why, or why the probe failed).
        probe_other: onnxruntime's problem with a given `LD_LIBRARY_PATH`
            (`probe_onnxruntime`); called only where `problem` is not None.

    Returns:
        `(order, tried)`: the order's name and `{order: onnxruntime's problem
        there}` for each order probed."""
    (current, _), (other, path) = orders
    if problem is None:
        return current, {current: None}
    tried = {current: problem, other: probe_other(path)}
    return (other if tried[other] is None else current), tried


def sides_needed(parts):
    """The libraries whose GPU `parts` need: "tensorflow" (the training
    parts), "onnxruntime" (the serving parts, `needs_onnxruntime`), or both."""
    return tuple(side for side, needed in (
        ("tensorflow", any(not needs_onnxruntime(p) for p in parts)),
        ("onnxruntime", any(needs_onnxruntime(p) for p in parts))) if needed)


def tensorflow_installed():
    """Whether TensorFlow can be imported (a serving-only pack has none)."""
    import importlib.util
    return importlib.util.find_spec("tensorflow") is not None


def gpu_problems(device="gpu", parts=CHECKS):
    """`(problems, facts)`: what keeps the check's `parts` from running on a
    GPU (empty when the sides they need work: TensorFlow sees a GPU,
    onnxruntime has CUDA; `sides_needed`), and what was found; with
    `device` "gpu", `facts` also hold each side's problem
    (`tensorflow_problem`, `onnxruntime_problem`: None where it works; see
    `probe_gpu`; TensorFlow's where it is not installed, `NO_TENSORFLOW`)
    and, where run_check.sh gave both library orders
    (`library_orders`), the order each side's parts get (`library_order`:
    TensorFlow's the check's own, onnxruntime's from `onnxruntime_order`)
    and onnxruntime's problem in each order probed (`onnxruntime_by_order`).
    `facts["needed"]`: the sides the parts need (the gpu row judges those);
    `facts["tensorflow_installed"]`: whether TensorFlow can be imported at
    all (the serving parts run without it on exports brought along, less
    the device tests, which export their own: `skip_reason`)."""
    import onnxruntime
    installed = tensorflow_installed()
    names = []
    if installed:
        import tensorflow as tf
        names = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
                 for g in tf.config.list_physical_devices("GPU")]
    providers = onnxruntime.get_available_providers()
    facts = {"tensorflow_gpus": names,
             "onnxruntime_providers": providers, "ptxas": find_ptxas(),
             "tensorflow_problem": None, "onnxruntime_problem": None,
             "needed": sides_needed(parts), "tensorflow_installed": installed}
    tensorflow = None if names else ("TensorFlow sees no GPU" if installed else NO_TENSORFLOW)
    onnxruntime = None if "CUDAExecutionProvider" in providers else \
        f"onnxruntime has no CUDA provider ({', '.join(providers)})"
    if device == "gpu":  # why, from a child with the warnings shown; a failed probe: as above
        probed, facts["probe"] = probe_gpu() if installed else probe_gpu(onnxruntime_only=True)
        if probed:
            tensorflow = tensorflow and (probed["tensorflow"] or tensorflow)
            onnxruntime = onnxruntime or probed["onnxruntime"]
        orders = library_orders(os.environ)
        if orders:
            order, tried = orders[0][0], {}
            if "CUDAExecutionProvider" in providers:  # else no order gives it one
                order, tried = onnxruntime_order(
                    orders, probed["onnxruntime"] if probed else facts["probe"],
                    probe_onnxruntime)
            facts["library_order"] = {"tensorflow": orders[0][0], "onnxruntime": order}
            facts["onnxruntime_by_order"] = tried
            if order != orders[0][0]:  # its parts run with the order where it works
                onnxruntime = None
            elif onnxruntime and len(tried) == 2:
                onnxruntime += f"; with {ORDER_WORDS[orders[1][0]]} first: {tried[orders[1][0]]}"
    facts["tensorflow_problem"], facts["onnxruntime_problem"] = tensorflow, onnxruntime
    return needed_problems(facts), facts


def needed_problems(facts):
    """The problems (`gpu_problems`'s facts) of the sides the parts need."""
    return [facts[f"{side}_problem"] for side in facts.get("needed", SIDES)
            if facts.get(f"{side}_problem")]


def order_text(facts):
    """The `gpu` row's words on the library order each side's parts got and
    why (`gpu_problems`'s `library_order`), or "" where there was no choice."""
    chosen = facts.get("library_order")
    if not chosen:
        return ""
    tensorflow, onnxruntime = chosen["tensorflow"], chosen["onnxruntime"]
    if tensorflow == onnxruntime:
        return f"; every part with {ORDER_WORDS[tensorflow]} first"
    return (f"; TensorFlow's parts with {ORDER_WORDS[tensorflow]} first, onnxruntime's with "
            f"{ORDER_WORDS[onnxruntime]} first (with {ORDER_WORDS[tensorflow]} first: "
            f"{facts['onnxruntime_by_order'][tensorflow]})")


def gpu_row(facts, device):
    """The table's `gpu` row: the GPU, the providers, the ptxas and its
    version (failed below `PTXAS_FLOOR`; skipped with `--device=cpu`)."""
    ptxas, version, found = facts["ptxas"], None, "not found"
    if ptxas:
        try:  # a wheel unzipped without its exec bits, a file of another machine
            done = subprocess.run([ptxas, "--version"], capture_output=True, text=True,
                                  timeout=60)
            version = ptxas_version(done.stdout)
            found = f"{ptxas} printed no version"
        except (OSError, subprocess.SubprocessError) as error:
            found = f"{ptxas} does not run ({type(error).__name__}: {error})"
    facts["ptxas_version"] = ".".join(map(str, version)) if version else None
    cuda = "CUDAExecutionProvider" in facts["onnxruntime_providers"]
    xla = "tensorflow" in facts.get("needed", SIDES)  # ptxas: XLA's, for TensorFlow's parts
    tensorflow = ", ".join(facts["tensorflow_gpus"]) or (
        "none" if xla or not facts.get("tensorflow_problem") else
        f"not needed ({facts['tensorflow_problem']})")
    shown = (f"GPU {tensorflow}; onnxruntime "
             f"{'CUDA' if cuda else 'no CUDA'}; ptxas {facts['ptxas_version'] or found}"
             f"{order_text(facts)}")
    problems = needed_problems(facts)
    if device == "cpu":
        status, shown = "skipped", f"skipped (--device=cpu: {shown})"
    elif problems:  # one side only (both: the check does not start); its parts are skipped
        status, shown = "failed", f"failed ({shown}: {'; '.join(problems)})"
    elif not xla or (version is not None and version >= PTXAS_FLOOR):
        status = "ok"
    else:
        status = "failed"
        shown = (f"failed ({shown}: XLA wants {'.'.join(map(str, PTXAS_FLOOR))} or newer, "
                 "pip install 'nvidia-cuda-nvcc-cu12>=12.6.85')")
    return {"part": "gpu", "status": status, "seconds": 0.0, "result": shown, "details": facts}


# --------------------------------------------------- the in-process parts
def _devices(device):
    """The (checked, reference) TensorFlow devices: the GPU and the CPU, or the
    CPU twice (`--device=cpu`: the logic only)."""
    return ("/GPU:0" if device == "gpu" else "/CPU:0", "/CPU:0")


def _model_weights(cfg, batch, mem_len):
    """Initial weights of a seeded model (numpy), built once on the host so
    both devices start from the same numbers."""
    import keras
    from benchmarks.throughput import build_model
    keras.utils.set_random_seed(0)
    import tensorflow as tf
    with tf.device("/CPU:0"):
        return build_model(cfg, batch, mem_len, "float32", False).get_weights()


def logprob_parity(shape, device, batch=2, segments=2, seed=0):
    """The largest |log-prob difference| between the devices, with TF32 off."""
    import keras
    import tensorflow as tf
    from benchmarks.throughput import config_for
    from txl_tf.core import TransformerXL
    tf.config.experimental.enable_tensor_float_32_execution(False)
    cfg = config_for(shape)
    keras.utils.set_random_seed(seed)
    with tf.device("/CPU:0"):
        core = TransformerXL(cfg)
        ids = np.random.default_rng(seed).integers(0, cfg.n_token, (segments, batch, cfg.tgt_len))
    outputs = []
    for name in _devices(device):
        with tf.device(name):
            memory, log_probs = core.initial_memory(batch), []
            for segment in ids:
                out, memory = core(tf.constant(segment), memory, training=False)
                log_probs.append(out.numpy())
            outputs.append(np.stack(log_probs))
    difference = float(np.max(np.abs(outputs[0] - outputs[1])))
    params = sum(int(np.prod(w.shape)) for w in core.weights)
    limit = issue_targets.limit_of("logprob_parity")
    return {"max_abs_diff": difference, "ok": difference <= limit, "shape": shape,
            "parameters": params, "batch": batch, "segments": segments,
            "summary": f"max |d log-prob| {difference:.2e} (<= "
                       f"{issue_targets.number_text(limit)}: "
                       f"{'yes' if difference <= limit else 'NO'}); {shape}, {params:,} "
                       f"parameters, random weights (seed {seed}), TF32 off, {segments} "
                       f"segments of {batch}x{cfg.tgt_len}, memory {cfg.mem_len} carried"}


def _trained(strategy, cfg, batch, weights, batches, use_fit=False):
    """`(losses, final weights)` of training on `batches` from `weights`
    under `strategy`: each step's loss (`train_on_batch`), or with `use_fit`
    one `fit` over them and its epoch loss."""
    import tensorflow as tf
    from benchmarks.throughput import build_model
    with strategy.scope():
        model = build_model(cfg, batch, cfg.mem_len, "float32", "auto")
        model.set_weights(weights)
    if use_fit:
        xs, ys = (np.stack(part) for part in zip(*batches))
        history = model.fit(tf.data.Dataset.from_tensor_slices((xs, ys)), epochs=1, verbose=0,
                            shuffle=False)
        losses = history.history["loss"]
    else:
        losses = [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for x, y in batches]
    return losses, model.get_weights()


def _learnable_batches(cfg, batch, steps, seed=0):
    """`steps` batches of a stream that repeats a random 97-token phrase (the
    loss falls as the memory and the weights learn it)."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(0, cfg.n_token, 97)
    length = steps * cfg.tgt_len + 1
    stream = np.stack([np.resize(np.roll(phrase, k), length)
                       for k in rng.integers(0, 97, batch)]).astype(np.int32)
    return [(stream[:, i * cfg.tgt_len:(i + 1) * cfg.tgt_len],
             stream[:, i * cfg.tgt_len + 1:(i + 1) * cfg.tgt_len + 1]) for i in range(steps)]


def loss_curves(shape, device, steps=50, window=10):
    """Losses of the same seeded run on both devices, and the largest
    difference in each window of `window` steps."""
    import tensorflow as tf
    from benchmarks.throughput import SHAPES, config_for
    tf.config.experimental.enable_tensor_float_32_execution(False)
    cfg, batch = config_for(shape, dropout=0.0, dropatt=0.0), SHAPES[shape]["batch_size"]
    weights = _model_weights(cfg, batch, cfg.mem_len)
    batches = _learnable_batches(cfg, batch, steps)
    curves = [_trained(tf.distribute.OneDeviceStrategy(name), cfg, batch, weights, batches)[0]
              for name in _devices(device)]
    diffs = np.abs(np.array(curves[0]) - np.array(curves[1]))
    windows = [float(diffs[i:i + window].max()) for i in range(0, steps, window)]
    ok = (bool(np.isfinite(curves[0]).all())
          and windows[0] <= issue_targets.limit_of("seeded_losses"))
    return {"checked": curves[0], "reference": curves[1], "window": window,
            "max_abs_diff_per_window": windows, "ok": ok,
            "summary": f"{shape}, dropout 0, TF32 off: loss {curves[0][0]:.3f} -> "
                       f"{curves[0][-1]:.3f}; max |d loss| per {window} steps "
                       + ", ".join(f"{w:.1e}" for w in windows)}


def mirrored_equals_one_device(shape, device, steps=10):
    """`fit` under `MirroredStrategy` over the one device against
    `OneDeviceStrategy`: the epoch loss and the weights after `steps`."""
    import tensorflow as tf
    from benchmarks.throughput import SHAPES, config_for
    from training.strategy import mirrored_strategy
    # As the other parts compare: TF32 rounds matmul inputs to 10 bits, which
    # turns any reordering between the two programs into ~1e-3 of the loss.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    cfg, batch = config_for(shape, dropout=0.0, dropatt=0.0), SHAPES[shape]["batch_size"]
    weights = _model_weights(cfg, batch, cfg.mem_len)
    batches = _learnable_batches(cfg, batch, steps, seed=1)
    name = _devices(device)[0]
    runs = [_trained(strategy, cfg, batch, weights, batches, use_fit=True)
            for strategy in (mirrored_strategy([name]),
                             tf.distribute.OneDeviceStrategy(name))]
    loss_diff = float(np.max(np.abs(np.array(runs[0][0]) - np.array(runs[1][0]))))
    weight_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(runs[0][1], runs[1][1]))
    limit = issue_targets.limit_of("mirrored")
    ok = loss_diff <= limit and weight_diff <= limit
    return {"max_abs_loss_diff": loss_diff, "max_abs_weight_diff": weight_diff, "ok": ok,
            "summary": f"fit, {steps} steps on {name}, TF32 off: |d loss| {loss_diff:.1e}, "
                       f"max |d weight| {weight_diff:.1e} (<= "
                       f"{issue_targets.number_text(limit)}: {'yes' if ok else 'NO'})"}


IN_PROCESS = {"parity": logprob_parity, "losses": loss_curves,
              "mirrored": mirrored_equals_one_device}


# ------------------------------------------------------------ the train part
def resume_verdict(first_output, second_output, batches, train_log):
    """`(ok, line)` of a killed-and-resumed training run: the second run's
    resume line, its first batch at the resumed step, the batches both runs
    fed at the same steps equal, and the log ending at step 40.

    Args:
        first_output, second_output: the two runs' stdout and stderr.
        batches: the `batches.jsonl` records (`step`, `first_ids`, `pid`).
        train_log: the `train_log.jsonl` records."""
    found = re.search(r"resumed from \S+ckpt-(\d+) at step (\d+)", second_output)
    if not found:
        return False, "the second run printed no 'resumed from ... at step' line"
    step = int(found.group(2))
    pids = list(dict.fromkeys(b["pid"] for b in batches))
    if len(pids) != 2:
        return False, f"batches.jsonl holds {len(pids)} runs' batches, not 2"
    killed = {b["step"]: b["first_ids"] for b in batches if b["pid"] == pids[0]}
    resumed = [b for b in batches if b["pid"] == pids[1]]
    if not resumed or resumed[0]["step"] != step:
        return False, f"the resumed run's first batch is not step {step}"
    resumed_ids = {b["step"]: b["first_ids"] for b in resumed}
    both = [s for s in resumed_ids if s in killed]
    changed = [s for s in both if killed[s] != resumed_ids[s]]
    if not both or changed:
        return False, (f"steps {changed} got other batches after the resume" if changed else
                       "no step was fed by both runs (killed too early)")
    last = train_log[-1]["step"] if train_log else None
    if last != 40:
        return False, f"train_log.jsonl ends at step {last}, not 40"
    found = COMPILE_SECONDS.search(first_output)
    logged = [r["compile_s"] for r in train_log if r.get("compile_s") is not None]
    shown = (f"{found.group(1)} s" if found else f"{logged[0]:.1f} s" if logged
             else "not on the progress line")
    resumed_compile = COMPILE_SECONDS.search(second_output)
    if resumed_compile:  # the job's "train step: ..., XLA cache <dir>" line says it used one
        cache = ", XLA cache" if re.search(r"^train step: .*, XLA cache ", second_output,
                                           re.MULTILINE) else ""
        shown += f" (the resume's {resumed_compile.group(1)} s{cache})"
    return True, (f"killed with its batch log at step {max(killed)}, resumed at step {step} "
                  f"with the same batches ({len(both)} steps compared), ended at 40, exit 0; "
                  f"first step's compile {shown}")


def run_progress(output):
    """How far a training run's output got: its last progress line's step
    and the first step's compile seconds, as far as shown; with no step,
    how long its first call had run (its last `first call: ...` line)."""
    steps, waited = STEP_LINE.findall(output), FIRST_CALL_LINE.findall(output)
    found = COMPILE_SECONDS.search(output)
    return ((f"at step {steps[-1]}" if steps else
             f"no step shown, the first call running at {waited[-1]} s" if waited else
             "no step shown")
            + (f", compile {found.group(1)} s" if found else ""))


def _records(path):
    """The JSON lines of `path` (none if it is missing; a line being written
    is left out)."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


def run_train(command, work, timeout, env, xla_cache=True):
    """The `train` part: run, SIGKILL once the log shows a step past the
    first checkpoint, run again to the end; with `xla_cache`, XLA's
    persistent cache in `work`/xla_cache (the resume loads the program the
    first run compiled). Returns a part result; one that failed says how far
    each run got."""
    start, model_dir = time.monotonic(), os.path.join(work, "train")
    deadline = start + timeout
    env = dict(env or os.environ)
    if xla_cache:
        env["TF_XLA_FLAGS"] = (f"{env.get('TF_XLA_FLAGS', '')} --tf_xla_persistent_cache_"
                               f"directory={os.path.join(work, 'xla_cache')}").strip()
    log_path = os.path.join(model_dir, "batches.jsonl")
    with open(os.path.join(work, "train_first.log"), "w+", encoding="utf-8") as out:
        first = _started(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, preexec_fn=_die_with_check))
        checkpoint = os.path.join(model_dir, "checkpoints", "checkpoint")
        try:
            while first.poll() is None and time.monotonic() < deadline:
                if os.path.exists(checkpoint) and any(b.get("step", 0) > 20
                                                      for b in _records(log_path)):
                    break
                time.sleep(0.05)
        finally:
            _RUNNING["process"] = None
            if first.poll() is None:
                _kill_group(first)
            first.wait()
        if _RUNNING["stopped"]:
            raise Stopped(_RUNNING["stopped"])
        out.seek(0)
        first_output = out.read()
    first_run = f"the first run {run_progress(first_output)}"
    if first.returncode != -signal.SIGKILL:
        return _failed(f"the first run was not killed mid-run (exit {first.returncode}; "
                       f"{first_run})", start, first_output)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return _failed(f"timed out after {timeout:.0f} s (before the resume; {first_run})",
                       start, first_output)
    returncode, out, err = run_group(command, remaining, env)
    second_output = out + err
    if returncode is None:
        return _failed(f"timed out after {timeout:.0f} s (resuming; {first_run}, the resume "
                       f"{run_progress(second_output)})", start, second_output)
    if returncode != 0:
        return _failed(_last_line(second_output, f"the resumed run exited {returncode}"),
                       start, second_output)
    train_log = _records(os.path.join(model_dir, "train_log.jsonl"))
    ok, line = resume_verdict(first_output, second_output, _records(log_path), train_log)
    result = {"status": "ok" if ok else "failed", "seconds": time.monotonic() - start,
              "result": line if ok else f"failed ({line})", "output_tail": second_output[-3000:],
              "details": {"first_step_compile_s": compile_seconds(first_output, train_log),
                          "resume_compile_s": compile_seconds(second_output)}}
    return result


def compile_seconds(output, train_log=()):
    """The first step's compile seconds a training run showed: its progress
    line's (`COMPILE_SECONDS`), else the first `compile_s` of `train_log`'s
    records; None where neither has it."""
    found = COMPILE_SECONDS.search(output)
    if found:
        return float(found.group(1))
    logged = [r["compile_s"] for r in train_log if r.get("compile_s") is not None]
    return float(logged[0]) if logged else None


# ---------------------------------------------------------- orchestration
def _last_line(output, default):
    """The last `error:` line of `output`, else its last line, else `default`."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [default])[-1][:300]


def _failed(line, start, output=""):
    return {"status": "failed", "seconds": time.monotonic() - start, "result": f"failed ({line})",
            "output_tail": output[-3000:]}


class Stopped(Exception):
    """The check got SIGTERM while a part ran (`stop_on_sigterm`)."""


# The part's process group running now, and the signal that stopped the check
# (`stop_on_sigterm`): a part's processes are in sessions of their own, so a
# signal to the check's process group does not reach them.
_RUNNING = {"process": None, "stopped": None}


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # it is gone already
        pass


def _on_sigterm(signum, frame):
    del frame
    _RUNNING["stopped"] = signal.Signals(signum).name
    if _RUNNING["process"] is not None:
        _kill_group(_RUNNING["process"])


def stop_on_sigterm():
    """From now on SIGTERM (what a time limit such as the device call's sends
    first) kills the part running, with its children (the paper's worker),
    and stops the check: the part's row says so, the rest are skipped, and
    the table and the JSON are still written. Returns the previous handler."""
    _RUNNING["stopped"] = None
    return signal.signal(signal.SIGTERM, _on_sigterm)


def _prctl():
    """libc's `prctl`, looked up here (not in a forked child, where loading
    could deadlock on a lock another thread held), or None (not Linux)."""
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def _die_with_check():
    """In a part's process, before it starts (Linux): SIGKILL it when the
    check's process dies, also of SIGKILL (a time limit's second signal),
    which no handler sees; in a session of its own it would otherwise run on,
    on the GPU. (Its children, the paper's worker, end as their stdin closes.)"""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _started(process):
    """Registers `process` as the running part (raises `Stopped`, killing it,
    where the check was stopped meanwhile)."""
    _RUNNING["process"] = process
    if _RUNNING["stopped"]:
        _kill_group(process)
        process.communicate()
        raise Stopped(_RUNNING["stopped"])
    return process


def run_group(command, timeout, env):
    """`(exit status, stdout, stderr)` of `command`, run in a process group
    of its own; past `timeout` seconds the whole group (the paper's worker
    too) is killed and the status is None. Raises `Stopped` where the check
    got SIGTERM meanwhile (`stop_on_sigterm`: the group is killed)."""
    process = _started(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=env, start_new_session=True,
                                        preexec_fn=_die_with_check))
    try:
        out, err = process.communicate(timeout=timeout)
        returncode = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process)
        out, err = process.communicate()
        returncode = None
    except BaseException:  # Ctrl-C: the part's processes go too
        _kill_group(process)
        process.communicate()
        raise
    finally:
        _RUNNING["process"] = None
    if _RUNNING["stopped"]:
        raise Stopped(_RUNNING["stopped"])
    return returncode, out, err


def run_command(command, timeout, env):
    """A part run as `command` (a list): ok with the summary of its last
    `RESULT_PREFIX` line (or its last line), or failed (one line)."""
    start = time.monotonic()
    returncode, stdout, stderr = run_group(command, timeout, env)
    output = stdout + stderr
    phases = compile_phases(output)  # a stopped run's compiles too
    timed = {"compile_phases": phases} if phases else {}
    if returncode is None:
        return {**_failed(f"timed out after {timeout:.0f} s", start, output), **timed}
    if returncode != 0:
        return {**_failed(_last_line(output, f"exit {returncode}"), start, output), **timed}
    try:
        results = [json.loads(line[len(RESULT_PREFIX):]) for line in stdout.splitlines()
                   if line.startswith(RESULT_PREFIX)]
    except ValueError as e:
        return {**_failed(f"its result line is not JSON: {e}", start, output), **timed}
    if results:
        details = results[-1]
        ok = details.get("ok", True)
        return {"status": "ok" if ok else "failed", "seconds": time.monotonic() - start,
                "result": details["summary"] if ok else f"failed ({details['summary']})",
                "details": details, "output_tail": output[-3000:], **timed}
    written = output_file(command)
    line = _last_line(stdout, "exit 0") + (f" (all of it: {written})" if written else "")
    return {"status": "ok", "seconds": time.monotonic() - start, "result": line,
            "output_tail": output[-3000:], **timed}


def needs_onnxruntime(part):
    """Whether `part` needs onnxruntime's GPU (the serving parts and
    `ONNXRUNTIME_PARTS`) rather than TensorFlow's."""
    return part.startswith("serving_") or part in ONNXRUNTIME_PARTS


def reads_exports(part):
    """Whether `part` reads the serving exports (the serving parts and
    `EXPORT_PARTS`): with --serving_exports, they are copied and filled first."""
    return part.startswith("serving_") or part in EXPORT_PARTS


def part_envs(parts, env, facts):
    """The environments of the parts that run with another `LD_LIBRARY_PATH`
    than the check's: those that need onnxruntime's GPU (`needs_onnxruntime`)
    where `gpu_problems` found it working only in the other library order.

    Args:
        parts: the parts' names.
        env: the check's environment for its parts.
        facts: `gpu_problems`'s (its `library_order`), or None.

    Returns:
        `{part: environment}` (`run_parts`' `envs`); the parts left out run
        with `env`."""
    chosen = (facts or {}).get("library_order")
    if not chosen or chosen["onnxruntime"] == chosen["tensorflow"]:
        return {}
    path = dict(library_orders(env)).get(chosen["onnxruntime"])
    if path is None:  # env is not the environment the orders were probed in
        return {}
    serving = dict(env, LD_LIBRARY_PATH=path)
    return {part: serving for part in parts if needs_onnxruntime(part)}


def skip_reason(part, o, facts=None):
    """Why `part` cannot run with the options `o` (None: it can); with
    `facts` (`gpu_problems`), on a GPU where only one of TensorFlow and
    onnxruntime works, the parts that need the other; where TensorFlow is
    not installed, all but the serving parts over `--serving_exports` (the
    device tests export their own)."""
    if o["device"] == "gpu" and facts:
        needs = "onnxruntime_problem" if needs_onnxruntime(part) else "tensorflow_problem"
        if facts.get(needs):
            return facts[needs]
    if (facts or {}).get("tensorflow_installed") is False:  # onnxruntime's parts, on exports
        if not needs_onnxruntime(part):
            return NO_TENSORFLOW
        if part == "serving_device_tests":
            return f"{NO_TENSORFLOW} (the tests export their models)"
        if not o["serving_exports"]:
            return f"{NO_TENSORFLOW} (without --serving_exports the serving parts export)"
    if part in EXPORT_PARTS and not o["serving_exports"]:
        return "needs --serving_exports (its exports are made beforehand)"
    if part == "serving_device_tests" and o["device"] == "cpu":
        return "needs CUDA (on the CPU these tests are make test's)"
    return None


def make_serving_exports(folder, preset):
    """Writes the skeletons `--serving_exports` reads into `folder`: `preset`
    with random weights (seed 0), exported as `benchmarks.long_memory`
    exports it, once with its decode graphs in each dtype of
    `SERVING_DTYPES`, its large weights stripped (`long_memory.strip`); and
    serving_precision's exports of `PRECISION_MODEL`, whole, into
    `folder/PRECISION_FOLDER` (`long_memory.export_precisions`). Returns the
    folders written."""
    import tempfile

    import keras

    from benchmarks import long_memory
    from txl_tf import TransformerXL
    keras.utils.set_random_seed(0)
    core = TransformerXL(long_memory.preset_config(preset))
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        for dtype in SERVING_DTYPES:
            made = os.path.join(scratch, dtype)
            long_memory.export_random(core, made, formats=("onnx",), log_probs="all",
                                      decode_dtype=dtype)
            target = os.path.join(folder, dtype, preset, "out")
            shutil.rmtree(target, ignore_errors=True)
            long_memory.strip(os.path.join(made, "out"), target)
            written.append(target)
    precision = os.path.join(folder, PRECISION_FOLDER)
    shutil.rmtree(precision, ignore_errors=True)
    written += long_memory.export_precisions(PRECISION_MODEL, precision, PRECISION_MEM_LEN)
    return written


def check_serving_exports(folder, preset):
    """Raises `GpuCheckError` unless `folder` holds a skeleton of `preset`
    in each dtype of `SERVING_DTYPES` and serving_precision's exports
    (`make_serving_exports`)."""
    from benchmarks.long_memory import EXPORT_PRECISIONS

    def absent(*path):
        return not os.path.isfile(os.path.join(folder, *path, "out", "model.onnx"))

    dtypes = [dtype for dtype in SERVING_DTYPES if absent(dtype, preset)]
    precisions = [made for made, _ in EXPORT_PRECISIONS.values()
                  if absent(PRECISION_FOLDER, made)]
    missing = []
    if dtypes:
        missing.append(f"no {' or '.join(dtypes)} export of {preset} (<dtype>/{preset}/out)")
    if precisions:
        missing.append(f"no {' or '.join(precisions)} export of {PRECISION_MODEL} "
                       f"({PRECISION_FOLDER}/<precision>/out)")
    if missing:
        raise GpuCheckError(f"--serving_exports: {folder} has {' and '.join(missing)}; made by "
                            f"--make_serving_exports={folder}{' --tiny' * (preset == 'tiny')}")


def fill_serving_exports(folder, work_dir, seed=0):
    """The check's row for the skeletons in `folder`: copied into
    `work_dir` (the serving parts' work folders, `SERVING_DTYPES`) and their
    weights filled at random (`long_memory.fill`, `seed`)."""
    from benchmarks.long_memory import fill
    start = time.monotonic()
    try:
        filled = 0
        for dtype, name in SERVING_DTYPES.items():
            target = os.path.join(work_dir, name)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(folder, dtype), target)
            for out in sorted(os.listdir(target)):
                filled += fill(os.path.join(target, out, "out"), seed)
    except Exception as error:  # onnx's and the file system's: the serving parts fail alone
        return _failed(" ".join(str(error).split())[:300], start)
    return {"status": "ok", "seconds": time.monotonic() - start,
            "result": f"{filled} weights of the {' and '.join(SERVING_DTYPES)} exports filled "
                      f"at random (seed {seed}), from {folder}"}


def pair_summary(path):
    """One line of a throughput JSON file, whole or as far as a stopped run
    wrote it: each row's tok/s, ratio (`-` before its paper row; without
    paper rows, over the first row, which it names), peak memory and first
    step (or why it failed), in the order they ran; then the variant
    started and not done, with its first step's seconds once known."""
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    parts = []
    variants = [r["variant"] for r in result["results"] + result.get("started", [])]
    over = "" if any(v.startswith("paper ") for v in variants) or not variants \
        else f" {variants[0]}"  # no --reference_dir: throughput's ratio is over its first row
    for r in result["results"]:
        if "error" in r:
            parts.append(f"{r['variant']} failed ({r['error']})")
            continue
        memory = "" if r.get("peak_gib") is None else f", {r['peak_gib']:.1f} GiB"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x{over}"
        parts.append(f"{r['variant']} {r['tokens_per_s']:,.0f} tok/s ({ratio}"
                     f"{memory}, 1st {r['first_step_s']:.0f} s)")
    for r in result.get("started", []):
        parts.append(f"{r['variant']} not done (" + (
            "no step" if r["first_step_s"] is None else f"1st {r['first_step_s']:.0f} s") + ")")
    return "; ".join(parts)


def fused_summary(path):
    """The summary line of a `benchmarks.fused_step` JSON file, whole or as
    far as a stopped run wrote it (it writes its file after each form)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)["summary"]


def output_file(command):
    """The file a part's command writes (its `--output=`), or None."""
    written = [arg.split("=", 1)[1] for arg in command if arg.startswith("--output=")]
    return written[0] if written else None


def _json_of(path, most=4 * 2 ** 20):
    """The JSON content of `path`, or why not (larger than `most` bytes, or
    not JSON)."""
    size = os.path.getsize(path)
    if size > most:
        return {"not_copied": f"{path} holds {size:,} bytes"}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        return {"not_copied": f"{path}: {type(error).__name__}: {error}"[:300]}


def run_parts(commands, budgets, total_s, env, skip=None, train_work=None, xla_cache=True,
              done=None, envs=None, settings=None):
    """Runs the parts in order, each within `part_limit`: its budget and
    the time the parts before it left unused, never what the parts after it
    are budgeted (nor more than is left of `total_s`). `commands`: `{part:
    list}`, each run with `env`, or with `envs[part]` where given
    (`part_envs`); `skip`: `{part: reason}`; the
    `train` part (given `train_work`) is the kill-and-resume run (`run_train`,
    `xla_cache`); a part of `settings` (default `SETTINGS`) runs once per
    setting (`run_settings`); `done(rows)`, if given, is called after each part (the
    rows so far). After SIGTERM (`stop_on_sigterm`) the part running fails
    and the rest are skipped. Returns the table's rows."""
    settings = SETTINGS if settings is None else settings
    to_run = [part for part in commands if not (skip or {}).get(part)]
    now = time.monotonic()
    # where the budgets of the parts to run end (a part's slack is what those before it left
    # unused, not the time of the parts not run: a rerun of one part keeps its own budget)
    deadline, budgeted, rows = now + total_s, now + sum(budgets[p] for p in to_run), []
    for part, command in commands.items():
        now, written = time.monotonic(), output_file(command)
        left = deadline - now
        part_env = (envs or {}).get(part, env)
        later = to_run[to_run.index(part) + 1:] if part in to_run else []
        limit = part_limit(budgets[part], left, sum(budgets[p] for p in later), budgeted - now)
        if written and os.path.exists(written):  # an earlier check's
            os.remove(written)
        start = time.monotonic()
        try:
            if _RUNNING["stopped"]:
                result = {"status": "skipped", "seconds": 0.0,
                          "result": f"skipped (the check was stopped by {_RUNNING['stopped']})"}
            elif (skip or {}).get(part):
                result = {"status": "skipped", "seconds": 0.0,
                          "result": f"skipped ({skip[part]})"}
            elif left < 1:
                result = {"status": "skipped", "seconds": 0.0,
                          "result": f"skipped (the check's {max(total_s, 0):g} s were spent)"}
            elif part == "train" and train_work:
                result = run_train(command, train_work, limit, part_env, xla_cache)
            elif part in settings:
                result = run_settings(command, settings[part], limit, part_env)
            else:
                timers = COMPILE_TIMERS if part in TIMED_COMPILES else {}
                result = run_command(command, limit, with_settings(part_env, timers))
        except Stopped as why:
            result = _failed(f"stopped by {why} after {time.monotonic() - start:.0f} s", start)
        if written and os.path.exists(written):  # its numbers, in the check's one file
            result["json"] = _json_of(written)
        summarize = (pair_summary if part.startswith("pair_")
                     else settings_summary if part in settings
                     else fused_summary if part == "fused_step" else None)
        if summarize and written and os.path.exists(written):
            try:
                summary = summarize(written)  # a stopped run's rows too
            except (OSError, ValueError, KeyError, TypeError) as error:
                summary = f"its JSON unreadable: {type(error).__name__}: {error}"[:300]
            costliest = costliest_phase(result.get("compile_phases")) if part in TIMED_COMPILES \
                else ""
            if costliest:
                summary += f" (costliest compile phase: {costliest})"
            result["result"] = (summary if result["status"] == "ok"
                                else f"{result['result'][:-1]}; so far: {summary})")
        if part_env is not env:  # what a rerun of its command needs besides the check's
            result["env"] = {"LD_LIBRARY_PATH": part_env.get("LD_LIBRARY_PATH", "")}
        rows.append({"part": part, "command": shlex.join(command), **result})
        print(f"{part}: {result['result']}", flush=True)
        if done:
            done(rows)
    return rows


def setting_output(path, name):
    """The file a setting's run of a part writes: the part's `--output=`
    `path` with the setting's `name` before its extension."""
    root, extension = os.path.splitext(path)
    return f"{root}.{re.sub(r'[^A-Za-z0-9_-]+', '_', name)}{extension}"


def with_settings(env, extra):
    """`env` (None: this process's) with `extra`'s variables: a list of
    flags (`FLAG_LISTS`) added after the value it has (a space between),
    any other set."""
    env = dict(os.environ if env is None else env)
    for name, value in extra.items():
        env[name] = f"{env.get(name, '')} {value}".strip() if name in FLAG_LISTS else value
    return env


def costliest_phase(phases):
    """`"<label> <seconds> s"` of the costliest of `phases` (`compile_phases`)
    but the whole compile's, or "" where there is none."""
    inner = [(label, seconds) for label, seconds in (phases or {}).items()
             if label != WHOLE_COMPILE]
    return ", ".join(f"{label} {seconds:.1f} s" for label, seconds in inner[:1])


def compile_phases(output, top=8):
    """`{label: seconds}` of XLA's compile timers in a run's `output`
    (`COMPILE_TIMERS`; `TIMER_LINE`), each label's lines summed, a module's
    name dropped from the label (a last word after " for ", or in brackets), the `top`
    costliest, costliest first; {} where it logged none."""
    phases = collections.Counter()
    for label, micros in TIMER_LINE.findall(output):
        label = re.sub(r" for \S+$", "", re.sub(r"\[[^\]]*\]", "[...]", label)).strip()
        phases[label] += int(micros) / 1e6
    return dict(phases.most_common(top))


def setting_figures(data):
    """`(first step's seconds, tok/s, status word)` of a setting's
    throughput JSON (whole, or as far as a stopped run wrote it): its first
    row's figures; else the variant it started, its first step's seconds
    once known (tok/s None)."""
    results = [r for r in data.get("results", []) if isinstance(r, dict)]
    if results and "error" in results[0]:
        return None, None, f"failed ({results[0]['error']})"
    if results:
        return results[0].get("first_step_s"), results[0].get("tokens_per_s"), "done"
    started = [r for r in data.get("started", []) if isinstance(r, dict)]
    return (started[0].get("first_step_s") if started else None), None, "not done"


def run_settings(command, settings, timeout, env):
    """A part run once per setting (`SETTINGS`): `command` in a process of
    its own with the setting's variables added to `env` (`with_settings`),
    each run an equal share of what is left of `timeout`, writing its own
    file (`setting_output`); the part's own `--output=` file (rewritten
    after each run, and when the check is stopped) holds `{"settings":
    {name: {"env", "status", "result", "first_step_s", "tokens_per_s",
    "json"}}}`.

    Args:
        command: the part's argv (its `--output=` names the part's file).
        settings: `{name: {variable: value}}`.
        timeout: the part's seconds.
        env: the check's environment for the part (None: this process's).
    Returns:
        a part result: ok where every setting's run was; else failed,
        naming the runs that failed (its row's line: `settings_summary`)."""
    start, written = time.monotonic(), output_file(command)
    runs, failed, outputs = {}, [], []

    def save():
        if written:
            with open(written + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"settings": runs}, f, indent=1)
            os.replace(written + ".tmp", written)
    try:
        for i, (name, extra) in enumerate(settings.items()):
            own = setting_output(written, name) if written else None
            argv = [f"--output={own}" if own and arg == f"--output={written}" else arg
                    for arg in command]
            run_env = with_settings(env, extra)
            runs[name] = {"env": {k: run_env[k] for k in extra}, "status": "started",
                          "result": "", "first_step_s": None, "tokens_per_s": None}
            if own and os.path.exists(own):  # an earlier check's
                os.remove(own)
            share = max(0.0, timeout - (time.monotonic() - start)) / (len(settings) - i)
            try:
                result = run_command(argv, share, run_env)
            finally:  # a stopped run's figures so far too
                if own and os.path.exists(own):
                    runs[name]["json"] = _json_of(own)
                    if "not_copied" not in runs[name]["json"]:
                        first, speed, _ = setting_figures(runs[name]["json"])
                        runs[name].update(first_step_s=first, tokens_per_s=speed)
            runs[name].update(status=result["status"], result=result["result"],
                              compile_phases=result.get("compile_phases", {}))
            outputs.append(f"--- {name}\n{result.get('output_tail', '')}")
            if result["status"] != "ok":
                failed.append(f"{name}: {result['result'][len('failed ('):-1]}")
            save()
    finally:
        save()
    output = "\n".join(outputs)[-3000:]
    if failed:
        return _failed("; ".join(failed), start, output)
    return {"status": "ok", "seconds": time.monotonic() - start,
            "result": settings_summary(written) if written else "ok", "output_tail": output}


def settings_summary(path):
    """One line of a settings part's file (`run_settings`), whole or as far
    as it got: each setting's first step's seconds and tok/s (and its
    compile's costliest phase, where XLA's timers logged one), or how far
    its run got."""
    with open(path, encoding="utf-8") as f:
        runs = json.load(f)["settings"]
    parts = []
    for name, run in runs.items():
        data = run.get("json") if isinstance(run.get("json"), dict) else {}
        first, speed, state = setting_figures(data)
        costliest = costliest_phase(run.get("compile_phases"))
        if state == "done" and speed is not None:
            parts.append(f"{name} 1st {first:.1f} s, {speed:,.0f} tok/s" +
                         (f" (costliest compile phase: {costliest})" if costliest else ""))
        elif state.startswith("failed"):
            parts.append(f"{name} {state}")
        else:
            parts.append(f"{name} not done (" + (
                "no step" if first is None else f"1st {first:.1f} s") + ")")
    return "; ".join(parts)


def part_limit(budget, left, later, budgeted=None):
    """A part's seconds: its `budget`, or more where the parts before it
    finished early, never more than is `left` of the check's time; an
    earlier part's slack goes to a slow part instead of being lost, and a
    short `--total_s` still cuts the first parts last.

    Args:
        budget: the part's own seconds.
        left: what is left of `--total_s`.
        later: the budgets of the parts after it, summed.
        budgeted: what is left of the budgets of the parts run, this one's
            and the later ones' included (default `left`): time no part is
            budgeted (parts not run, a `--total_s` above their sum) is no
            earlier part's slack.
    Returns:
        seconds."""
    return min(left, max(budget, (left if budgeted is None else budgeted) - later))


def table(rows):
    """The check's one table: part, status, seconds, result (one line each)."""
    cells = [("part", "status", "s", "result")]
    cells += [(r["part"], r["status"], f"{r['seconds']:.0f}", r["result"]) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    lines = [f"{a:<{widths[0]}} | {b:<{widths[1]}} | {c:>{widths[2]}} | {d}"
             for a, b, c, d in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 6)
    return "\n".join(lines)


def write_result(path, rows, partial, **fields):
    """Writes the check's JSON to `path` whole (a kill never leaves half a
    file): `fields`, the parts that failed, the table, the rows, `partial`
    (true until the last part is done) and the issues' targets judged from
    them (`targets`: `issue_targets.entry`). Returns the failed parts."""
    failed = [r["part"] for r in rows if r["status"] == "failed"]
    check = {**fields, "partial": partial, "failed": failed, "table": table(rows), "parts": rows}
    try:
        check["targets"] = issue_targets.entry(check)
    except Exception as error:  # a bug in the judging must not cost the check its JSON
        check["targets"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(check, f, indent=2)
    os.replace(path + ".tmp", path)
    return failed


def commands_for(o, out_dir):
    """`{part: argv}` of the selected parts."""
    reference = ""
    if o["reference_dir"]:
        reference = (f"--reference_dir={shlex.quote(o['reference_dir'])} "
                     f"--reference_python={shlex.quote(o['reference_python'])}")
    fields = dict(sizes(o["tiny"], o["device"]), python=shlex.quote(sys.executable),
                  out=shlex.quote(out_dir), work=shlex.quote(o["work_dir"]), reference=reference,
                  reuse="--reuse_exports" if o.get("serving_exports") else "",
                  precision_model=PRECISION_MODEL, precision_mem_len=PRECISION_MEM_LEN,
                  precision_exports=shlex.quote(os.path.abspath(os.path.join(
                      o.get("serving_exports") or o["work_dir"], PRECISION_FOLDER))),
                  fused_forms=",".join(FUSED_FORMS),
                  decode_tolerance=issue_targets.number_text(
                      issue_targets.limit_of("decode_parity")))
    return {part: shlex.split(COMMANDS[part].format(**fields)) for part in o["parts"]}


def selected_parts(given):
    """The parts `--parts` names, in its order: each a part of `CHECKS` or
    a group of `GROUPS` (its parts), each part once.

    Args:
        given: the flag's items.
    Returns:
        a list of parts.
    Raises:
        BenchmarkError: an item is neither (`names_from`)."""
    names_from(given, "parts", CHECKS + list(GROUPS))
    parts = [part for name in given for part in GROUPS.get(name, (name,))]
    return list(dict.fromkeys(parts))


def main(argv):
    del argv
    o = values(SPEC)
    if o["run_part"]:  # one in-process part, in its own process (see COMMANDS)
        result = IN_PROCESS[o["run_part"]](o["shape"], o["device"])
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return
    o["parts"] = selected_parts(o["parts"])
    serving_preset = sizes(o["tiny"], o["device"])["serving_preset"]
    if o["make_serving_exports"]:
        for folder in make_serving_exports(o["make_serving_exports"], serving_preset):
            print(f"wrote {folder}")
        return
    if o["serving_exports"]:
        check_serving_exports(o["serving_exports"], serving_preset)
    start = time.monotonic()  # the check's seconds and --total_s: its probes' too
    problems, facts = gpu_problems(o["device"], o["parts"])
    if o["device"] == "gpu" and problems and len(problems) == len(facts["needed"]):
        # one side working still runs its parts
        raise GpuCheckError(f"no GPU for the check: {'; '.join(problems)} "
                            "(install the [gpu] extra on a machine with an NVIDIA GPU; "
                            "--device=cpu --tiny runs the check's logic on the CPU)")
    # Fresh; the corpus cache is kept.
    for folder in ("train", "xla_cache", *SERVING_DTYPES.values()):
        shutil.rmtree(os.path.join(o["work_dir"], folder), ignore_errors=True)
    os.makedirs(o["work_dir"], exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    out_dir = os.path.abspath(o["parts_dir"] or os.path.dirname(os.path.abspath(o["output"])))
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, TF_FORCE_GPU_ALLOW_GROWTH="true",  # TensorFlow beside torch
               TXL_DEVICE_TESTS="cuda" if o["device"] == "gpu" else "cpu",  # device tests
               PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(),
                                                        os.environ.get("PYTHONPATH")])))
    rows = [dict(gpu_row(facts, o["device"]), seconds=time.monotonic() - start)]
    print(f"gpu: {rows[0]['result']}", flush=True)

    def save(rows, partial=True):  # after every part: a check killed keeps what it measured
        return write_result(o["output"], rows, partial, seconds=time.monotonic() - start,
                            device=o["device"], tiny=o["tiny"],
                            flags={name: os.environ.get(name, "") for name in FLAG_LISTS})

    save(rows)
    stop_on_sigterm()
    total_s = o["total_s"] - rows[0]["seconds"]
    if o["serving_exports"] and any(reads_exports(part) for part in o["parts"]):
        rows.append({"part": "serving_exports", "command": "",
                     **fill_serving_exports(o["serving_exports"], o["work_dir"])})
        print(f"serving_exports: {rows[-1]['result']}", flush=True)
        total_s -= rows[-1]["seconds"]
        save(rows)
    budgets = {part: seconds * o["budget_scale"] for part, seconds in BUDGETS.items()}
    skip = {part: skip_reason(part, o, facts) for part in o["parts"]}
    rows += run_parts(commands_for(o, out_dir), budgets, total_s, env, skip,
                      train_work=o["work_dir"], xla_cache=o["xla_cache"],
                      done=lambda done_rows: save(rows + done_rows),
                      envs=part_envs(o["parts"], env, facts))
    shown = table(rows)
    print(shown)
    failed = save(rows, partial=False)
    with open(o["output"], encoding="utf-8") as f:
        targets = json.load(f)["targets"]
    print("\nthe issues' targets (python -m benchmarks.issue_targets " + o["output"] + "):\n"
          + targets.get("table", f"error: {targets.get('error')}"))
    print(f"wrote {o['output']}; {len(failed)} of {len(rows)} parts failed"
          + (f": {', '.join(failed)}" if failed else ""))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main, SPEC)
