r"""Draws one layer's attention on one segment of a text as a PNG heat map.

    python -m training.attention_picture --model_dir=runs/demo \
        --text_file=input.txt --layer=-1 --head=mean --segment=2 \
        --seg_len=32 --mem_len=64 --output=attention.png

`--model_dir` is a model or training run directory with a `vocab/` (see
`txl_tf.weights.model_dir`). The text is tokenized with the model's tokenizer and cut
into segments of `--seg_len` tokens; the segments before `--segment` are read
first, so the memory holds up to `--mem_len` earlier positions. Keys (the
memory, then the segment) run along x, queries down y; hidden cells (future
keys, empty memory slots) are light grey (`txl_tf.classification.attention_picture`).
Token labels are drawn when the picture has at most `--max_labels` keys.
Bad input ends in one `error:` line and exit status 2 (`txl_tf.app.cli`).
"""
import os

from training.errors import TrainingError
from txl_tf.app import cli
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

SPEC = (
    option("string", "model_dir", None, "Model directory (with vocab/) or training run "
           "directory."),
    option("string", "checkpoint", None, "A training checkpoint (ckpt-N prefix, or a name in "
           "the run's checkpoints/) instead of the exported weights."),
    option("string", "text", None, "The text to read."),
    option("string", "text_file", None, "A UTF-8 file holding the text to read."),
    option("integer", "layer", -1, "Layer to draw (0-based; negative counts from the last)."),
    option("string", "head", "mean", "Head to draw (0-based), or 'mean' over the heads."),
    option("integer", "segment", -1, "Segment to draw (0-based; negative counts from the "
           "last); the earlier ones fill the memory."),
    option("integer", "seg_len", None, "Segment length in tokens (default: the model's "
           "tgt_len)."),
    option("integer", "mem_len", None, "Memory length; 0 for none (default: the model's)."),
    option("integer", "max_labels", 64, "Label the axes with the tokens when there are at "
           "most this many keys (0: never)."),
    option("string", "output", None, "The PNG file to write."),
)


def token_label(text, width=6):
    """A short axis label for one token's text: whitespace made visible."""
    shown = text.replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5")
    return shown if len(shown) <= width else shown[:width - 1] + "\u2026"


def _check_options(o):
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    if not o["output"]:
        raise TrainingError("--output (a .png file) is required")
    if not o["output"].lower().endswith(".png"):
        raise TrainingError(f"--output must name a .png file, got {o['output']!r}")
    if path_in_the_way("output", o["output"], "file"):
        raise TrainingError(path_in_the_way("output", o["output"], "file"))
    if (o["text"] is None) == (o["text_file"] is None):
        raise TrainingError("pass the text with exactly one of --text or --text_file")
    if o["text"] is not None and not o["text"]:
        raise TrainingError("--text must not be empty")
    if o["seg_len"] is not None and o["seg_len"] <= 0:
        raise TrainingError(f"--seg_len must be positive, got {o['seg_len']}")
    if o["mem_len"] is not None and o["mem_len"] < 0:
        raise TrainingError(f"--mem_len must be >= 0, got {o['mem_len']}")
    if o["max_labels"] < 0:
        raise TrainingError(f"--max_labels must be >= 0, got {o['max_labels']}")
    head = str(o["head"]).strip()
    if head != "mean" and not (head.isascii() and head.isdigit()):  # int() refuses "²"
        raise TrainingError(f"--head must be 'mean' or a head number >= 0, got {o['head']!r}")


def _read_text(o):
    if o["text"] is not None:
        return o["text"]
    path = o["text_file"]
    if not os.path.isfile(path):
        raise TrainingError(f"--text_file {path!r} "
                            + ("is a folder, not a file" if os.path.isdir(path) else
                               "does not exist"))
    try:
        with open(path, encoding="utf-8-sig") as f:  # Notepad starts it with a BOM
            text = f.read()
    except UnicodeDecodeError as err:
        raise TrainingError(f"--text_file {path!r} is not valid UTF-8: {err}") from None
    if not text:
        raise TrainingError(f"--text_file {path!r} is empty")
    return text


@logging_as_found()
def run(**options):
    """Draws the picture for `options` (the flags by name); returns the
    `SegmentAttention` drawn."""
    o = merge(SPEC, options)
    _check_options(o)
    text = _read_text(o)
    cli.quiet_tensorflow_import()
    from txl_tf.classification.attention_picture import (require_matplotlib, segment_attention,
                                          write_attention_png)
    try:
        require_matplotlib()
    except ImportError as err:
        raise TrainingError(str(err)) from None
    from txl_tf.weights.model_dir import load_config, load_core, resolve
    source = resolve(o["model_dir"], o["checkpoint"])
    config = load_config(source)
    if not -config.n_layer <= o["layer"] < config.n_layer:
        raise TrainingError(f"--layer {o['layer']} is out of range: the model has "
                            f"{config.n_layer} layers")
    head = None if o["head"].strip() == "mean" else int(o["head"])
    if head is not None and head >= config.n_head:
        raise TrainingError(f"--head {head} is out of range: the model has {config.n_head} "
                            "heads")
    from training import inputs
    tokenizer = inputs.model_tokenizer(o["model_dir"], source.vocab_dir, config)
    try:
        ids = tokenizer.encode(text)
    except ValueError as err:  # e.g. a word outside a vocabulary without <unk>
        raise TrainingError(f"the text cannot be encoded: {err}") from None
    if len(ids) == 0:
        raise TrainingError("the text holds no tokens")
    seg_len = o["seg_len"] or config.tgt_len
    n_segments = -(-len(ids) // seg_len)
    if not -n_segments <= o["segment"] < n_segments:
        raise TrainingError(f"--segment {o['segment']} is out of range: the text's "
                            f"{len(ids)} tokens make {n_segments} segments of {seg_len}")
    from txl_tf.checks.memory_budget import check_fits
    check_fits(config, 1, min(seg_len, len(ids)),
               config.mem_len if o["mem_len"] is None else o["mem_len"],
               what="the attention picture")
    core = load_core(source, config=config)
    layer = o["layer"] % config.n_layer
    attn = segment_attention(core, ids, layer, o["segment"], seg_len, o["mem_len"])
    labels = {}
    if 0 < len(attn.key_ids) <= o["max_labels"]:
        keys = [token_label(tokenizer.decode([i])) if i >= 0 else "" for i in attn.key_ids]
        labels = dict(key_labels=keys, query_labels=keys[attn.n_memory:])
    title = (f"layer {layer}, {'mean of the heads' if head is None else f'head {head}'}, "
             f"segment {attn.segment + 1} of {n_segments}")
    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    write_attention_png(o["output"], attn.weights(head), attn.visible, attn.n_memory,
                        title=title, **labels)
    return attn


def main(argv):
    options = values(SPEC)
    attn = run(**options)
    print(f"wrote {options['output']}: {attn.visible.shape[0]} queries x "
          f"{attn.visible.shape[1]} keys ({attn.n_memory} memory slots)", flush=True)


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
