r"""Published weights → a txl_tf model directory (absl app).

    python -m txl_tf.convert --source=pytorch --input=pytorch_model.bin \
        --config=config.json --vocab=vocab.pkl --output_dir=models/wt103

writes `config.json`, `weights.npz` and (with `--vocab`) `vocab/`, the model
directory that `training.evaluate`, `training.generate` and
`python -m export` take, and prints what it read and inferred.

* `--source=pytorch`: a state dict of the paper's PyTorch code or the
  transfo-xl-wt103 port (`.safetensors`; `.bin`/`.pt` need PyTorch), see
  `txl_tf.weights.pytorch_import`. `--config` is optional: without it the sizes
  come from the tensors' shapes.
* `--source=tf`: a checkpoint of the paper's TF code (prefix or folder);
  `--config` is required (`txl_tf.weights.import_tf_checkpoint`).

`--config` is a txl_tf config JSON or the port's `config.json` (its
evaluation lengths, mem_len 1600 / clamp_len 1000 / same_length, come along).
`--vocab` is a plain-text vocabulary (one symbol per line, in id order) or a
pickled one (`vocab.pkl`), read by the restricted converter
`txl_tf.text.pickled_vocab`. Bad input ends in one `error:` line, exit 2.
TensorFlow is imported only once the flags are read (`cli.quiet_tensorflow_import`),
so the modules that need it are imported inside the functions.
"""
import os

from txl_tf.app import cli
from txl_tf.app.files import parse_json
from txl_tf.app.flagspec import option, values
from txl_tf.config import TransformerXLConfig
from txl_tf.errors import TxlError

SOURCES = ("pytorch", "tf")
# The port's config.json (transformers' TransfoXLConfig): our name for each
# field that shapes the model or its evaluation.
_PORT_FIELDS = {"vocab_size": "n_token", "n_token": "n_token", "tie_weight": "tie_weight",
                "tie_word_embeddings": "tie_weight"}
# The largest value each supports (sample_softmax samples only above 0, as the
# paper's code and the port read it).
_PORT_UNSUPPORTED = {"attn_type": 0, "sample_softmax": 0, "ext_len": 0}


class ConvertError(TxlError):
    """A conversion input (flag, config, vocabulary, output folder) is unusable."""


def read_config_file(path):
    """`(TransformerXLConfig fields, ignored keys)` of a txl_tf config JSON or
    the port's `config.json`."""
    return _read_config_file(path)[:2]


def _read_config_file(path):
    """`read_config_file`'s answer and whether the file is the port's."""
    try:
        with open(path, encoding="utf-8") as f:
            values = parse_json(f.read())
    except (OSError, ValueError) as err:
        raise ConvertError(f"cannot read the config {path}: {err}") from None
    if not isinstance(values, dict):
        raise ConvertError(f"{path}: a config is a JSON object")
    ours = {f for f in TransformerXLConfig.__dataclass_fields__}
    if set(values) <= ours:
        return values, [], False
    fields, ignored = {}, []
    for key, value in values.items():
        if key in _PORT_UNSUPPORTED:
            if (value or 0) > _PORT_UNSUPPORTED[key]:
                raise ConvertError(f"{path}: {key}={value} is not supported (only the "
                                   "relative-attention model with a full softmax, no ext_len)")
        elif key == "tie_weight" and "tie_word_embeddings" in values:
            pass  # the port's own key wins, as TransfoXLConfig reads them
        elif key in _PORT_FIELDS:
            fields[_PORT_FIELDS[key]] = value
        elif key == "proj_share_all_but_first":
            pass  # below, once cutoffs are known
        elif key in ours:
            fields[key] = value
        else:
            ignored.append(key)
    if "proj_share_all_but_first" in values and "tie_projs" not in values:  # only its default
        n_tail = len(fields.get("cutoffs", []))
        fields["tie_projs"] = [False] + [bool(values["proj_share_all_but_first"])] * n_tail
    return fields, sorted(ignored), True


def _read_vocab(path, echo):
    """Symbols of a plain-text or pickled vocabulary."""
    from txl_tf.text.pickled_vocab import load_plain_pickle, symbols_of
    from txl_tf.text.vocab import read_vocab

    if path.endswith((".pkl", ".pickle", ".bin", ".pt")):
        symbols = symbols_of(load_plain_pickle(path), path)
        echo(f"vocabulary: {len(symbols)} symbols from the pickle {path} (restricted "
             "unpickler: plain containers only)")
        return symbols
    symbols = read_vocab(path)
    echo(f"vocabulary: {len(symbols)} symbols from {path}")
    return symbols


def _tokenizer(symbols, n_token):
    from txl_tf.text.word import WordTokenizer

    if len(symbols) != n_token:
        raise ConvertError(f"the vocabulary has {len(symbols)} symbols, the model "
                           f"n_token={n_token}")
    if "<eos>" not in symbols:
        raise ConvertError("the vocabulary has no <eos> symbol, which a txl_tf word "
                           "tokenizer needs to end lines")
    return WordTokenizer(symbols, unk_token="<unk>" if "<unk>" in symbols else None,
                         eos_token="<eos>")


def _check_output(output_dir, overwrite):
    if os.path.isfile(output_dir):
        raise ConvertError(f"--output_dir {output_dir} is a file")
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise ConvertError(f"--output_dir {output_dir} is not empty (pass --overwrite to "
                           "replace its model files)")


def convert(source, input, output_dir, config=None, vocab=None, cluster_order=None,
            strict=True, overwrite=False, echo=print, **overrides):
    """Writes the model directory `output_dir`; returns its path. `config` is
    a path, a dict or a `TransformerXLConfig`; `overrides` change config fields."""
    from txl_tf import weights

    if source not in SOURCES:
        raise ConvertError(f"--source must be one of {SOURCES}, got {source!r}")
    if not input:
        raise ConvertError("--input is required")
    if not os.path.exists(input) and not (source == "tf" and os.path.exists(input + ".index")):
        raise ConvertError(f"--input {input} does not exist")
    _check_output(output_dir, overwrite)
    if isinstance(config, str):
        config, ignored, port = _read_config_file(config)
        if ignored:
            echo(f"config: ignored fields {', '.join(ignored)}")
        if port and "layer_norm_epsilon" in config:
            # The port's layers use this one: it overrides the origin's default (1e-5).
            # Not a TF checkpoint's: that code's 1e-12 (`import_tf_checkpoint`).
            epsilon = config.pop("layer_norm_epsilon")
            if source == "pytorch":
                overrides = {"layer_norm_epsilon": epsilon, **overrides}
    symbols = _read_vocab(vocab, echo) if vocab else None
    if source == "pytorch":
        core = weights.import_pytorch(input, config, cluster_order=cluster_order,
                                          strict=strict, **overrides)
        for line in core.import_report.lines():
            echo(line)
    else:
        if config is None:
            raise ConvertError("--source=tf needs --config: a TF checkpoint's sizes are read "
                               "from the config, not inferred")
        try:
            cfg = TransformerXLConfig.from_dict(dict(config)) if isinstance(config, dict) \
                else config
        except TypeError as err:
            raise ConvertError(f"bad config: {err}") from None
        core = weights.import_tf_checkpoint(input, cfg, **overrides)
        echo(f"read the TF checkpoint {input}: zero_filled_memory=True, layer_norm_epsilon="
             f"{core.config.layer_norm_epsilon}")
    tokenizer = _tokenizer(symbols, core.config.n_token) if symbols is not None else None
    weights.save_pretrained(core, output_dir, tokenizer)  # vocab/ with the model, not after it
    cfg = core.config
    echo(f"wrote {output_dir}: config.json, weights.npz"
         f"{', vocab/' if tokenizer is not None else ''} (evaluation: tgt_len {cfg.tgt_len}, "
         f"mem_len {cfg.mem_len}, clamp_len {cfg.clamp_len}, same_length {cfg.same_length} "
         f"[{cfg.same_length_convention} rule])")
    return output_dir


# ---------------------------------------------------------------------- CLI
def _spec():
    return (
        option("enum", "source", None, "Where the weights come from.", list(SOURCES)),
        option("string", "input", None, "PyTorch state dict (.safetensors, .bin, .pt) or TF "
               "checkpoint (prefix or folder)."),
        option("string", "config", None, "txl_tf config JSON or the port's config.json "
               "(optional for pytorch: inferred from the shapes)."),
        option("string", "vocab", None, "Vocabulary: plain text (one symbol per line) or "
               "vocab.pkl (restricted unpickler); read as words, so it needs an <eos> symbol."),
        option("string", "output_dir", None, "The model directory to write."),
        option("enum", "cluster_order", None, "Tail-cluster rule the weights were trained "
               "with (default: from the naming; see txl_tf.weights.pytorch_import).",
               ["tf", "pytorch"]),
        option("bool", "strict", True, "Refuse tensors that fit nothing in the model."),
        option("bool", "overwrite", False, "Write into a non-empty --output_dir."),
    )


def main(argv):
    o = values(_spec())
    for name in ("source", "input", "output_dir"):
        if not o[name]:
            raise ConvertError(f"--{name} is required")
    cli.quiet_tensorflow_import()
    convert(o["source"], o["input"], o["output_dir"], config=o["config"], vocab=o["vocab"],
            cluster_order=o["cluster_order"], strict=o["strict"], overwrite=o["overwrite"],
            echo=lambda line: print(line, flush=True))


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, _spec(), doc=__doc__)


if __name__ == "__main__":
    console()
