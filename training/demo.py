r"""`make demo`: what a Transformer-XL's memory is for, in a few minutes on a CPU.

    python -m training.demo [--model=pystdlib_small] [--finetune_seconds=60] \
        [--finetune_steps=0] [--output_dir=runs/demo]

Starts from the model shipped with the package (`pystdlib_small`: the small
preset trained for about an hour on this Python's standard library, bytes;
`txl_tf/weights/shipped/pystdlib_small/TRAINING.md` has its command), or
from any model directory (`--model`), and shows:

1. its validation bits per byte with a long memory, the memory it was
   trained with, and none;
2. its loss against the context it sees (each position of a long segment
   read from an empty memory sees exactly that many bytes before it);
3. a sampled and a greedy continuation of a prompt, read with the memory;
4. a short fine-tune as a keras-hub causal LM on this library's own source
   (`txl_tf/`), and the bits per byte on `export/`'s source, which it did not
   train on, before and after.

`--output_dir` keeps the loss-by-context picture and the fine-tuned preset.
"""
import glob
import os
import time

from txl_tf.app import cli
from txl_tf.app.files import replacing
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way
from txl_tf.app.tf_logs import logging_as_found
from txl_tf.generation.request import MAX_NEW_TOKENS

SPEC = (
    option("string", "model", "pystdlib_small", "The model to start from: a shipped model's "
           "name or a model directory (a byte-level model of Python source)."),
    option("integer", "eval_segments", 60, "Validation segments per evaluation (x batch 8 "
           "x 64 bytes)."),
    option("integer", "context", 256, "The longest context of the loss-by-context curve."),
    option("string", "prompt", "import os\n\n\ndef ", "Prompt to continue."),
    option("integer", "num_tokens", 200, "Bytes to generate."),
    option("float", "finetune_seconds", 60, "Fine-tuning time (0, and no --finetune_steps: "
           "skip the fine-tune)."),
    option("integer", "finetune_steps", 0, "Fine-tuning steps (0: as many as fit in "
           "--finetune_seconds; otherwise exactly these, the same work on any machine)."),
    option("float", "finetune_learning_rate", 3e-4, "Adam's rate when fine-tuning."),
    option("string", "output_dir", None, "Where the loss-by-context PNG and the fine-tuned "
           "preset go (default: nothing is written)."),
)


def _check(o):
    from training.errors import TrainingError
    for name in ("eval_segments", "context"):
        if o[name] < 1:
            raise TrainingError(f"--{name} must be positive, got {o[name]}")
    for name in ("num_tokens", "finetune_seconds", "finetune_steps"):
        if not o[name] >= 0:  # NaN too
            raise TrainingError(f"--{name} must be >= 0, got {o[name]}")
    if o["num_tokens"] > MAX_NEW_TOKENS:  # what one decode call holds
        raise TrainingError(f"--num_tokens must be in [0, {MAX_NEW_TOKENS}], got "
                            f"{o['num_tokens']}")
    if not 0 < o["finetune_learning_rate"] < float("inf"):
        raise TrainingError(f"--finetune_learning_rate must be a finite number > 0, got "
                            f"{o['finetune_learning_rate']}")
    if not o["prompt"]:
        raise TrainingError("--prompt must not be empty")
    in_the_way = o["output_dir"] and path_in_the_way("output_dir", o["output_dir"])
    if in_the_way:  # written after the evaluations
        raise TrainingError(in_the_way)


@logging_as_found()
def run(**options):
    """Evaluates, draws, continues and fine-tunes; returns a summary dict."""
    o = merge(SPEC, options)
    _check(o)
    cli.quiet_tensorflow_import()
    from training import inputs
    from training.generate import check_prompt, continue_text
    from txl_tf.learning.evaluation import evaluate_ids
    from txl_tf.weights.model_dir import load, load_vocab

    core, source = load(o["model"])
    tokenizer = load_vocab(source.vocab_dir, core.config)
    if tokenizer.kind != "byte":  # every figure below is per byte
        from training.errors import TrainingError
        raise TrainingError(f"--model {o['model']!r} reads {tokenizer.kind} tokens: the demo "
                            "reports bits per byte and needs a byte-level model")
    check_prompt(tokenizer, o["prompt"])  # read after the evaluations
    cfg = core.config
    from txl_tf.checks.memory_budget import check_fits
    check_fits(cfg, 8, o["context"], 0, what="the loss-by-context curve (--context)")
    params = sum(int(v.numpy().size) for v in core.trainable_weights)
    print(f"model {o['model']}: {params:,} parameters, segments of {cfg.tgt_len}, trained "
          f"with a memory of {cfg.mem_len}", flush=True)
    valid = inputs.load("pystdlib", tokenizer=tokenizer).valid

    rows = []
    for mem_len in (3 * cfg.mem_len, cfg.mem_len, 0):
        r = evaluate_ids(core, valid, batch_size=8, tgt_len=cfg.tgt_len, mem_len=mem_len,
                         max_segments=o["eval_segments"])
        rows.append((mem_len, r["bpc"]))
    print(f"\n1. validation ({r['tokens']:,} bytes of standard library the model never "
          f"trained on, segments of {cfg.tgt_len}):")
    for mem_len, bpc in rows:
        label = f"memory {mem_len}" if mem_len else "no memory"
        print(f"   {label:<12} {bpc:.3f} bits per byte")
    print(f"   the memory saves {rows[-1][1] - rows[0][1]:.3f} bits per byte")

    curve = loss_by_context(core, valid, o["context"], o["eval_segments"])
    print("\n2. loss against the bytes of context the model sees:")
    for first, last, bits in curve:
        span = f"{first}" if first == last else f"{first}-{last}"
        print(f"   {span:>9} bytes  {bits:5.2f} bits  " + "#" * round(bits * 8))
    if o["output_dir"]:
        _plot(curve, os.path.join(o["output_dir"], "loss_by_context.png"))

    def write(piece):  # the continuations are printed as they are generated
        print(piece, end="", flush=True)
    write(f"\n3. continuation of {o['prompt']!r} (sampled: temperature 0.5, top-k 5):\n"
          f"{o['prompt']}")
    sampled = continue_text(core, tokenizer, o["prompt"], o["num_tokens"], write=write,
                            mem_len=3 * cfg.mem_len, temperature=0.5, top_k=5, seed=1)
    write(f"\n\n   greedy (a small byte-level model's greedy decoding soon loops; sampling "
          f"does not):\n{o['prompt']}")
    greedy = continue_text(core, tokenizer, o["prompt"], o["num_tokens"] // 2, write=write,
                           mem_len=3 * cfg.mem_len, greedy=True)
    print(flush=True)

    result = {"bpc": dict(rows), "loss_by_context": curve, "greedy": greedy,
              "sampled": sampled}
    if o["finetune_steps"] > 0 or o["finetune_seconds"] > 0:
        result["finetune"] = finetune(o, tokenizer)
    return result


def loss_by_context(core, ids, context, max_segments):
    """`(first, last, bits)` bands of the mean loss at positions `first..last`
    of segments of `context` ids read from an empty memory: position p
    sees exactly p ids before it."""
    import math

    from txl_tf.learning.evaluation import evaluate_ids, position_bands
    r = evaluate_ids(core, ids, batch_size=8, tgt_len=context, mem_len=0,
                     max_segments=max(1, max_segments * core.config.tgt_len // context),
                     by_position=True)
    return [(first, last, loss / math.log(2.0))
            for first, last, loss in position_bands(r["loss_by_position"])]


def finetune(o, tokenizer):
    """Fine-tunes the model as a keras-hub causal LM on `txl_tf/`'s source
    for `--finetune_steps` (or, without them, `--finetune_seconds`); returns
    the bits per byte on `export/`'s source before and after."""
    import keras

    import export
    import txl_tf
    from txl_tf import TransformerXLCausalLM
    from txl_tf.learning.evaluation import evaluate_ids

    def source(package):
        folder = os.path.dirname(os.path.abspath(package.__file__))
        paths = sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True))
        documents = [tokenizer.encode(open(p, encoding="utf-8").read()) for p in paths]
        return [d for d in documents if len(d) >= 2]  # empty __init__.py files

    train_docs, held_out = source(txl_tf), source(export)
    length = (f"{o['finetune_steps']} steps" if o["finetune_steps"]
              else f"{o['finetune_seconds']:g}s")
    print(f"\n4. fine-tuning for {length} on this library's own source ({len(train_docs)} "
          f"files of txl_tf/)...", flush=True)
    held_out_ids = [i for doc in held_out for i in doc]
    causal_lm = TransformerXLCausalLM.from_preset(o["model"])
    core = causal_lm.backbone.transformer
    def held_out_bpc():
        return evaluate_ids(core, held_out_ids, batch_size=8, mem_len=core.config.mem_len,
                            max_segments=o["eval_segments"])

    before = held_out_bpc()
    class StopAfter(keras.callbacks.Callback):
        """Counts the steps; without `--finetune_steps`, stops `fit` once
        `--finetune_seconds` have passed."""

        def __init__(self):
            super().__init__()
            self.start, self.steps, self.elapsed = time.time(), 0, 0.0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            self.elapsed = time.time() - self.start
            if not o["finetune_steps"] and self.elapsed >= o["finetune_seconds"]:
                self.model.stop_training = True

    causal_lm.compile(optimizer=keras.optimizers.Adam(o["finetune_learning_rate"]))
    stop = StopAfter()
    data = causal_lm.document_dataset(train_docs, batch_size=8).repeat()
    causal_lm.fit(data, steps_per_epoch=o["finetune_steps"] or 10_000, epochs=1,
                  callbacks=[stop], verbose=0)
    after = held_out_bpc()
    print(f"   {stop.steps} steps of 8 x {core.config.tgt_len} bytes in {stop.elapsed:.0f}s; "
          f"bits per byte on export/'s source ({before['tokens']:,} bytes, not trained on): "
          f"{before['bpc']:.3f} before, {after['bpc']:.3f} after", flush=True)
    if o["output_dir"]:
        causal_lm.save_to_preset(os.path.join(o["output_dir"], "finetuned_preset"))
    return {"before": before["bpc"], "after": after["bpc"], "steps": stop.steps}


def _plot(curve, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("loss_by_context.png skipped: matplotlib is not installed (pip install "
              "txl_tf[viz])")
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([max(first, 0.5) for first, _, _ in curve], [bits for _, _, bits in curve],
            marker="o")
    ax.set(xscale="log", xlabel="bytes of context", ylabel="bits per byte")
    fig.tight_layout()
    with replacing(path) as temporary:  # a kill never leaves half a picture
        fig.savefig(temporary, dpi=100)
    plt.close(fig)
    print(f"   (drawn in {path})")


def main(argv):
    del argv
    start = time.time()
    run(**values(SPEC))
    print(f"\n({time.time() - start:.0f}s)", flush=True)


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
