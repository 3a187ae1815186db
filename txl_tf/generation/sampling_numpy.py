"""numpy mirror of `txl_tf.generation.sampling.choose` and `txl_tf.generation.counter_rng`, for the
runtimes' host loop; same operations in the same order and dtypes
(`tests/test_sampling.py` holds the two to the same ids)."""
import numpy as np

from txl_tf.generation.sampling_settings import (GOLDEN, MULTIPLIERS, STEP_SALT, TIE_TOLERANCE,
                                                  WEIGHT_BITS)

_MASK32 = np.int64(0xFFFFFFFF)


def _mulmod32(x, m):
    high = (((x >> 16) * m) & 0xFFFF) << 16
    return (high + (x & 0xFFFF) * m) & _MASK32


def mix32(x):
    x = np.asarray(x, np.int64)
    x = x ^ (x >> 16)
    x = _mulmod32(x, MULTIPLIERS[0])
    x = x ^ (x >> 15)
    x = _mulmod32(x, MULTIPLIERS[1])
    return x ^ (x >> 16)


def row_key(seed):
    seed = np.asarray(seed, np.int64)
    return mix32((seed & _MASK32) ^ mix32(((seed >> 32) & _MASK32) ^ GOLDEN))


def uniform(key, counter):
    counter = np.asarray(counter, np.int64) & _MASK32
    key = np.asarray(key, np.int64)
    if key.ndim == 1 and key.shape == counter.shape and key.size <= SMALL_BATCH:
        # A decode step's few rows: the same integer math on Python ints (exact
        # either way), a few times faster than numpy's fixed cost per operation.
        bits = np.array([_mix32_int(k ^ _mix32_int(c ^ STEP_SALT))
                         for k, c in zip(key.tolist(), counter.tolist())], np.int64)
    else:
        bits = mix32(key ^ mix32(counter ^ STEP_SALT))
    return (bits >> 8).astype(np.float32) * np.float32(2.0 ** -24)


# Rows up to this many draw through `_mix32_int` (and `_any` reads a list): past
# about 16 numpy is as fast.
SMALL_BATCH = 8


def _any(flags):
    """Whether a bool array `[B]` holds a True (a list's `in` for a few rows:
    numpy's `any` costs several times more there)."""
    return True in flags.tolist() if flags.size <= SMALL_BATCH else bool(flags.any())


def _mix32_int(x):
    """`mix32` of one Python int in int64's range: numpy's int64 products
    wrap, but only their low 16 bits are kept, which wrapping leaves as they
    are; every other step is exact in both."""
    x ^= x >> 16
    x = ((((x >> 16) * MULTIPLIERS[0]) & 0xFFFF) << 16) + (x & 0xFFFF) * MULTIPLIERS[0] \
        & 0xFFFFFFFF
    x ^= x >> 15
    x = ((((x >> 16) * MULTIPLIERS[1]) & 0xFFFF) << 16) + (x & 0xFFFF) * MULTIPLIERS[1] \
        & 0xFFFFFFFF
    return x ^ (x >> 16)


def sample_next(log_probs, seen, keys, counters, temperature, top_k, top_p, penalty):
    """See `txl_tf.generation.sampling.sample_next` (id 0 for a row that is not `usable_rows`)."""
    lp = np.asarray(log_probs, np.float32)
    return _sample(lp, usable_rows(lp), seen, keys, counters, temperature, top_k, top_p,
                   penalty)


def usable_rows(log_probs):
    """See `txl_tf.generation.sampling.usable_rows`: a row's max is NaN if it
    holds one (numpy's max keeps NaN), +inf if it holds +inf, -inf if it
    holds nothing finite."""
    return np.isfinite(np.asarray(log_probs).max(-1))


def _sample(lp, usable, seen, keys, counters, temperature, top_k, top_p, penalty):
    if not usable.all():  # no distribution: id 0, computed without NaN's warnings
        lp = np.where(usable[:, None], lp, np.float32(0))
    vocab = lp.shape[1]
    if _any(penalty != 1):  # (x * 1 == x: skipping it changes nothing)
        lp = np.where(seen, lp * penalty[:, None], lp).astype(np.float32)
    best = lp.max(-1, keepdims=True)
    # The smallest id within the tolerance of the best: the first True of a
    # bool row (argmax), not a min over an id array as wide as the vocabulary.
    greedy = ((lp >= best - np.float32(TIE_TOLERANCE)).argmax(-1)
              if _any(temperature <= 0) else None)
    if greedy is not None and not _any(temperature > 0):
        return np.where(usable, greedy, 0).astype(np.int32)
    temp = np.where(temperature > 0, temperature, np.float32(1))[:, None].astype(np.float32)
    if _any(top_k > 0) or _any(top_p < 1):
        cut = _cut_off(lp, temp, top_k, top_p, vocab)
    else:
        cut = np.full(best.shape, -np.inf, np.float32)
    allowed = lp >= cut - np.float32(TIE_TOLERANCE)
    with np.errstate(over="ignore", under="ignore"):
        weights = np.where(allowed, np.exp((lp - best) / temp), np.float32(0)).astype(np.float32)
    cdf = np.cumsum(_integers(weights), axis=-1)
    u = uniform(keys, counters)
    first_above = (cdf <= _share(cdf[:, -1:], u[:, None])).sum(-1)
    last_allowed = vocab - 1 - allowed[:, ::-1].argmax(-1)  # (the best is always allowed)
    sampled = np.minimum(first_above, last_allowed)
    chosen = sampled if greedy is None else np.where(temperature > 0, sampled, greedy)
    return np.where(usable, chosen, 0).astype(np.int32)


def _cut_off(lp, temp, top_k, top_p, vocab):
    ranked = -np.sort(-lp, axis=-1)
    k = np.where(top_k > 0, top_k, vocab)
    in_top_k = np.arange(vocab)[None, :] < k[:, None]
    logits = np.where(in_top_k, ranked / temp, -np.inf).astype(np.float32)
    with np.errstate(under="ignore"):
        mass = _integers(np.exp(logits - logits.max(-1, keepdims=True)))
    mass_before = np.cumsum(mass, axis=-1) - mass  # exact: integers
    kept = in_top_k & ((mass_before < _share(mass.sum(-1, keepdims=True), top_p[:, None]))
                       | (top_p >= 1)[:, None])
    n_kept = np.maximum(kept.sum(-1), 1)
    return ranked[np.arange(len(ranked)), n_kept - 1][:, None]


def _integers(weights):
    return (np.asarray(weights, np.float32) * np.float32(2.0 ** WEIGHT_BITS)).astype(np.int64)


def _share(total, fraction):
    f = (np.asarray(fraction, np.float32) * np.float32(2.0 ** 24)).astype(np.int64)
    return (total >> 24) * f + (((total & (2 ** 24 - 1)) * f) >> 24)


def choose(log_probs, rows, seen, counters, done, pad_id):
    """See `txl_tf.generation.sampling.choose`; numpy in, numpy out (`seen`
    is updated in a copy)."""
    lp = np.asarray(log_probs, np.float32)
    usable = usable_rows(lp)
    active = ~done & usable
    ids = _sample(lp, usable, seen, rows.keys, counters, rows.temperature, rows.top_k,
                  rows.top_p, rows.penalty)
    ids = np.where(active, ids, pad_id).astype(np.int32)
    batch = np.arange(len(ids))
    chosen = np.where(active, lp[batch, ids], np.float32(0)).astype(np.float32)
    seen = seen.copy()
    seen[batch[active], ids[active]] = True
    counters = counters + active.astype(np.int64)
    done = done | (rows.stop[batch, ids] & active)
    return ids, chosen, seen, counters, done
