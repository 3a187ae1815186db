"""Incremental decoding over the pure core.

The prompt is fed in segments, then each new token is fed alone with the
memory of everything before it, so decoding costs one token's attention per
step instead of re-reading the context. (Scoring a corpus or a document is
`txl_tf.evaluation.evaluate_ids`.)
"""
import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm


class Generator:
    """Samples continuations from a `TransformerXL` core.

    `mem_len` is the memory the model looks back on while decoding (default:
    the config's `mem_len`); `segment_len` is how much of the prompt is fed
    per call. Both calls are `tf.function`s with relaxed shapes, so repeated
    generation does not retrace.
    """

    def __init__(self, core, mem_len=None, segment_len=None):
        self.core = core
        self.mem_len = core.config.mem_len if mem_len is None else int(mem_len)
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        self.segment_len = int(segment_len or core.config.tgt_len)
        self._step = tf.function(self._last_log_probs, reduce_retracing=True)

    def _last_log_probs(self, token_ids, memory):
        log_probs, memory = self.core(token_ids, memory, training=False)
        return log_probs[:, -1], memory

    def prime(self, prompt_ids):
        """Feeds `prompt_ids [B, L]` (L >= 1); returns the next-token log-probs
        `[B, n_token]` and the memory."""
        prompt_ids = np.asarray(prompt_ids, np.int32)
        if prompt_ids.ndim != 2 or prompt_ids.shape[1] == 0:
            raise ValueError(f"prompt_ids must be [batch, length>=1], got {prompt_ids.shape}")
        memory = self.core.initial_memory(prompt_ids.shape[0], mem_len=self.mem_len)
        for start in range(0, prompt_ids.shape[1], self.segment_len):
            log_probs, memory = self._step(prompt_ids[:, start:start + self.segment_len], memory)
        return log_probs, memory

    def generate(self, prompt_ids, num_tokens, temperature=1.0, top_k=0, seed=None,
                 progress=False):
        """`[B, num_tokens]` new ids. `temperature == 0` is greedy; `top_k > 0`
        samples among the k most likely tokens. `progress` is a bool (a tqdm
        bar on stderr) or a callback `progress(done, num_tokens)`."""
        check_sampling(num_tokens, temperature, top_k, self.core.config.n_token)
        rng = np.random.default_rng(seed)
        log_probs, memory = self.prime(prompt_ids)
        report = progress if callable(progress) else None
        steps = range(num_tokens) if report else tqdm(
            range(num_tokens), disable=not progress, desc="generating")
        out = []
        for i in steps:
            token = sample(log_probs.numpy(), temperature, top_k, rng)
            out.append(token)
            log_probs, memory = self._step(token[:, None], memory)
            if report:
                report(i + 1, num_tokens)
        return np.stack(out, axis=1) if out else np.zeros((len(prompt_ids), 0), np.int32)


def check_sampling(num_tokens, temperature, top_k, n_token):
    """Raises ValueError for a negative count or temperature, or a `top_k`
    outside `[0, n_token]`."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if not temperature >= 0:  # also NaN
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 <= top_k <= n_token:
        raise ValueError(f"top_k must be in [0, {n_token}] (the vocabulary size), got {top_k}")


def sample(log_probs, temperature, top_k, rng):
    """One id per row of `log_probs [B, V]`."""
    if temperature == 0:
        return np.argmax(log_probs, axis=-1).astype(np.int32)
    logits = log_probs / temperature
    if top_k > 0:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs], np.int32)

