r"""What a 16-bit decode cache would cost in exactness, and what it would save.

    python -m benchmarks.cache_precision --model_dir=RUN --dataset=wt2 --data_dir=DIR \
        [--split=test] [--mem_len=640] [--tokens=1000] [--streams=4]

A trained model (a training job's `--model_dir`) reads held-out text one
token at a time through the decode cache (`TransformerXL.call_with_cache`, the
step every backend runs), once with the cache's keys and values in float32
and once with them rounded to bfloat16 and to float16 after every step (the
values a 16-bit cache would hold; the arithmetic stays float32, so only the
storage's precision is measured). Per precision: perplexity of the text, the
largest and the mean change of a target's log-probability against float32,
and how often the most likely next token changes. Also the cache's size per
stream at each preset's paper memory, float32 against 16-bit keys and values.
Prints a table and writes JSON.
"""
import os
import sys
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

PRECISIONS = ("float32", "bfloat16", "float16")
PAPER_MEMORY = {"enwik8_base": 2100, "enwik8_large": 3800, "wt103_base": 1600,
                "wt103_large": 1600}

SPEC = (
    option("string", "model_dir", None, "A training job's model directory."),
    option("string", "dataset", "wt2", "Corpus name (as training.evaluate)."),
    option("string", "data_dir", None, "The corpus folder."),
    option("string", "cache_dir", None, "Where encoded corpora are cached."),
    option("string", "split", "test", "Which split to read."),
    option("integer", "mem_len", 640, "Memory length of the decode cache."),
    option("integer", "tokens", 1000, "Tokens read per stream."),
    option("integer", "streams", 4, "Streams (rows) read at once, each from its own part of the "
           "split."),
    option("string", "output",
           os.path.join(REPO, "benchmarks", "results", "cache_precision.json"),
           "Where to write the JSON results."),
)


def read_through_cache(core, ids, mem_len, precision):
    """Log-probabilities `[T, B, V]` of reading `ids` (`[B, T]`) one token at
    a time on a decode cache whose keys and values are rounded to
    `precision` after every step."""
    import numpy as np
    import tensorflow as tf
    rounded = tf.as_dtype(precision)

    def stored(cache):
        if rounded == tf.float32:
            return cache
        return cache._replace(**{name: tuple(tf.cast(tf.cast(t, rounded), t.dtype)
                                             for t in getattr(cache, name))
                                 for name in ("keys", "values")})

    @tf.function
    def step(token, cache):
        hidden, cache = core.call_with_cache(token, cache)
        return core.crit(hidden), stored(cache)

    cache = stored(core.decode_cache(core.initial_memory(ids.shape[0], mem_len=mem_len)))
    out = []
    for t in range(ids.shape[1]):
        log_probs, cache = step(tf.constant(ids[:, t]), cache)
        out.append(log_probs.numpy())
    return np.stack(out)


def compare(reference, other, targets):
    """Perplexity of `other` and its changes against `reference` (`[T, B, V]`)."""
    import numpy as np
    picked = np.take_along_axis(other, targets.T[:, :, None], -1)[..., 0]
    base = np.take_along_axis(reference, targets.T[:, :, None], -1)[..., 0]
    change = np.abs(picked - base)
    return {"ppl": float(np.exp(-picked.mean())), "max_abs_log_prob_change": float(change.max()),
            "mean_abs_log_prob_change": float(change.mean()),
            "argmax_changed": float((other.argmax(-1) != reference.argmax(-1)).mean())}


def cache_sizes():
    """Bytes per stream at each preset's paper memory: float32 and 16-bit keys and values."""
    import numpy as np
    from export.decode_cache import cache_shapes
    from txl_tf import TransformerXLConfig
    rows = []
    for preset, mem_len in PAPER_MEMORY.items():
        shapes = cache_shapes(TransformerXLConfig.preset(preset, mem_len=mem_len), mem_len, 1)
        count = {name: int(np.prod(shape)) for name, shape in shapes.items()}
        keys_values = count["keys"] + count["values"]
        rest = 4 * count["cache_mems"] + count["valid"]
        rows.append({"preset": preset, "mem_len": mem_len,
                     "float32_mb": (4 * keys_values + rest) / 1e6,
                     "keys_values_16bit_mb": (2 * keys_values + rest) / 1e6})
    return rows


def run(o):
    import numpy as np
    from benchmarks.throughput import write_json
    from training import inputs
    from training.errors import TrainingError
    from training.evaluate import load_core
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    core, source = load_core(o["model_dir"])
    tokenizer = inputs.model_tokenizer(o["model_dir"], source.vocab_dir, core.config)
    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"], {}, tokenizer=tokenizer)
    text = np.asarray(corpus.split(o["split"]))
    per_stream = min(o["tokens"] + 1, len(text) // o["streams"])
    ids = text[:o["streams"] * per_stream].reshape(o["streams"], per_stream)
    inputs_, targets = ids[:, :-1], ids[:, 1:]
    runs, start = {}, time.time()
    for precision in PRECISIONS:
        runs[precision] = read_through_cache(core, inputs_, o["mem_len"], precision)
    rows = [{"precision": p, **compare(runs["float32"], runs[p], targets)} for p in PRECISIONS]
    result = {"settings": o, "tokens": int(targets.size), "seconds": time.time() - start,
              "rows": rows, "sizes": cache_sizes()}
    print(f"{o['model_dir']}: {targets.size:,} tokens of {o['split']} read one at a time, "
          f"memory {o['mem_len']}")
    print("| keys and values stored in | ppl | max abs log-prob change | mean | argmax changed |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['ppl']:.3f} | {r['max_abs_log_prob_change']:.2e} | "
              f"{r['mean_abs_log_prob_change']:.2e} | {100 * r['argmax_changed']:.2f}% |")
    print("| preset | memory | per stream, float32 | with 16-bit keys and values |")
    print("|---|---|---|---|")
    for r in result["sizes"]:
        print(f"| {r['preset']} | {r['mem_len']:,} | {r['float32_mb']:.1f} MB | "
              f"{r['keys_values_16bit_mb']:.1f} MB |")
    write_json(o["output"], result)


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
