"""The export job: model directory → SavedModel, ONNX and/or a Triton model
repository, then a parity check.

```
python -m export --model_dir=runs/tiny --output_dir=exported/tiny \
    --formats=saved_model,onnx --mem_len=64 --opset=17 --log_probs=all
```
Output directory: `saved_model/`, `model.onnx` and the cached decode
interface's graphs (`decode_*.onnx`), which all read their weights from one
`model.onnx.data` (with `--nodecode_cache`, `model.onnx` alone holds them,
up to 2 GB),
`triton/` (with `--formats=...,triton`; see `export.triton`),
`config.json`, `vocab/` (if the model has one) and `export_report.json`
(settings, timings, parity, files). A non-empty output directory needs
`--overwrite`; the new export replaces it whole, or not at all: it is
written into a staging sibling folder swapped in on success
(`staged_folder`, which `export.classifier` uses too).
"""
import contextlib
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
import time

import tensorflow as tf
from absl import flags

from export import open_runtime
from export.decode_cache import cache_bytes
from export.metadata import export_metadata, external_data_file
from export.onnx_export import (DEFAULT_OPSET, EXTERNAL_DATA_THRESHOLD, export_decode_onnx,
                                export_onnx, write_weights_file)
from export.onnx_runtime import return_freed_memory
from export.parity import check_runtime, core_outputs, random_segments
from export.runtime import ONNX_FILE, SAVED_MODEL_DIR
from export.saved_model import LOG_PROBS_MODES, export_saved_model
from export.triton import (DEFAULT_MODEL_NAME, SUFFIX as CACHED_SUFFIX, check_cached_model,
                           check_triton_model, check_triton_options, model_file,
                           write_triton_repository)
from txl_tf.checks.memory_budget import check_fits, memory_bytes
from txl_tf.errors import TxlError
from txl_tf.weights import model_dir as model_dir_loader
from txl_tf.weights.checkpoints import CONFIG_FILE, VOCAB_DIR

DEFAULT_FORMATS = ("saved_model", "onnx")
FORMATS = DEFAULT_FORMATS + ("triton",)
TRITON_DIR = "triton"
# The parity check: streams, segments and their length (at most the model's tgt_len).
PARITY_BATCH, PARITY_SEGMENTS, PARITY_SEGMENT_LEN = 2, 3, 8


class ExportError(TxlError):
    """The export cannot start: bad formats, or an output path in the way."""


def define_flags(flag_values=flags.FLAGS):
    """Defines the job's flags on `flag_values` (a fresh FlagValues in tests)."""
    fv = flag_values
    flags.DEFINE_string("model_dir", None, "Directory with config.json, weights.npz "
                        "and optionally vocab/.", flag_values=fv)
    flags.DEFINE_string("config", None, "TransformerXLConfig JSON (overrides model_dir's).",
                        flag_values=fv)
    flags.DEFINE_string("weights", None, "Core weights (weights.npz, or a .keras model with "
                        "a .core); overrides model_dir's.", flag_values=fv)
    flags.DEFINE_string("vocab_dir", None, "Vocabulary folder shipped with the export.",
                        flag_values=fv)
    flags.DEFINE_string("output_dir", None, "Where the exported artefacts go.", flag_values=fv)
    flags.DEFINE_list("formats", list(DEFAULT_FORMATS), "Any of saved_model, onnx, triton "
                      "(a Triton Inference Server model repository in triton/).",
                      flag_values=fv)
    flags.DEFINE_string("triton_model_name", DEFAULT_MODEL_NAME, "The model's name (and "
                        "folder) in the Triton repository.", flag_values=fv)
    flags.DEFINE_integer("triton_max_batch_size", 16, "Streams Triton runs in one batch.",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("mem_len", None, "Memory length fixed in the export (default: the "
                         "config's mem_len).", lower_bound=0, flag_values=fv)
    flags.DEFINE_integer("opset", DEFAULT_OPSET, "ONNX opset.", flag_values=fv)
    flags.DEFINE_enum("log_probs", "all", LOG_PROBS_MODES, "'all' positions [B, T, V] or "
                      "only the 'last' one [B, V].", flag_values=fv)
    flags.DEFINE_bool("zero_filled_memory", None, "Fresh memory is attended zeros (the paper "
                      "TF code's start) instead of empty (default: the config's "
                      "zero_filled_memory).", flag_values=fv)
    flags.DEFINE_bool("verify", True, "Check the exported models against the Keras core on "
                      "random segments.", flag_values=fv)
    flags.DEFINE_float("tolerance", 1e-4, "Max abs difference allowed by --verify.",
                       flag_values=fv)
    flags.DEFINE_bool("decode_cache", True, "Also write the cached decode interface as "
                      "decode_*.onnx beside model.onnx (all of them read the weights from "
                      "model.onnx.data); the SavedModel always carries it.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace a non-empty --output_dir (the new export "
                      "is swapped in whole once it has passed).", flag_values=fv)
    flags.mark_flag_as_required("output_dir", flag_values=fv)
    flags.register_validator(
        "formats", lambda value: bool(value) and set(value) <= set(FORMATS),
        f"--formats must be a non-empty list of {', '.join(FORMATS)}", flag_values=fv)
    flags.register_validator(
        "opset", lambda value: value is None or MIN_OPSET <= value <= max_opset(),
        f"--opset must be an ONNX opset from {MIN_OPSET} to {max_opset()} (tf2onnx's newest)",
        flag_values=fv)
    flags.register_validator("tolerance", lambda value: value is not None and value >= 0,
                             "--tolerance must be >= 0", flag_values=fv)


MIN_OPSET = 13


def max_opset():
    """The newest opset tf2onnx converts to."""
    from tf2onnx.constants import OPSET_TO_IR_VERSION
    return max(OPSET_TO_IR_VERSION)


def run_export(output_dir, model_dir=None, config=None, weights=None, vocab_dir=None,
               formats=DEFAULT_FORMATS, mem_len=None, opset=DEFAULT_OPSET, log_probs="all",
               zero_filled_memory=None, verify=True, tolerance=1e-4, overwrite=False,
               external_data_threshold=EXTERNAL_DATA_THRESHOLD, triton_options=None,
               decode_cache=True):
    """Exports and returns the report dict (also written to export_report.json).

    `triton_options` go to `export.triton.write_triton_repository` (e.g.
    `model_name`, `max_batch_size`) when `formats` holds `triton`.
    `decode_cache`: also write `decode_init.onnx` / `decode_step.onnx`
    (`export.decode_interface`) with the ONNX model.

    A non-empty `output_dir` is refused unless `overwrite`. Everything is
    written into a temporary sibling folder that replaces `output_dir` whole
    at the end, so a failed export (parity included) leaves it as it was.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ExportError(f"formats must be a non-empty subset of {FORMATS}, got {formats}")
    output_dir = os.path.abspath(output_dir)
    _check_output_holds_no_input(output_dir, model_dir, config, weights, vocab_dir)
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise ExportError(f"output folder {output_dir!r} is not empty; pass --overwrite "
                              "(overwrite=True) to replace its contents")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ExportError(f"output path {output_dir!r} exists and is not a folder")
    stages = StageLog()
    with staged_folder(output_dir) as staging:
        report = _export_into(staging, stages, model_dir, config, weights, vocab_dir, formats,
                              mem_len, opset, log_probs, zero_filled_memory, verify,
                              tolerance, external_data_threshold, dict(triton_options or {}),
                              decode_cache)
    stages.done("done", output_dir)
    return report


def _check_output_holds_no_input(output_dir, model_dir, config, weights, vocab_dir):
    """Refuses an output folder that is, or holds, one of the export's inputs
    (replacing it would destroy them, e.g. `--output_dir` = the training run)."""
    from txl_tf.weights.model_dir import resolve
    source = resolve(model_dir, config_path=config, weights_path=weights, vocab_dir=vocab_dir)
    inputs = [model_dir, source.config_path, source.weights_path, source.vocab_dir]
    for path in filter(None, inputs):
        path = os.path.abspath(path)
        if os.path.commonpath([output_dir, path]) == output_dir:
            raise ExportError(f"output folder {output_dir!r} holds the export's input "
                              f"{path!r}; choose another --output_dir")


def _export_into(out, stages, model_dir, config, weights, vocab_dir, formats, mem_len, opset,
                 log_probs, zero_filled_memory, verify, tolerance, external_data_threshold,
                 triton_options, decode_cache):
    core, source = model_dir_loader.load(model_dir, config_path=config, weights_path=weights,
                                         vocab_dir=vocab_dir)
    cfg, vocab_dir = core.config, source.vocab_dir
    del source
    stages.done("loading", f"{core.count_params():,} parameters")
    mem_len = cfg.mem_len if mem_len is None else int(mem_len)
    check_fits(cfg, 1, 1, mem_len, what="the exported graph's smallest step")
    parity_len = min(cfg.tgt_len, PARITY_SEGMENT_LEN)
    if verify:  # the Keras core's outputs, kept while each artefact is checked against them
        check_fits(cfg, PARITY_BATCH, parity_len, mem_len,
                   what="the parity check (--noverify skips it)",
                   extra={"reference memories": 2 * PARITY_SEGMENTS * memory_bytes(
                       cfg, PARITY_BATCH, mem_len)})
    if zero_filled_memory is None:
        zero_filled_memory = cfg.zero_filled_memory
    if "triton" in formats:
        try:
            check_triton_options(mem_len, log_probs=log_probs, **triton_options)
        except (TypeError, ValueError) as error:
            raise ExportError(f"cannot write a Triton repository: {error}") from None
    cfg.to_json(os.path.join(out, CONFIG_FILE))
    if vocab_dir:
        shutil.copytree(vocab_dir, os.path.join(out, VOCAB_DIR), dirs_exist_ok=True)
    options = dict(mem_len=mem_len, log_probs=log_probs, zero_filled=zero_filled_memory)
    report = {"metadata": export_metadata(cfg, **options), "seconds": {},
              "decode_cache_bytes": cache_bytes(cfg, mem_len)}
    if "saved_model" in formats:
        start = time.perf_counter()
        export_saved_model(core, os.path.join(out, SAVED_MODEL_DIR),
                           vocab_dir=vocab_dir, **options)
        _free()  # the serving module's copy of the weights
        report["seconds"]["saved_model"] = round(time.perf_counter() - start, 2)
        stages.done("SavedModel", SAVED_MODEL_DIR)
    if "onnx" in formats:
        start = time.perf_counter()
        onnx_path = os.path.join(out, ONNX_FILE)
        # With the decode graphs, every graph reads one copy of the weights.
        shared = write_weights_file(core.weights, external_data_file(onnx_path)) \
            if decode_cache else None
        written = export_onnx(core, onnx_path, opset=opset, weights_file=shared,
                              external_data_threshold=external_data_threshold, **options)
        if decode_cache:
            written += export_decode_onnx(core, out, mem_len, shared, opset) + [shared.path]
        _free()
        report["seconds"]["onnx"] = round(time.perf_counter() - start, 2)
        stages.done("ONNX conversion and weights", ", ".join(os.path.basename(p)
                                                            for p in written))
    if "triton" in formats:
        start = time.perf_counter()
        written = write_triton_repository(core, os.path.join(out, TRITON_DIR), opset=opset,
                                          external_data_threshold=external_data_threshold,
                                          **options, **triton_options)
        _free()
        report["seconds"]["triton"] = round(time.perf_counter() - start, 2)
        stages.done("Triton repository", ", ".join(os.path.relpath(p, out) for p in written))
    if verify:
        start = time.perf_counter()
        # float32 parity needs float32 matmuls (TF enables TF32 on Ampere+ GPUs).
        tf.config.experimental.enable_tensor_float_32_execution(False)
        segments = random_segments(cfg.n_token, PARITY_BATCH, parity_len, PARITY_SEGMENTS)
        reference = core_outputs(core, segments, **options)
        by_token = core_outputs(core, segments, **options, token_by_token=True)
        # The Keras core is not needed past its reference outputs: freed, its
        # weights make no room for those of the runtimes opened next.
        del core
        _free()
        report["parity"] = _parity(reference, by_token, segments, out, formats, tolerance,
                                   triton_options.get("model_name", DEFAULT_MODEL_NAME))
        report["seconds"]["parity"] = round(time.perf_counter() - start, 2)
        stages.done("parity", json.dumps(report["parity"]))
    report["files"] = _listing(out) + ["export_report.json"]
    with open(os.path.join(out, "export_report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    return report


def _parity(reference, by_token, segments, out, formats, tolerance, triton_model_name):
    """Checks one runtime at a time (each closed before the next opens) against
    the core's `reference` outputs on `segments` (and its cached decode
    interface against `by_token`, the same segments read a token at a time)."""
    report = {}
    for backend in (b for b in ("onnx", "saved_model") if b in formats):
        # One copy of the ONNX weights in memory: the check's speed does not matter.
        runtime = open_runtime(out, backend=backend,
                               **({"low_memory": True} if backend == "onnx" else {}))
        report[runtime.backend] = check_runtime(reference, runtime, segments, tolerance,
                                                by_token)
        del runtime
        _free()
    if "triton" in formats:
        path = model_file(os.path.join(out, TRITON_DIR), triton_model_name)
        report["triton"] = check_triton_model(reference, path, segments, tolerance)
        cached = model_file(os.path.join(out, TRITON_DIR), triton_model_name + CACHED_SUFFIX)
        if os.path.isfile(cached):
            report["triton_cached"] = check_cached_model(reference, cached, segments, tolerance)
    logging.info("parity with the Keras core: %s", report)
    return report


def _free():
    """Collects the stage's garbage and hands the C heap's free pages back to
    the system, so that the next stage's peak does not sit on this one's."""
    gc.collect()
    return_freed_memory()


def _listing(folder):
    """Relative paths of the files under `folder`, sorted."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def _peak_rss():
    """`", peak RSS 1.23 GB"` on Linux (VmHWM), else ``."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return ""
    return f", peak RSS {kb / 1e6:.2f} GB"


class StageLog:
    """Prints one line per finished stage (stderr) with the seconds since the start."""

    def __init__(self, stream=None):
        self.start = time.perf_counter()
        self.stream = stream

    def done(self, stage, detail=""):
        line = f"[export {time.perf_counter() - self.start:7.1f}s{_peak_rss()}] {stage}" + \
            (f": {detail}" if detail else "")
        print(line, file=self.stream or sys.stderr, flush=True)


def run_from_flags(fv=flags.FLAGS):
    """Runs `run_export` with parsed flag values."""
    if not fv.model_dir and not (fv.config and fv.weights):
        raise flags.ValidationError("pass --model_dir, or both --config and --weights")
    return run_export(fv.output_dir, fv.model_dir, fv.config, fv.weights, fv.vocab_dir,
                      fv.formats, fv.mem_len, fv.opset, fv.log_probs, fv.zero_filled_memory,
                      fv.verify, fv.tolerance, overwrite=fv.overwrite,
                      decode_cache=fv.decode_cache,
                      triton_options={"model_name": fv.triton_model_name,
                                      "max_batch_size": fv.triton_max_batch_size})


def main(argv):
    """The `python -m export` entry (run through `txl_tf.app.cli.run`, which
    refuses stray arguments)."""
    del argv
    report = run_from_flags()
    print(json.dumps(report["seconds"]), json.dumps(report.get("parity", {})))


# --------------------------- the output folder, written whole or not at all
@contextlib.contextmanager
def staged_folder(output_dir):
    """Yields a fresh, empty sibling folder of `output_dir` to write into. If
    the block succeeds the staging folder replaces `output_dir` whole
    (`swap_in`); if it raises, the staging folder is removed and `output_dir`
    is left as it was."""
    output_dir = os.path.abspath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    remove_stale(output_dir)
    staging = tempfile.mkdtemp(prefix=_prefix(output_dir, "tmp"), dir=parent)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would become the output folder's mode
    try:
        yield staging
        swap_in(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def swap_in(staging, output_dir):
    """Replaces `output_dir` by `staging` (same parent: the renames are atomic)."""
    if not os.path.exists(output_dir):
        os.rename(staging, output_dir)
        return
    old = tempfile.mkdtemp(prefix=_prefix(output_dir, "old"), dir=os.path.dirname(output_dir))
    os.rmdir(old)
    os.rename(output_dir, old)
    try:
        os.rename(staging, output_dir)
    except BaseException:
        os.rename(old, output_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _prefix(output_dir, kind):
    """`.<name>.<kind>-<pid>-`: the owner's pid in the name tells a killed
    export's leftovers from a running one's."""
    return f".{os.path.basename(output_dir)}.{kind}-{os.getpid()}-"


def remove_stale(output_dir):
    """Deletes the staging and old folders of `output_dir` whose export is
    no longer running (it was killed); returns their names."""
    parent, name = os.path.split(os.path.abspath(output_dir))
    removed = []
    for entry in os.listdir(parent) if os.path.isdir(parent) else ():
        for kind in ("tmp", "old"):
            head = f".{name}.{kind}-"
            if not entry.startswith(head):
                continue
            pid = entry[len(head):].split("-", 1)[0]
            if not pid.isdigit() or not _alive(int(pid)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
                removed.append(entry)
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
