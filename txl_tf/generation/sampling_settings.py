"""What the sampler and its numpy mirror share, without TensorFlow: the
`Sampling` settings, the tie tolerance (`txl_tf.generation.sampling`) and the
constants of the counter RNG (`txl_tf.generation.counter_rng`), which the
mirror (`sampling_numpy`) must match bit for bit. The ONNX Runtime host loop
imports only this side."""
import dataclasses

import numpy as np

from txl_tf.checks.numpy_checks import is_real
from txl_tf.errors import TxlError

GOLDEN = 0x9E3779B9  # salts the high half of a seed
STEP_SALT = 0x85EBCA6B  # salts the counter
MULTIPLIERS = (0x7FEB352D, 0x846CA68B)  # lowbias32's two rounds

TIE_TOLERANCE = 1e-4
# The sampler's CDF and top-p's running mass are sums of integers: each weight
# (at most 1) times 2**WEIGHT_BITS, truncated, summed in int64 (exact in any
# order, to 2**(63 - WEIGHT_BITS) ids). A float32 running sum over 793 k ids
# rounds differently in XLA, TensorFlow and numpy, and moved the sampled id.
WEIGHT_BITS = 36


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen.

    Args:
        temperature: 0 is greedy; otherwise log-probs are divided by it
            (default 1.0).
        top_k: sample among the k most likely tokens (0: no limit).
        top_p: sample from the smallest set of most likely tokens whose
            probability reaches top_p (1: no limit); applied after top_k.
        repetition_penalty: >= 1; the log-probs of ids already in this
            call's prompt or output are multiplied by it (CTRL's rule for
            logits <= 0; default 1.0).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def checked(self, n_token):
        """Raises a `TxlError` (a ValueError) naming a bad setting.

        Args:
            n_token: the vocabulary size (`top_k`'s upper bound).

        Returns:
            self.
        """
        t, k, p, r = self.temperature, self.top_k, self.top_p, self.repetition_penalty
        # Real numbers (a complex one lost its imaginary part) that float32, the
        # sampler's type, holds: 1e308 became inf (Python compares a huge int exactly).
        if not is_real(t) or not 0 <= t <= FLOAT32_MAX:
            raise TxlError(f"temperature must be a finite number >= 0 (0 is greedy; at most "
                           f"float32's {FLOAT32_MAX:.4g}), got {t!r}")
        if 0 < t < FLOAT32_TINY:  # TensorFlow and XLA flush it to 0 (greedy), numpy samples
            raise TxlError(f"temperature must be 0 (greedy) or at least float32's smallest "
                           f"normal number {FLOAT32_TINY:.4g}, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= n_token:
            raise TxlError(f"top_k must be an integer in [0, {n_token}] (the vocabulary "
                           f"size; 0 = no limit), got {k!r}")
        if not is_real(p) or not 0 < p <= 1:
            raise TxlError(f"top_p must be in (0, 1] (1 = no limit), got {p!r}")
        if not is_real(r) or not 1 <= r <= FLOAT32_MAX:
            raise TxlError(f"repetition_penalty must be a finite number >= 1 (at most "
                           f"float32's {FLOAT32_MAX:.4g}), got {r!r}")
        return self


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)

