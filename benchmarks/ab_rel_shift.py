r"""The relative shift's two forms, each step timed beside the other in one
process: the scores padded (`rel_shift`, the attention before 2026-12-02)
against the position encodings padded (`with_pad_row` + `rel_shift_padded`,
the attention since). An A/B kept only for the commit that measured it
(benchmarks/NOTES.md, "The relative shift's pad").

Keras rows: two `TransformerXLLM`s from the same seed, one traced with the
old form, `train_on_batch` or `test_on_batch` alternating (the first round
old first, the next new first), the ratio taken round by round. ONNX rows:
the same random core exported in each form, both sessions on the CPU
provider, `run` alternating the same way. Each row also states the two
forms' largest output difference.

    python -m benchmarks.ab_rel_shift --rounds=12
"""
import contextlib
import json
import os
import tempfile
import time

import numpy as np

from benchmarks.common import write_json
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

FLAGS_SPEC = [
    option("integer", "rounds", 12, "Timed steps of each form per row."),
    option("string", "output", "benchmarks/results/ab_rel_shift.json", "JSON results file."),
]
# (shape, batch, segment, memory, step, XLA) of the Keras rows.
KERAS_ROWS = [("enwik8_base", 1, 512, 2100, "eval", False),
              ("enwik8_base", 2, 512, 512, "train", False),
              ("enwik8_base", 2, 512, 512, "train", True)]
ONNX_BATCHES = (1, 4)


@contextlib.contextmanager
def old_form():
    """The attention traced inside is the scores-padded form."""
    import txl_tf.layers.attention as attention
    from txl_tf.layers.rel_shift import rel_shift
    kept = attention.with_pad_row, attention.rel_shift_padded
    attention.with_pad_row, attention.rel_shift_padded = (lambda keys, axis: keys), rel_shift
    try:
        yield
    finally:
        attention.with_pad_row, attention.rel_shift_padded = kept


def alternate(old, new, rounds):
    """Median seconds of `old()` and `new()` and the median, min and max of
    their round-by-round ratio, old over new."""
    times = {old: [], new: []}
    for r in range(rounds):
        for fn in ((old, new) if r % 2 == 0 else (new, old)):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times[old], times[new])]
    return {"old_ms": 1e3 * float(np.median(times[old])),
            "new_ms": 1e3 * float(np.median(times[new])),
            "old_over_new": float(np.median(ratios)), "ratio_min": min(ratios),
            "ratio_max": max(ratios)}


def keras_row(shape, batch, segment, memory, step, jit, rounds):
    import keras
    from benchmarks.throughput import build_model, config_for, random_ids
    cfg = config_for(shape, tgt_len=segment, mem_len=memory,
                     **({"dropout": 0.0} if step == "eval" else {}))
    ids = random_ids(batch * (segment + 1), cfg.n_token).reshape(batch, -1)
    x, y = ids[:, :segment], ids[:, 1:]

    def made():
        keras.utils.set_random_seed(0)
        model = build_model(cfg, batch, memory, "float32", jit)
        run = model.train_on_batch if step == "train" else model.test_on_batch
        first = run(x, y)  # traced (and compiled) here, in the form of the caller
        run(x, y)
        return (lambda: run(x, y)), first
    with old_form():
        old, old_first = made()
    new, new_first = made()
    row = alternate(old, new, rounds)
    row.update(backend="keras", shape=shape, batch=batch, segment=segment, memory=memory,
               step=step + ("+jit" if jit else ""),
               max_abs_diff=float(np.max(np.abs(np.subtract(old_first, new_first)))))
    return row


def onnx_rows(batches, rounds):
    import keras
    import onnx
    import onnxruntime as ort

    from benchmarks import long_memory
    from txl_tf import TransformerXL
    keras.utils.set_random_seed(0)
    config = long_memory.preset_config("enwik8_base")
    core = TransformerXL(config)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        with old_form():
            long_memory.export_random(core, os.path.join(scratch, "old"), formats=("onnx",),
                                      log_probs="all", decode_cache=False)
        long_memory.export_random(core, os.path.join(scratch, "new"), formats=("onnx",),
                                  log_probs="all", decode_cache=False)
        sessions, pads = {}, {}
        for form in ("old", "new"):
            options = ort.SessionOptions()
            options.optimized_model_filepath = os.path.join(scratch, form + ".opt.onnx")
            sessions[form] = ort.InferenceSession(os.path.join(scratch, form, "out", "model.onnx"),
                                                  options, providers=["CPUExecutionProvider"])
            graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
            pads[form] = sum(node.op_type == "Pad" for node in graph.node)
        rng = np.random.default_rng(0)
        for batch in batches:
            feed = {"token_ids": rng.integers(0, config.n_token, (batch, config.tgt_len),
                                              dtype=np.int32),
                    "mems": rng.normal(0, 1, (config.n_layer, batch, config.mem_len,
                                              config.d_model)).astype(np.float32),
                    "mem_mask": np.ones((batch, config.mem_len), bool)}
            outs = {form: s.run(None, feed)[0] for form, s in sessions.items()}
            row = alternate(lambda: sessions["old"].run(None, feed),
                            lambda: sessions["new"].run(None, feed), rounds)
            row.update(backend="onnx (CPU)", shape="enwik8_base", batch=batch,
                       segment=config.tgt_len, memory=config.mem_len, step="eval",
                       max_abs_diff=float(np.max(np.abs(outs["old"] - outs["new"]))),
                       pads_old=pads["old"], pads_new=pads["new"])
            rows.append(row)
    return rows


def main(argv):
    del argv
    o = values(FLAGS_SPEC)
    rows = [keras_row(*spec, o["rounds"]) for spec in KERAS_ROWS]
    rows += onnx_rows(ONNX_BATCHES, o["rounds"])
    for row in rows:
        print(f"{row['backend']:10} {row['shape']} batch {row['batch']} {row['segment']}/"
              f"{row['memory']} {row['step']:10} old {row['old_ms']:8.1f} ms  new "
              f"{row['new_ms']:8.1f} ms  old/new {row['old_over_new']:.3f} "
              f"[{row['ratio_min']:.3f}, {row['ratio_max']:.3f}]  |diff| {row['max_abs_diff']:.1e}")
    write_json(o["output"], {"rounds": o["rounds"], "rows": rows})


if __name__ == "__main__":
    cli.run(main, FLAGS_SPEC)
