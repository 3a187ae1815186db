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
(`export.staging.staged_folder`, which `export.classifier` uses too; the
Triton repository's model folders are replaced together by
`export.staging.staged_folders`).
"""
import contextlib
import gc
import json
import logging
import os
import shutil
import sys
import time

import tensorflow as tf

from export import open_runtime
from export.decode_cache import cache_bytes
from export.metadata import (CACHE_DTYPES, DECODE_DTYPES, export_metadata, external_data_file,
                             weights_quantization)
from export.onnx_export import (DEFAULT_OPSET, EXTERNAL_DATA_THRESHOLD, export_decode_onnx,
                                export_onnx, write_weights_file)
from export.onnx_runtime import return_freed_memory, token_file
from export.parity import (check_cached_decode, check_runtime, core_outputs,
                           random_segments)
from export.runtime import ONNX_FILE, SAVED_MODEL_DIR
from export.saved_model import LOG_PROBS_MODES, export_saved_model
from export.staging import staged_folder
from export.triton import (DEFAULT_MODEL_NAME, SUFFIX as CACHED_SUFFIX, check_cached_model,
                           check_triton_model, check_triton_options, model_file,
                           write_triton_repository)
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way, refuse_links_out_of
from txl_tf.app.tf_logs import logging_as_found
from txl_tf.checks.memory_budget import check_fits, memory_bytes
from txl_tf.errors import TxlError
from txl_tf.weights import model_dir as model_dir_loader
from txl_tf.weights.checkpoints import CONFIG_FILE, VOCAB_DIR

log = logging.getLogger(__name__)

DEFAULT_FORMATS = ("saved_model", "onnx")
FORMATS = DEFAULT_FORMATS + ("triton",)
TRITON_DIR = "triton"
# The parity check: streams, segments and their length (at most the model's tgt_len).
PARITY_BATCH, PARITY_SEGMENTS, PARITY_SEGMENT_LEN = 2, 3, 8


class ExportError(TxlError):
    """The export cannot start: a bad option, or an output path in the way."""


# The job's options, declared once: its flags (`python -m export`) and the
# keywords of `run_export` (`txl_tf.app.flagspec`).
SPEC = (
    option("string", "model_dir", None, "Directory with config.json, weights.npz and "
           "optionally vocab/."),
    option("string", "config", None, "TransformerXLConfig JSON (overrides model_dir's)."),
    option("string", "weights", None, "Core weights (weights.npz, or a .keras model with a "
           ".core); overrides model_dir's."),
    option("string", "vocab_dir", None, "Vocabulary folder shipped with the export."),
    option("string", "output_dir", None, "Where the exported artefacts go."),
    option("list", "formats", list(DEFAULT_FORMATS), "Any of saved_model, onnx, triton (a "
           "Triton Inference Server model repository in triton/)."),
    option("string", "triton_model_name", DEFAULT_MODEL_NAME, "The model's name (and folder) "
           "in the Triton repository."),
    option("integer", "triton_max_batch_size", 16, "Streams Triton runs in one batch (>= 1)."),
    option("integer", "mem_len", None, "Memory length fixed in the export, >= 0 (default: "
           "the config's mem_len)."),
    option("integer", "opset", DEFAULT_OPSET, "ONNX opset."),
    option("enum", "log_probs", "all", "'all' positions [B, T, V] or only the 'last' one "
           "[B, V].", list(LOG_PROBS_MODES)),
    option("bool", "zero_filled_memory", None, "Fresh memory is attended zeros (the paper TF "
           "code's start) instead of empty (default: the config's zero_filled_memory)."),
    option("bool", "verify", True, "Check the exported models against the Keras core on "
           "random segments."),
    option("float", "tolerance", 1e-4, "Max abs difference allowed by --verify."),
    option("bool", "decode_cache", True, "Also write the cached decode interface as "
           "decode_*.onnx beside model.onnx (all of them read the weights from "
           "model.onnx.data); the SavedModel always carries it (attn_type 0: other types "
           "have none, and need --nodecode_cache)."),
    option("enum", "cache_dtype", None, "The dtype of the keys and values in the ONNX "
           "decode graphs' cache (float16 halves them; its parity is in "
           "docs/export-and-serving.md; default: --decode_dtype's). model.onnx and the "
           "SavedModel stay float32.", list(CACHE_DTYPES)),
    option("enum", "decode_dtype", "float32", "The dtype the ONNX decode graphs compute in, "
           "with their weights and their cache's keys and values (float16: for a GPU; its "
           "parity is in docs/export-and-serving.md). model.onnx and the SavedModel stay "
           "float32.", list(DECODE_DTYPES)),
    option("bool", "overwrite", False, "Replace a non-empty --output_dir (the new export is "
           "swapped in whole once it has passed)."),
)


MIN_OPSET = 13


def max_opset():
    """The newest opset tf2onnx converts to."""
    from tf2onnx.constants import OPSET_TO_IR_VERSION
    return max(OPSET_TO_IR_VERSION)


@logging_as_found()
def run_export(output_dir=None, model_dir=None, *, triton_options=None,
               external_data_threshold=EXTERNAL_DATA_THRESHOLD, **options):
    """Exports a model and writes `export_report.json`.

    A non-empty `output_dir` is refused unless `overwrite`. Everything is
    written into a temporary sibling folder that replaces `output_dir` whole
    at the end, so a failed export (parity included) leaves it as it was.

    Args:
      output_dir: the export's folder.
      model_dir: a model or training run directory (or `config` and `weights`).
      triton_options: more options of `export.triton.write_triton_repository`
        (e.g. `max_candidate_sequences`) when `formats` holds `triton`;
        `model_name` and `max_batch_size` here win over `triton_model_name`
        and `triton_max_batch_size`.
      external_data_threshold: ONNX tensors from this many bytes go to
        external data (`export.onnx_export`).
      **options: the rest of `SPEC` by name (`formats`, `mem_len`, `opset`,
        `log_probs`, `verify`, `tolerance`, `decode_cache`, `overwrite`, ...).

    Returns:
      The report dict: `metadata` (`export_metadata`'s, which holds the
  settings), `seconds` (per stage), `decode_cache_bytes`, `parity` (with
  `verify`) and `files`.

    Raises:
      ExportError: a bad option, or an output folder in the way.
      TypeError: an option name `SPEC` does not know.
    """
    o = export_options(output_dir=output_dir, model_dir=model_dir, triton_options=triton_options,
                       external_data_threshold=external_data_threshold, **options)
    output_dir = o["output_dir"]
    source = model_dir_loader.resolve(o["model_dir"], config_path=o["config"],
                                      weights_path=o["weights"], vocab_dir=o["vocab_dir"])
    _check_output_holds_no_input(o, source)
    if source.vocab_dir:  # copied into the export whole
        try:
            refuse_links_out_of(source.vocab_dir)
        except TxlError as err:
            raise ExportError(str(err)) from None
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not o["overwrite"]:
        raise ExportError(f"output folder {output_dir!r} is not empty; pass --overwrite "
                          "(overwrite=True) to replace its contents")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ExportError(f"output path {output_dir!r} exists and is not a folder")
    in_the_way = path_in_the_way("output_dir", output_dir, utf8_paths=True)  # a file above it
    if in_the_way:
        raise ExportError(in_the_way)
    # What the config alone decides is checked before the weights load.
    cfg = model_dir_loader.load_config(source)
    _check_model_options(o, cfg)
    if o["vocab_dir"]:  # copied into the export as its vocab/: this model's tokenizer
        try:
            model_dir_loader.load_vocab(o["vocab_dir"], cfg)
        except TxlError as err:
            raise ExportError(f"--vocab_dir: {err}") from None
    stages = StageLog()
    with staged_folder(output_dir) as staging:
        report = _export_into(staging, stages, o, source, cfg)
    stages.done("done", output_dir)
    return report


def export_options(triton_options=None, external_data_threshold=EXTERNAL_DATA_THRESHOLD,
                   **options):
    """The options of one export, checked (see `run_export` for the arguments).

    Returns:
      `SPEC`'s defaults updated with `options`, `output_dir` made absolute,
      `formats` a tuple, `triton_model_name` and `triton_max_batch_size`
      folded into `triton_options`, and `external_data_threshold`.
    """
    o = merge(SPEC, options)
    _check_options(o)
    o["cache_dtype"] = o["cache_dtype"] or o["decode_dtype"]
    triton = {"model_name": o.pop("triton_model_name"),
              "max_batch_size": o.pop("triton_max_batch_size"), **(triton_options or {})}
    return {**o, "output_dir": os.path.abspath(o["output_dir"]), "formats": tuple(o["formats"]),
            "triton_options": triton, "external_data_threshold": external_data_threshold}


def _check_options(o):
    """Raises `ExportError` naming the first bad flag of the merged options `o`."""
    if not o["output_dir"]:
        raise ExportError("--output_dir is required")
    if not o["model_dir"] and not (o["config"] and o["weights"]):
        raise ExportError("pass --model_dir, or both --config and --weights")
    formats = o["formats"]
    if isinstance(formats, str):  # the flag's text, given to `run_export`
        raise ExportError(f"--formats must be a list of {', '.join(FORMATS)}, not a string: "
                          f"formats={formats.split(',')!r}, got {formats!r}")
    if not formats or not set(formats) <= set(FORMATS):
        given = ",".join(map(str, formats or ()))
        raise ExportError(f"--formats must be a non-empty list of {', '.join(FORMATS)}, "
                          f"got {given!r}")
    if not isinstance(o["opset"], int) or not MIN_OPSET <= o["opset"] <= max_opset():
        raise ExportError(f"--opset must be an ONNX opset from {MIN_OPSET} to {max_opset()} "
                          f"(tf2onnx's newest), got {o['opset']}")
    if o["log_probs"] not in LOG_PROBS_MODES:
        raise ExportError(f"--log_probs must be one of {', '.join(LOG_PROBS_MODES)}, "
                          f"got {o['log_probs']!r}")
    if o["mem_len"] is not None and o["mem_len"] < 0:
        raise ExportError(f"--mem_len must be >= 0, got {o['mem_len']}")
    if not o["tolerance"] >= 0:  # NaN too
        raise ExportError(f"--tolerance must be >= 0, got {o['tolerance']}")
    if o["tolerance"] == float("inf"):
        raise ExportError(f"--tolerance must be finite (inf passes any difference), got "
                          f"{o['tolerance']}")
    if o["cache_dtype"] not in (None,) + CACHE_DTYPES:
        raise ExportError(f"--cache_dtype must be one of {', '.join(CACHE_DTYPES)}, got "
                          f"{o['cache_dtype']!r}")
    if o["decode_dtype"] not in DECODE_DTYPES:
        raise ExportError(f"--decode_dtype must be one of {', '.join(DECODE_DTYPES)}, got "
                          f"{o['decode_dtype']!r}")
    if o["cache_dtype"] not in (None, "float32") and (
            "onnx" not in o["formats"] or not o["decode_cache"]):
        raise ExportError(f"--cache_dtype={o['cache_dtype']} is the ONNX decode graphs' cache: "
                          "it needs onnx in --formats and --decode_cache")
    if o["decode_dtype"] != "float32":
        if o["cache_dtype"] not in (None, o["decode_dtype"]):
            raise ExportError(f"--decode_dtype={o['decode_dtype']} keeps the keys and values "
                              f"in {o['decode_dtype']}: drop --cache_dtype={o['cache_dtype']}")
        if "onnx" not in o["formats"] or not o["decode_cache"]:
            raise ExportError(f"--decode_dtype={o['decode_dtype']} is the ONNX decode graphs' "
                              "dtype: it needs onnx in --formats and --decode_cache")
    if o["triton_max_batch_size"] < 1:
        raise ExportError(f"--triton_max_batch_size must be >= 1, got "
                          f"{o['triton_max_batch_size']}")


def _check_output_holds_no_input(o, source):
    """Refuses an output folder that is, or holds, one of the export's inputs
    (replacing it would destroy them, e.g. `--output_dir` = the training run);
    `source` is the inputs' `ModelSource`."""
    output_dir = o["output_dir"]
    inputs = [o["model_dir"], source.config_path, source.weights_path, source.vocab_dir]
    real_output = os.path.realpath(output_dir)
    for path in filter(None, inputs):
        path = os.path.abspath(path)
        real = os.path.realpath(path)  # an input reached through a symbolic link too
        if os.path.commonpath([output_dir, path]) == output_dir or \
                os.path.commonpath([real_output, real]) == real_output:
            raise ExportError(f"output folder {output_dir!r} holds the export's input "
                              f"{path!r}; choose another --output_dir")


def _check_model_options(o, cfg):
    """Raises `ExportError` on options of `o` that the model's config `cfg`
    rules out (or `check_fits`'s error on a size this machine cannot hold)."""
    formats = o["formats"]
    if cfg.attn_type != 0 and "onnx" in formats and o["decode_cache"]:
        raise ExportError(f"attn_type {cfg.attn_type} has no cached decode interface (the "
                          "decode graphs serve attn_type 0): pass --nodecode_cache")
    mem_len = cfg.mem_len if o["mem_len"] is None else int(o["mem_len"])
    check_fits(cfg, 1, 1, mem_len, what="the exported graph's smallest step")
    if o["verify"]:  # the Keras core's outputs, kept while each artefact is checked against them
        check_fits(cfg, PARITY_BATCH, min(cfg.tgt_len, PARITY_SEGMENT_LEN), mem_len,
                   what="the parity check (--noverify skips it)",
                   extra={"reference memories": 2 * PARITY_SEGMENTS * memory_bytes(
                       cfg, PARITY_BATCH, mem_len)})
    if "triton" in formats:
        try:
            # `cached` is an option of the repository, not of its config.
            check_triton_options(mem_len, log_probs=o["log_probs"], **{
                k: v for k, v in o["triton_options"].items() if k != "cached"})
        except (TypeError, ValueError) as error:
            text = str(error)
            for name in ("model_name", "max_batch_size"):  # the flags' names beside them
                if text.startswith(name + " "):
                    text = f"{name} (--triton_{name}){text[len(name):]}"
            raise ExportError(f"cannot write a Triton repository: {text}") from None


def _export_into(out, stages, o, source, cfg):
    """Writes the export of options `o` (`export_options`) of the model at
    `source` (a `ModelSource`, its config `cfg`) into the folder `out`,
    logging each stage to `stages`; returns the report."""
    formats, log_probs, opset = o["formats"], o["log_probs"], o["opset"]
    triton_options, threshold = o["triton_options"], o["external_data_threshold"]
    core = model_dir_loader.load_core(source, config=cfg)
    cfg, vocab_dir = core.config, source.vocab_dir
    del source
    stages.done("loading", f"{core.count_params():,} parameters")
    mem_len = cfg.mem_len if o["mem_len"] is None else int(o["mem_len"])
    parity_len = min(cfg.tgt_len, PARITY_SEGMENT_LEN)
    zero_filled_memory = cfg.zero_filled_memory if o["zero_filled_memory"] is None \
        else o["zero_filled_memory"]
    cfg.to_json(os.path.join(out, CONFIG_FILE))
    if vocab_dir:
        shutil.copytree(vocab_dir, os.path.join(out, VOCAB_DIR), dirs_exist_ok=True)
    options = dict(mem_len=mem_len, log_probs=log_probs, zero_filled=zero_filled_memory)
    dtypes = {"cache_dtype": o["cache_dtype"], "decode_dtype": o["decode_dtype"]}
    report = {"metadata": export_metadata(cfg, **options, **dtypes,
                                          quantization=weights_quantization(core)),
              "seconds": {},
              "decode_cache_bytes": cache_bytes(cfg, mem_len, o["cache_dtype"])}
    if "saved_model" in formats:
        stages.begin("SavedModel")
        start = time.perf_counter()
        export_saved_model(core, os.path.join(out, SAVED_MODEL_DIR),
                           vocab_dir=vocab_dir, **options)
        _free()  # the serving module's copy of the weights
        report["seconds"]["saved_model"] = round(time.perf_counter() - start, 2)
        stages.done("SavedModel", SAVED_MODEL_DIR)
    if "onnx" in formats:
        stages.begin("ONNX conversion and weights")
        start = time.perf_counter()
        onnx_path = os.path.join(out, ONNX_FILE)
        # With the decode graphs, every graph reads one copy of the weights.
        shared = write_weights_file(core.weights, external_data_file(onnx_path)) \
            if o["decode_cache"] else None
        written = export_onnx(core, onnx_path, opset=opset, weights_file=shared,
                              external_data_threshold=threshold, **dtypes, **options)
        if o["decode_cache"]:
            written += export_decode_onnx(core, out, mem_len, shared, opset, **dtypes,
                                          zero_filled=zero_filled_memory) + [shared.path]
        _free()
        report["seconds"]["onnx"] = round(time.perf_counter() - start, 2)
        stages.done("ONNX conversion and weights", ", ".join(os.path.basename(p)
                                                            for p in written))
    if "triton" in formats:
        stages.begin("Triton repository")
        start = time.perf_counter()
        written = write_triton_repository(core, os.path.join(out, TRITON_DIR), opset=opset,
                                          external_data_threshold=threshold,
                                          **options, **triton_options)
        _free()
        report["seconds"]["triton"] = round(time.perf_counter() - start, 2)
        stages.done("Triton repository", ", ".join(os.path.relpath(p, out) for p in written))
    if o["verify"]:
        stages.begin("parity")
        start = time.perf_counter()
        with _float32_matmuls():
            segments = random_segments(cfg.n_token, PARITY_BATCH, parity_len, PARITY_SEGMENTS)
            reference = core_outputs(core, segments, **options)
            by_token = core_outputs(core, segments, **options, token_by_token=True)
            stages.done("parity, the Keras core's outputs")
            # The Keras core is not needed past its reference outputs: freed, its
            # weights make no room for those of the runtimes opened next.
            del core
            _free()
            report["parity"] = _parity(reference, by_token, segments, out, formats,
                                       o["tolerance"],
                                       triton_options.get("model_name", DEFAULT_MODEL_NAME),
                                       stages)
        report["seconds"]["parity"] = round(time.perf_counter() - start, 2)
        stages.done("parity", json.dumps(report["parity"]))
    report["files"] = _listing(out) + ["export_report.json"]
    with open(os.path.join(out, "export_report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    return report


@contextlib.contextmanager
def _float32_matmuls():
    """TF32 off for the block (float32 parity needs float32 matmuls; TF
    enables TF32 on Ampere+ GPUs), then as the caller had it."""
    enabled = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(enabled)


def _parity(reference, by_token, segments, out, formats, tolerance, triton_model_name,
            stages=None):
    """Checks one runtime at a time (each closed before the next opens) against
    the core's `reference` outputs on `segments` (and its cached decode
    interface against `by_token`, the same segments read a token at a time);
    each check's line goes to `stages` (a `StageLog`) as it ends: minutes
    apiece at the paper's largest sizes."""
    def done(what, diff):
        if stages is not None:
            stages.done(f"parity, {what}", json.dumps(diff))
    report = {}
    for backend in (b for b in ("onnx", "saved_model") if b in formats):
        # One copy of the ONNX weights in memory: the check's speed does not matter.
        runtime = open_runtime(out, backend=backend,
                               **({"low_memory": True} if backend == "onnx" else {}))
        name = runtime.backend
        report[name] = check_runtime(reference, runtime, segments, tolerance, by_token)
        done(name, report[name])
        del runtime
        _free()
        if backend == "onnx" and token_file(os.path.join(out, ONNX_FILE)):
            # The step a GPU replays (`decode_token` over fixed buffers), on the
            # CPU; one copy of the weights again (each hot path packs its own).
            runtime = open_runtime(out, backend="onnx", device="cpu", device_cache=True,
                                   cuda_graph=True, low_memory=True)
            report[name]["decode_token"] = check_cached_decode(
                runtime, segments, by_token, tolerance, "onnx's decode_token")
            done(f"{name} decode_token", report[name]["decode_token"])
            del runtime
            _free()
    if "triton" in formats:
        path = model_file(os.path.join(out, TRITON_DIR), triton_model_name)
        report["triton"] = check_triton_model(reference, path, segments, tolerance)
        done("triton", report["triton"])
        cached = model_file(os.path.join(out, TRITON_DIR), triton_model_name + CACHED_SUFFIX)
        if os.path.isfile(cached):
            report["triton_cached"] = check_cached_model(reference, cached, segments, tolerance)
            done("triton_cached", report["triton_cached"])
    log.info("parity with the Keras core: %s", report)
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
    """Prints one line per finished stage (stderr) with the seconds since the
    start, and one as each long stage begins (`stage...`)."""

    def __init__(self, stream=None):
        self.start = time.perf_counter()
        self.stream = stream

    def begin(self, stage):
        self.done(stage + "...")

    def done(self, stage, detail=""):
        line = f"[export {time.perf_counter() - self.start:7.1f}s{_peak_rss()}] {stage}" + \
            (f": {detail}" if detail else "")
        print(line, file=self.stream or sys.stderr, flush=True)


def main(argv):
    """The `python -m export` entry (run through `txl_tf.app.cli.run`, which
    refuses stray arguments): exports with the parsed flags."""
    del argv
    report = run_export(**values(SPEC))
    # One JSON document on one line (export_report.json in the folder holds the whole report).
    print(json.dumps({"seconds": report["seconds"], "parity": report.get("parity", {})}))
