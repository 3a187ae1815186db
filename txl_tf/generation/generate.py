"""The first decoding API, kept as a thin shell over `txl_tf.generation.decoder.Decoder`
(which see for batches of any lengths, top-p, stop ids, streaming and the
memory of a conversation).

```python
new_ids = Generator(core, mem_len=640).generate(prompt_ids, 100, temperature=0.8, top_k=40)
```
"""
import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from txl_tf.errors import TxlError
from txl_tf.generation.decoder import Decoder
from txl_tf.generation.flow import prefill
from txl_tf.generation.request import check_prompts


class Generator:
    """Samples continuations from a `TransformerXL` core (see `Decoder`)."""

    def __init__(self, core, mem_len=None, segment_len=None, jit_compile=True):
        self.core = core
        self.decoder = Decoder(core, mem_len, segment_len, jit_compile=jit_compile)
        self.mem_len, self.segment_len = self.decoder.mem_len, self.decoder.segment_len

    def prime(self, prompt_ids):
        """Reads `prompt_ids [B, L]` (L >= 1); the next-token log-probs
        `[B, n_token]` and the memory."""
        prompt_ids = np.asarray(prompt_ids)
        if prompt_ids.ndim != 2 or prompt_ids.shape[1] == 0:
            raise TxlError(f"prompt_ids must be [batch, length>=1], got {prompt_ids.shape}")
        prompts = check_prompts(prompt_ids, self.core.config.n_token)
        memory = self.decoder.initial_memory(len(prompts))
        log_probs, memory = prefill(self.decoder, prompts, memory, self.segment_len)
        return tf.constant(log_probs), memory

    def generate(self, prompt_ids, num_tokens, temperature=1.0, top_k=0, seed=None,
                 progress=False):
        """`[B, num_tokens]` new ids. `temperature == 0` is greedy; `top_k > 0`
        samples among the k most likely tokens; row i draws from `seed + i`
        (`seed=None`: a fresh random seed each call).
        `progress` is a bool (a tqdm bar on stderr) or a callback
        `progress(done, num_tokens)` (called every 8 tokens and at the end)."""
        if num_tokens < 0:  # the sampling settings are checked by the decoder
            raise TxlError(f"num_tokens must be >= 0, got {num_tokens}")
        prompt_ids = np.asarray(prompt_ids)
        if prompt_ids.ndim != 2 or prompt_ids.shape[1] == 0:
            raise TxlError(f"prompt_ids must be [batch, length>=1], got {prompt_ids.shape}")
        bar = None if callable(progress) or not progress else tqdm(total=num_tokens,
                                                                   desc="generating")
        done = [0]

        def report(ids):
            done[0] += ids.shape[1]
            if bar is not None:
                bar.update(ids.shape[1])
            elif progress:
                progress(done[0], num_tokens)

        out = self.decoder.generate(prompt_ids, int(num_tokens), temperature=temperature,
                                    top_k=top_k, seed=_seed(seed),
                                    stream=report if progress else None)
        if bar is not None:
            bar.close()
        return out.ids


def _seed(seed):
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1)[0] % 2 ** 31)
    return int(seed)
