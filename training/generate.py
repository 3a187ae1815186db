r"""Continues a prompt with a trained model (greedy or sampled), carrying memory.

    python -m training.generate --model_dir=runs/demo/export --prompt="def " \
        --num_tokens=200 --temperature=0.8

The prompt is read in one pass; each new token is then fed alone with the
memory of everything before it (up to `--mem_len` positions).
"""
import os
import sys

import numpy as np
from absl import app, logging

from training.errors import TrainingError, exit_on_error
from training.flagspec import define, merge, option, values

SPEC = (
    option("string", "model_dir", None, "Model directory with vocab/ (training's export/)."),
    option("string", "prompt", "", "Text to continue."),
    option("integer", "num_tokens", 200, "Tokens to generate."),
    option("float", "temperature", 1.0, "Sampling temperature."),
    option("integer", "top_k", 0, "Sample among the k most likely tokens (0: all)."),
    option("bool", "greedy", False, "Always take the most likely token."),
    option("integer", "mem_len", None, "Memory length (default: the model's training "
           "mem_len)."),
    option("integer", "seed", 0, "Sampling seed."),
)


def continue_ids(core, prompt_ids, num_tokens, mem_len=None, temperature=1.0, top_k=0,
                 greedy=False, seed=0):
    """`num_tokens` ids following `prompt_ids` (a non-empty 1-D sequence)."""
    from txl_tf.generate import Generator
    prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(1, -1)
    if prompt.size == 0:
        raise ValueError("the prompt must hold at least one token")
    new = Generator(core, mem_len=mem_len).generate(
        prompt, int(num_tokens), temperature=0.0 if greedy else temperature, top_k=top_k,
        seed=seed)
    return new[0]


def continue_text(core, tokenizer, prompt, num_tokens, **kwargs):
    """The text that `core` writes after `prompt` (see `continue_ids`)."""
    ids = continue_ids(core, tokenizer.encode(prompt), num_tokens, **kwargs)
    return tokenizer.decode(ids)


def run(**options):
    o = merge(SPEC, options)
    from txl_tf.text import load_tokenizer
    from training.evaluate import load_core
    if o["num_tokens"] < 0:
        raise TrainingError(f"--num_tokens must be >= 0, got {o['num_tokens']}")
    core = load_core(o["model_dir"])
    vocab = os.path.join(o["model_dir"], "vocab")
    if not os.path.isdir(vocab):
        vocab = os.path.join(o["model_dir"], "export", "vocab")
    try:
        tokenizer = load_tokenizer(vocab)
    except (OSError, ValueError) as err:
        raise TrainingError(f"no tokenizer for {o['model_dir']}: {err}") from None
    if not o["prompt"]:
        raise TrainingError("--prompt must not be empty")
    return continue_text(core, tokenizer, o["prompt"], o["num_tokens"], mem_len=o["mem_len"],
                         temperature=o["temperature"], top_k=o["top_k"], greedy=o["greedy"],
                         seed=o["seed"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    options = values(SPEC)
    text = exit_on_error(lambda: run(**options))
    print(options["prompt"] + text, flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    define(SPEC)
    app.run(main)
