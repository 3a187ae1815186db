"""The export job: model directory → SavedModel and/or ONNX, then a parity check.

```
python -m export --model_dir=runs/tiny --output_dir=exported/tiny \
    --formats=saved_model,onnx --mem_len=64 --opset=17 --log_probs=all
```
Output directory: `saved_model/`, `model.onnx`, `config.json`, `vocab/` (if
the model has one) and `export_report.json` (settings, timings, parity).
"""
import json
import logging
import os
import shutil
import time

import tensorflow as tf
from absl import flags

from export.metadata import export_metadata
from export.model_dir import CONFIG_FILE, VOCAB_DIR, load_model
from export.onnx_export import DEFAULT_OPSET, export_onnx
from export.parity import check_parity, random_segments
from export.runtime import ONNX_FILE, SAVED_MODEL_DIR, open_runtime
from export.saved_model import export_saved_model
from export.serving_module import LOG_PROBS_MODES

FORMATS = ("saved_model", "onnx")


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
    flags.DEFINE_list("formats", list(FORMATS), "Any of saved_model, onnx.", flag_values=fv)
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
               formats=FORMATS, mem_len=None, opset=DEFAULT_OPSET, log_probs="all",
               zero_filled_memory=None, verify=True, tolerance=1e-4):
    """Exports and returns the report dict (also written to export_report.json)."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats}")
    loaded = load_model(model_dir, config, weights, vocab_dir)
    core, cfg = loaded.core, loaded.config
    mem_len = cfg.mem_len if mem_len is None else int(mem_len)
    if zero_filled_memory is None:
        zero_filled_memory = cfg.zero_filled_memory
    os.makedirs(output_dir, exist_ok=True)
    cfg.to_json(os.path.join(output_dir, CONFIG_FILE))
    if loaded.vocab_dir:
        shutil.copytree(loaded.vocab_dir, os.path.join(output_dir, VOCAB_DIR),
                        dirs_exist_ok=True)
    options = dict(mem_len=mem_len, log_probs=log_probs, zero_filled=zero_filled_memory)
    report = {"metadata": export_metadata(cfg, **options), "seconds": {}}
    if "saved_model" in formats:
        start = time.perf_counter()
        export_saved_model(core, os.path.join(output_dir, SAVED_MODEL_DIR),
                           vocab_dir=loaded.vocab_dir, **options)
        report["seconds"]["saved_model"] = round(time.perf_counter() - start, 2)
    if "onnx" in formats:
        start = time.perf_counter()
        export_onnx(core, os.path.join(output_dir, ONNX_FILE), opset=opset, **options)
        report["seconds"]["onnx"] = round(time.perf_counter() - start, 2)
    if verify:
        # float32 parity needs float32 matmuls (TF enables TF32 on Ampere+ GPUs).
        tf.config.experimental.enable_tensor_float_32_execution(False)
        backends = [b for b in ("onnx", "saved_model") if b in formats]
        runtimes = [open_runtime(output_dir, backend=b) for b in backends]
        segments = random_segments(cfg.n_token, 2, min(cfg.tgt_len, 8))
        report["parity"] = check_parity(core, runtimes, segments, tolerance)
        logging.info("parity with the Keras core: %s", report["parity"])
    with open(os.path.join(output_dir, "export_report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    return report


def run_from_flags(fv=flags.FLAGS):
    """Runs `run_export` with parsed flag values."""
    if not fv.model_dir and not (fv.config and fv.weights):
        raise flags.ValidationError("pass --model_dir, or both --config and --weights")
    return run_export(fv.output_dir, fv.model_dir, fv.config, fv.weights, fv.vocab_dir,
                      fv.formats, fv.mem_len, fv.opset, fv.log_probs, fv.zero_filled_memory,
                      fv.verify, fv.tolerance)


def main(argv):
    """The `python -m export` entry (run through `training.cli.run`)."""
    if len(argv) > 1:
        raise flags.Error(f"unexpected arguments: {argv[1:]}")
    report = run_from_flags()
    print(json.dumps(report["seconds"]), json.dumps(report.get("parity", {})))
