r"""Continues a prompt with a trained model (greedy or sampled), carrying memory.

    python -m training.generate --model_dir=runs/demo --prompt="def " \
        --num_tokens=200 --temperature=0.8

`--model_dir` is a model directory with `vocab/` or a training run directory
(see `txl_tf.model_dir`). The prompt is read in one pass; each new token is
then fed alone with the memory of everything before it (up to `--mem_len`
positions). The prompt and its continuation are printed joined the way the
tokenizer joins tokens (a space between words, nothing between bytes). Bad
input ends in one `error:` line and exit status 2 (`training.cli`).
"""
import numpy as np

from training import cli
from training.errors import TrainingError
from training.flagspec import merge, option, values

SPEC = (
    option("string", "model_dir", None, "Model directory with vocab/, or a training run "
           "directory."),
    option("string", "checkpoint", None, "A training checkpoint (ckpt-N prefix, or a name in "
           "the run's checkpoints/) instead of the exported weights."),
    option("string", "prompt", "", "Text to continue."),
    option("integer", "num_tokens", 200, "Tokens to generate."),
    option("float", "temperature", 1.0, "Sampling temperature (>= 0; 0 is greedy)."),
    option("integer", "top_k", 0, "Sample among the k most likely tokens (0: all)."),
    option("bool", "greedy", False, "Always take the most likely token."),
    option("integer", "mem_len", None, "Memory length (default: the model's training "
           "mem_len)."),
    option("integer", "seed", 0, "Sampling seed."),
    option("bool", "progress", None, "Show progress on stderr (default: a bar on a terminal "
           "only; forced on elsewhere: a line every 10%)."),
)


def continue_ids(core, prompt_ids, num_tokens, mem_len=None, temperature=1.0, top_k=0,
                 greedy=False, seed=0, progress=False):
    """`num_tokens` ids following `prompt_ids` (a non-empty 1-D sequence)."""
    from txl_tf.generate import Generator
    prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(1, -1)
    if prompt.size == 0:
        raise ValueError("the prompt must hold at least one token")
    new = Generator(core, mem_len=mem_len).generate(
        prompt, int(num_tokens), temperature=0.0 if greedy else temperature, top_k=top_k,
        seed=seed, progress=progress)
    return new[0]


def prompt_ids(tokenizer, prompt):
    """The ids of `prompt`, without the end-of-line id a word or SentencePiece
    tokenizer adds to a last line the prompt did not end: the model continues
    the line."""
    ids = tokenizer.encode(prompt)
    eos = getattr(tokenizer, "eos_id", -1)
    if len(ids) > 1 and ids[-1] == eos and not prompt.endswith("\n"):
        ids = ids[:-1]
    return ids


def continuation(tokenizer, ids, new_ids):
    """The text `new_ids` add after `ids`, with the tokenizer's separator (a
    space between words; nothing between bytes or characters)."""
    head = tokenizer.decode(ids)
    whole = tokenizer.decode(np.concatenate([np.asarray(ids), np.asarray(new_ids)]))
    return whole[len(head):] if whole.startswith(head) else tokenizer.decode(new_ids)


def continue_text(core, tokenizer, prompt, num_tokens, **kwargs):
    """The text that `core` writes after `prompt`, to be printed right after
    it (see `continue_ids`, `continuation`)."""
    ids = prompt_ids(tokenizer, prompt)
    return continuation(tokenizer, ids, continue_ids(core, ids, num_tokens, **kwargs))


def _check_options(o):
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    if not o["prompt"]:
        raise TrainingError("--prompt must not be empty")
    if o["num_tokens"] < 0:
        raise TrainingError(f"--num_tokens must be >= 0, got {o['num_tokens']}")
    if not o["temperature"] >= 0:
        raise TrainingError(f"--temperature must be >= 0, got {o['temperature']}")
    if o["top_k"] < 0:
        raise TrainingError(f"--top_k must be >= 0, got {o['top_k']}")
    if o["mem_len"] is not None and o["mem_len"] < 0:
        raise TrainingError(f"--mem_len must be >= 0, got {o['mem_len']}")


def run(**options):
    """Generates with `options` (the flags by name); returns the continuation."""
    o = merge(SPEC, options)
    _check_options(o)
    cli.quiet_tensorflow_import()
    from txl_tf.model_dir import load_config, load_core, resolve
    from txl_tf.text import load_tokenizer
    source = resolve(o["model_dir"], o["checkpoint"])
    config = load_config(source)
    if o["top_k"] > config.n_token:
        raise TrainingError(f"--top_k {o['top_k']} exceeds the vocabulary of "
                            f"{config.n_token} tokens")
    if source.vocab_dir is None:
        raise TrainingError(f"no tokenizer for {o['model_dir']}: no vocab/ folder (training "
                            "writes one into its export/)")
    try:
        tokenizer = load_tokenizer(source.vocab_dir)
    except (OSError, ValueError) as err:
        raise TrainingError(f"no tokenizer for {o['model_dir']}: {err}") from None
    if tokenizer.vocab_size != config.n_token:
        raise TrainingError(f"vocabulary/model size mismatch: {source.vocab_dir} has "
                            f"{tokenizer.vocab_size} tokens, the model has "
                            f"n_token={config.n_token}")
    try:
        tokenizer.encode(o["prompt"])
    except ValueError as err:  # e.g. a word outside a vocabulary without <unk>
        raise TrainingError(f"--prompt cannot be encoded: {err}") from None
    core = load_core(source, config=config)
    progress = cli.Progress("generating", enabled=o["progress"] is not False,
                            lines=bool(o["progress"]))
    return continue_text(core, tokenizer, o["prompt"], o["num_tokens"], mem_len=o["mem_len"],
                         temperature=o["temperature"], top_k=o["top_k"], greedy=o["greedy"],
                         seed=o["seed"], progress=progress)


def main(argv):
    options = values(SPEC)
    text = run(**options)
    print(options["prompt"] + text, flush=True)


if __name__ == "__main__":
    cli.run(main, SPEC)
