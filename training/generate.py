r"""Continues a prompt with a trained or exported model, carrying memory.

    python -m training.generate --model=runs/demo --prompt="def " \
        --num_tokens=200 --temperature=0.8 --top_p=0.95 --stop_ids=10
    python -m training.generate --model=out/model.onnx --prompt="def " --greedy

`--model` (or `--model_dir`) is a model directory with `vocab/` or a training
run directory (see `txl_tf.weights.model_dir`: the compiled Keras decoder), or an
export: a `model.onnx` file, a SavedModel directory, or the export job's
output folder (`export.open_runtime`: ONNX Runtime or the SavedModel, the
same sampler and seeds). The prompt is read in segments; each new token is
then fed alone with the memory of everything before it (up to `--mem_len`
positions; an export has its memory length fixed). The continuation is
printed as it is generated, joined the way the tokenizer joins tokens (a
space between words, nothing between bytes). Bad input ends in one `error:`
line and exit status 2 (`txl_tf.app.cli`).
"""
import os
import stat
import sys

import numpy as np

from training.errors import TrainingError
from txl_tf.app import cli
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.progress import interactive
from txl_tf.app.tf_logs import logging_as_found
from txl_tf.errors import TxlError
from txl_tf.generation.request import MAX_NEW_TOKENS, MAX_SEED
from txl_tf.text.prompt import prompt_ids

SPEC = (
    option("string", "model", None, "Model directory with vocab/, training run directory, "
           "exported model.onnx, SavedModel directory or export output folder."),
    option("string", "model_dir", None, "Same as --model (a model or training run "
           "directory)."),
    option("string", "checkpoint", None, "A training checkpoint (ckpt-N prefix, or a name in "
           "the run's checkpoints/) instead of the exported weights."),
    option("string", "prompt", "", "Text to continue."),
    option("integer", "num_tokens", 200, "Tokens to generate, in [0, 2**30]."),
    option("float", "temperature", 1.0, "Sampling temperature (>= 0; 0 is greedy)."),
    option("integer", "top_k", 0, "Sample among the k most likely tokens (0: all)."),
    option("float", "top_p", 1.0, "Sample from the most likely tokens holding this much "
           "probability (1: all)."),
    option("float", "repetition_penalty", 1.0, "Multiply the log-probs of ids already in the "
           "prompt or output by this (>= 1)."),
    option("multi_string", "stop_ids", [], "Token ids that end the continuation (repeat the "
           "flag for several)."),
    option("string", "device", "auto", "auto, cpu or cuda, for an exported model."),
    option("bool", "greedy", False, "Always take the most likely token."),
    option("integer", "mem_len", None, "Memory length (default: the model's training "
           "mem_len)."),
    option("integer", "seed", 0, "Sampling seed, in [0, 2**63 - 1]."),
    option("bool", "progress", None, "Show progress on stderr (default: a bar when stderr "
           "is a terminal and stdout a file: on a terminal or a pipe the text shows it; forced "
           "on: a line every 10% where no bar is drawn)."),
)


def continue_ids(model, prompt_ids, num_tokens, mem_len=None, temperature=1.0, top_k=0,
                 greedy=False, seed=0, progress=False, stream=None, **options):
    """`num_tokens` ids following `prompt_ids` (a non-empty 1-D sequence), or
    fewer when a stop id ends them (the stop id included). `model` is a
    `TransformerXL` core (decoded by `txl_tf.Decoder`) or anything with a
    `generate` method (a `Decoder`, an export runtime). `progress(done,
    total)` and `stream(ids [1, c])` see each chunk; other `options` go to
    `generate` (top_p, repetition_penalty, stop_ids)."""
    prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(1, -1)
    if prompt.size == 0:
        raise TxlError("the prompt must hold at least one token")
    backend = model
    # A core's class is imported once a core exists: an export's runtime
    # (maybe on a box without TensorFlow) is never asked to import it.
    core = sys.modules.get("txl_tf.core")
    if core is not None and isinstance(model, core.TransformerXL):
        from txl_tf import Decoder
        backend = Decoder(model, mem_len=mem_len)

    stops = {int(i) for i in options.get("stop_ids") or ()}

    def report(chunk):
        # Backends fill a stopped row's chunk with pad ids: stream up to the stop id.
        if report.stopped:
            return
        hits = np.flatnonzero(np.isin(np.asarray(chunk)[0], list(stops)))
        if hits.size:
            chunk, report.stopped = np.asarray(chunk)[:, :hits[0] + 1], True
        report.done += chunk.shape[1]
        if callable(progress):
            progress(report.done, int(num_tokens))
        if stream is not None:
            stream(chunk)
    report.done, report.stopped = 0, False
    out = backend.generate(prompt, int(num_tokens), temperature=0.0 if greedy else temperature,
                           top_k=top_k, seed=seed, stream=report, **options)
    return out.ids[0, :out.lengths[0]]


def continuation(tokenizer, ids, new_ids):
    """The text `new_ids` add after `ids`, with the tokenizer's separator (a
    space between words; nothing between bytes or characters)."""
    head = tokenizer.decode(ids)
    whole = tokenizer.decode(np.concatenate([np.asarray(ids), np.asarray(new_ids)]))
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new_ids)


def continue_text(model, tokenizer, prompt, num_tokens, write=None, **kwargs):
    """The text that `model` writes after `prompt`, to be printed right after
    it (see `continue_ids`, `continuation`); `write(piece)`, if given, gets
    the text as it grows."""
    ids = prompt_ids(tokenizer, prompt)
    printed = [""]
    new_ids = []

    def stream(chunk):
        new_ids.extend(int(i) for i in chunk[0])
        # A trailing U+FFFD may be a multi-byte character cut between chunks: held back.
        text = continuation(tokenizer, ids, new_ids).rstrip("\ufffd")
        if write is not None and text.startswith(printed[0]) and len(text) > len(printed[0]):
            write(text[len(printed[0]):])
            printed[0] = text

    text = continuation(tokenizer, ids, continue_ids(model, ids, num_tokens, stream=stream,
                                                     **kwargs))
    if write is not None and text.startswith(printed[0]):
        write(text[len(printed[0]):])
    return text


def _check_options(o):
    if o["model"] and o["model_dir"]:
        raise TrainingError("pass --model or --model_dir, not both")
    if not (o["model"] or o["model_dir"]):
        raise TrainingError("--model is required")
    if not o["prompt"]:
        raise TrainingError("--prompt must not be empty")
    if not 0 <= o["num_tokens"] <= MAX_NEW_TOKENS:  # what one decode call holds
        raise TrainingError(f"--num_tokens must be in [0, {MAX_NEW_TOKENS}], got "
                            f"{o['num_tokens']}")
    if not 0 <= o["temperature"] < float("inf"):
        raise TrainingError(f"--temperature must be a finite number >= 0, got "
                            f"{o['temperature']}")
    if o["greedy"] and o["temperature"] not in (0.0, 1.0):  # 1.0: the default
        raise TrainingError(f"--greedy takes the most likely token, so --temperature="
                            f"{o['temperature']} would be ignored: pass one of them")
    if o["top_k"] < 0:
        raise TrainingError(f"--top_k must be >= 0, got {o['top_k']}")
    if not 0 < o["top_p"] <= 1:
        raise TrainingError(f"--top_p must be in (0, 1], got {o['top_p']}")
    if not 1 <= o["repetition_penalty"] < float("inf"):
        raise TrainingError(f"--repetition_penalty must be a finite number >= 1, got "
                            f"{o['repetition_penalty']}")
    for stop in o["stop_ids"]:
        if not (stop.strip().isascii() and stop.strip().isdigit()):  # int() refuses "²"
            raise TrainingError(f"--stop_ids must be token ids (integers >= 0), got {stop!r}")
    if o["device"] not in ("auto", "cpu", "cuda", "gpu"):
        raise TrainingError(f"--device must be auto, cpu, cuda or gpu, got {o['device']!r}")
    if o["mem_len"] is not None and o["mem_len"] < 0:
        raise TrainingError(f"--mem_len must be >= 0, got {o['mem_len']}")
    if not 0 <= o["seed"] <= MAX_SEED:
        raise TrainingError(f"--seed must be in [0, {MAX_SEED}], got {o['seed']}")


def check_prompt(tokenizer, prompt):
    """Raises `TrainingError` naming `--prompt` where `tokenizer` cannot read
    `prompt` (a word outside a vocabulary without <unk>, bytes that are not
    UTF-8), before any work."""
    try:
        tokenizer.encode(prompt)
    except ValueError as err:
        raise TrainingError(f"--prompt cannot be encoded: {err}") from None
    except ImportError as err:  # SentencePiece's encode without tensorflow-text
        if isinstance(err, ModuleNotFoundError):
            raise
        raise TrainingError(f"--prompt cannot be encoded: {err}") from None


def _is_export(path):
    return (os.path.isfile(path) and path.endswith(".onnx")) or any(
        os.path.isfile(os.path.join(path, name))
        for name in ("saved_model.pb", "model.onnx", os.path.join("saved_model", "saved_model.pb")))


def _needs_tensorflow(path):
    """Whether `--model` at `path` needs TensorFlow: all but an ONNX export
    (which ONNX Runtime serves)."""
    if not _is_export(path):
        return True
    from export.runtime import choose_artefact
    try:
        return choose_artefact(path)[0] != "onnx"
    except (OSError, ValueError):  # `_load` names what is wrong
        return True


def _import_tensorflow(path):
    """TensorFlow, imported quietly; a box without it is one `TrainingError`."""
    try:
        cli.quiet_tensorflow_import()
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] != "tensorflow":
            raise
        if not os.path.exists(path):
            raise TrainingError(f"--model {path!r} does not exist") from None
        raise TrainingError(f"--model {path}: a model directory, training run or SavedModel "
                            f"needs TensorFlow, which is not installed ({missing}); without "
                            f"it, pass an ONNX export (its model.onnx or the export job's "
                            f"folder)") from None


def _export_vocab(path):
    """The tokenizer folder of an export: beside the ONNX file or in the
    export folder (`vocab/`), or the SavedModel's `assets/`."""
    folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path
    for candidate in (os.path.join(folder, "vocab"), os.path.join(folder, "assets"),
                      os.path.join(os.path.dirname(folder), "vocab")):
        if os.path.isfile(os.path.join(candidate, "tokenizer.json")):
            return candidate
    return None


def _loop_buffer(path, num_tokens):
    """The positions per row of the compiled decode loop's buffer that
    `continue_ids` (which always streams) holds beside its outputs: a core's
    `Decoder.loop_buffer`; none for an export's runtime."""
    if _is_export(path):
        return 0
    from txl_tf.generation.decoder import Decoder
    return Decoder.loop_buffer(int(num_tokens), stream=continue_ids)


def _load(o):
    """`(model, config, vocab_dir)` for `--model`: an export runtime or a core."""
    path = o["model"] or o["model_dir"]
    if _is_export(path):
        if o["checkpoint"]:
            raise TrainingError("--checkpoint applies to a model or run directory, not to an "
                                "export")
        if o["mem_len"] is not None:
            raise TrainingError("--mem_len cannot change an export's memory length (fixed "
                                "when it was exported)")
        from export import open_runtime
        runtime = open_runtime(path, device=o["device"])
        return runtime, runtime.config, _export_vocab(path)
    from txl_tf.weights.model_dir import load_config, load_core, resolve
    source = resolve(path, o["checkpoint"])
    config = load_config(source)
    return (lambda: load_core(source, config=config)), config, source.vocab_dir


@logging_as_found()
def run(write=None, bar=None, **options):
    """Generates with `options` (the flags by name); returns the continuation
    (and hands it to `write` piece by piece as it is generated). `bar`: False
    for no tqdm bar (lines instead with `progress=True`), None for a bar when
    stderr is a terminal."""
    o = merge(SPEC, options)
    _check_options(o)
    if _needs_tensorflow(o["model"] or o["model_dir"]):
        _import_tensorflow(o["model"] or o["model_dir"])
    from txl_tf.checks.memory_budget import check_new_ids
    check_new_ids(1, o["num_tokens"], what="--num_tokens", advice="lower --num_tokens",
                  buffer=_loop_buffer(o["model"] or o["model_dir"], o["num_tokens"]))
    model, config, vocab_dir = _load(o)
    name = o["model"] or o["model_dir"]
    if o["top_k"] > config.n_token:
        raise TrainingError(f"--top_k {o['top_k']} exceeds the vocabulary of "
                            f"{config.n_token} tokens")
    stop_ids = [int(s) for s in o["stop_ids"]]
    if any(s >= config.n_token for s in stop_ids):
        raise TrainingError(f"--stop_ids must be ids below the vocabulary size "
                            f"{config.n_token}, got {max(stop_ids)}")
    from training import inputs
    try:
        tokenizer = inputs.model_tokenizer(name, vocab_dir, config)
    except ImportError as err:  # a SentencePiece vocab/ without the sentencepiece package
        if isinstance(err, ModuleNotFoundError):  # not one that names the package
            raise
        raise TrainingError(f"{name}: {err}") from None
    check_prompt(tokenizer, o["prompt"])
    if callable(model):
        from txl_tf.checks.memory_budget import check_fits
        check_fits(config, 1, config.tgt_len,  # the decoder reads prompts in tgt_len segments
                   config.mem_len if o["mem_len"] is None else o["mem_len"],
                   what="generating")
        model = model()  # the core's weights are loaded only once the inputs are known
    progress = cli.Progress("generating", enabled=o["progress"] is not False,
                            lines=bool(o["progress"]), bar=bar)
    return continue_text(model, tokenizer, o["prompt"], o["num_tokens"], write=write,
                         mem_len=o["mem_len"], temperature=o["temperature"], top_k=o["top_k"],
                         greedy=o["greedy"], seed=o["seed"], progress=progress,
                         top_p=o["top_p"], repetition_penalty=o["repetition_penalty"],
                         stop_ids=stop_ids)


def _into_a_pipe(stream):
    """Whether `stream` writes into a pipe (`| tee out.txt`, `| less`)."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no file descriptor
        return False


def main(argv):
    options = values(SPEC)
    shown = []
    # On a terminal the streamed text shows the progress; a bar on the same
    # terminal would be drawn over it (with --progress: lines instead). Text
    # into a pipe most likely lands on that terminal too (`| tee`, `| less`).
    on_terminal = interactive(sys.stdout) or _into_a_pipe(sys.stdout)
    if on_terminal and options["progress"] is None:
        options["progress"] = False

    def write(piece):
        if not shown:  # the prompt first, once the inputs passed and text is coming
            shown.append(sys.stdout.write(options["prompt"]))
        sys.stdout.write(piece)
        sys.stdout.flush()
    run(write=write, bar=False if on_terminal else None, **options)
    write("")
    print(flush=True)


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
