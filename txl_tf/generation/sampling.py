"""The one sampler: greedy, temperature, top-k, top-p and a repetition
penalty over a batch of last-position log-probs, with per-row settings and
per-row counter-based randomness (`txl_tf.generation.counter_rng`).

This TensorFlow version runs inside the compiled Keras decoder's
`tf.while_loop`; `txl_tf.generation.sampling_numpy` mirrors it line for line for the
host loop that drives ONNX Runtime and the reloaded SavedModel. The mirror
exists for speed: calling this function from the host pays TensorFlow's
dispatch on every token, a large share of an ONNX Runtime step of a small
model on a CPU, where numpy pays a small fraction of it (measured at 267103f).
`tests/test_sampling.py` checks that both
pick the same ids for every setting, ties included. keras-hub's samplers (`keras_hub.samplers`) were
not used: they draw from a stateful `SeedGenerator` with
`random.categorical`, so a row's draws depend on its batch and on the
backend's RNG; they take one setting for the whole batch; and they keep
running the model for rows that have stopped, whereas our memory must freeze
when a row stops. keras-hub is also not a dependency here.

Ties: log-probs from two backends differ by ~1e-6, so every decision that
compares log-probs treats values within `TIE_TOLERANCE` of each other as
equal: greedy takes the lowest id among those within the tolerance of the
best, and a top-k or top-p cut keeps every token tied with the last one kept.
Sampling proper inverts the CDF in id order at the row's uniform, a decision
that tiny differences change only when the uniform falls within ~1e-6 of a
boundary. The CDF and top-p's running mass are int64 sums of the weights in
units of 2**-36 (`WEIGHT_BITS`), the same in any order of summation: float32
sums over lm1b's 793 k ids rounded differently under XLA and in numpy and
moved most draws there; what is left between the two is the last bit of
their `exp` (about 1 draw in 16 at 793 k ids of equal weight).

Rows with no distribution: a row that holds NaN or +inf anywhere, or no
finite value at all (`usable_rows` False: a model whose weights or inputs
hold NaN or inf, a float16 overflow) gets id 0 from `sample_next` (never an
id outside the vocabulary, the same on every backend) and draws nothing in
`choose`, which treats it as a halted row; the generation loops stop with a
`txl_tf.generation.nan_rows.NonFiniteLogProbsError` naming it. A -inf
log-prob is probability 0: such an id is never drawn while its row holds a
finite value.
"""
import numpy as np
import tensorflow as tf

from txl_tf.generation import counter_rng
from txl_tf.generation.sampling_settings import TIE_TOLERANCE, WEIGHT_BITS, Sampling
from txl_tf.layers.xla_context import compiling_with_xla

# `Sampling` lives in sampling_settings (no TensorFlow: the runtimes' numpy
# sampler reads it) and is re-exported here, its first home.
__all__ = ["Sampling", "choose", "sample_next", "usable_rows"]


def sample_next(log_probs, seen, keys, counters, temperature, top_k, top_p, penalty):
    """Next ids `[B]` int32 from `log_probs [B, V]`.

    seen: bool `[B, V]`, ids the repetition penalty applies to. keys: int64
    `[B]` stream keys (`counter_rng.row_key`); counters: int64 `[B]`, the
    draw's index in the row's stream. temperature, top_p, penalty: float32
    `[B]`; top_k: int32 `[B]`. A row that is not `usable_rows` gets id 0.
    """
    lp = tf.convert_to_tensor(log_probs, tf.float32)
    return _sample(lp, usable_rows(lp), seen, keys, counters, temperature, top_k, top_p,
                   penalty)


def usable_rows(log_probs):
    """bool `[B]`: the rows of `log_probs [B, V]` that are a distribution to
    sample: no NaN, no +inf, at least one finite value (-inf is probability
    0). Comparisons, not a max: XLA's max skips NaN, TensorFlow's keeps it;
    one reduction (each finite value counts 1, NaN and +inf count inf)."""
    counts = tf.reduce_sum(tf.where(log_probs < np.inf,  # NaN compares False
                                    tf.where(log_probs > -np.inf, 1.0, 0.0), np.inf), -1)
    return (counts >= 1) & (counts < np.inf)


def _sample(lp, usable, seen, keys, counters, temperature, top_k, top_p, penalty):
    """`sample_next` of float32 `lp` whose `usable_rows` are `usable`."""
    vocab, ids = _vocab_ids(lp)
    lp = tf.where(seen, lp * penalty[:, None], lp)
    best = tf.reduce_max(lp, -1, keepdims=True)
    # The lowest id within the tolerance of the best (`vocab` if none: NaN),
    # by a max: a GPU has no int64 min.
    greedy = vocab - tf.reduce_max(tf.where(lp >= best - TIE_TOLERANCE, vocab - ids,
                                            tf.zeros([], ids.dtype)), -1)

    def sampled():
        temp = tf.where(temperature > 0, temperature, 1.0)[:, None]
        cut = tf.cond(tf.reduce_any(top_k > 0) | tf.reduce_any(top_p < 1),
                      lambda: _cut_off(lp, temp, top_k, top_p, vocab),
                      lambda: tf.fill(tf.shape(best), -np.inf))
        allowed = lp >= cut - TIE_TOLERANCE
        weights = tf.where(allowed, tf.exp((lp - best) / temp), 0.0)
        cdf = tf.cumsum(_integers(weights), axis=-1)
        u = counter_rng.uniform(keys, counters)
        first_above = tf.reduce_sum(tf.cast(cdf <= _share(cdf[:, -1:], u[:, None]), ids.dtype),
                                    -1)
        last_allowed = tf.reduce_max(tf.where(allowed, ids, tf.constant(-1, ids.dtype)), -1)
        return tf.where(temperature > 0, tf.minimum(first_above, last_allowed), greedy)

    chosen = tf.cond(tf.reduce_any(temperature > 0), sampled, lambda: greedy)
    return tf.cast(tf.where(usable, chosen, tf.zeros([], chosen.dtype)), tf.int32)


def _vocab_ids(lp):
    """The vocabulary's size (an int where `lp [B, V]`'s is static) and its
    ids `[1, V]`, in the dtype of the sampler's ids and counts over the
    vocabulary: int64 in TensorFlow's graphs, which keep the int32 math of a
    GPU in host memory, so an int32 `[B, V]` made on the GPU would be copied
    to the host at each token (tests/test_gpu_kernels.py; their ranges come
    from int32 shapes, which stay on the host); int32 under XLA, which keeps
    it on the device, where a `[B, V]` of int64 costs a CPU twice the
    memory traffic of int32."""
    dtype = tf.int32 if compiling_with_xla() else tf.int64
    if lp.shape[1] is not None:
        return lp.shape[1], tf.range(lp.shape[1], dtype=dtype)[None, :]
    size = tf.shape(lp)[1]
    return tf.cast(size, dtype), tf.cast(tf.range(size), dtype)[None, :]


def _cut_off(lp, temp, top_k, top_p, vocab):
    """`[B, 1]`: the lowest log-prob that top-k and top-p keep."""
    ranked = tf.sort(lp, axis=-1, direction="DESCENDING")
    rank = _vocab_ids(lp)[1]
    k = tf.where(top_k > 0, tf.cast(top_k, rank.dtype), tf.cast(vocab, rank.dtype))
    in_top_k = rank < k[:, None]
    logits = tf.where(in_top_k, ranked / temp, -np.inf)
    mass = _integers(tf.exp(logits - tf.reduce_max(logits, -1, keepdims=True)))
    mass_before = tf.cumsum(mass, axis=-1, exclusive=True)
    # top_p 1 cuts nothing (the share of the total is rounded down).
    kept = in_top_k & ((mass_before < _share(tf.reduce_sum(mass, -1, keepdims=True),
                                              top_p[:, None])) | (top_p >= 1)[:, None])
    n_kept = tf.maximum(tf.reduce_sum(tf.cast(kept, rank.dtype), -1), 1)
    return tf.gather(ranked, n_kept - 1, batch_dims=1)[:, None]


def _integers(weights):
    """float32 weights in [0, 1] as int64 multiples of 2**-WEIGHT_BITS (truncated)."""
    return tf.cast(weights * 2.0 ** WEIGHT_BITS, tf.int64)


def _share(total, fraction):
    """`fraction` (float32 in [0, 1]) of the int64 `total`, in integers: the
    fraction's first 24 bits f, floor(total * f / 2**24) exactly (the total's
    high and low 24 bits times f apart: no int64 overflow)."""
    f = tf.cast(fraction * 2.0 ** 24, tf.int64)
    low = tf.bitwise.bitwise_and(total, 2 ** 24 - 1)
    return tf.bitwise.right_shift(total, 24) * f + tf.bitwise.right_shift(low * f, 24)


def choose(log_probs, rows, seen, counters, done, pad_id):
    """One decoding step's bookkeeping around `sample_next`, for every backend.

    Rows already `done` get `pad_id` and log-prob 0 and draw nothing; so do
    rows whose log-probs are not `usable_rows` (NaN, +inf, nothing finite),
    which stay not done: their counter does not move, by which the caller
    finds them. Returns `(ids [B] int32, their log-probs [B], seen,
    counters, done)` updated: a row is done once it has emitted one of its
    stop ids (`rows.stop [B, V]`).
    """
    lp = tf.convert_to_tensor(log_probs, tf.float32)
    usable = usable_rows(lp)
    active = ~done & usable
    ids = _sample(lp, usable, seen, rows.keys, counters, rows.temperature, rows.top_k,
                  rows.top_p, rows.penalty)
    ids = tf.where(active, ids, pad_id)
    chosen = tf.where(active, tf.gather(lp, ids, batch_dims=1), 0.0)
    seen = seen | (tf.one_hot(ids, tf.shape(lp)[1], on_value=True, off_value=False)
                   & active[:, None])
    counters = counters + tf.cast(active, tf.int64)
    done = done | (tf.gather(rows.stop, ids, batch_dims=1) & active)
    return ids, chosen, seen, counters, done
