"""Parity of exported runtimes with the Keras core over consecutive segments."""
import numpy as np

from txl_tf.errors import TxlError


class ParityError(TxlError, AssertionError):
    """An exported model disagrees with the Keras core beyond the tolerance."""


def random_segments(n_token, batch_size, seg_len, n_segments=3, seed=0):
    """`n_segments` int32 arrays `[batch_size, seg_len]` of ids in range."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_token, (batch_size, seg_len), dtype=np.int32)
            for _ in range(n_segments)]


def core_outputs(core, segments, mem_len, log_probs="all", zero_filled=False,
                 token_by_token=False):
    """Per segment `(log_probs, mems, mem_mask)` numpy from the eager Keras core;
    `token_by_token`: each segment read one token per call (what the cached
    decode interface computes: every token sees the memory's M positions)."""
    memory = core.initial_memory(segments[0].shape[0], mem_len, zero_filled)
    results = []
    for ids in segments:
        pieces = [ids[:, j:j + 1] for j in range(ids.shape[1])] if token_by_token else [ids]
        steps = []
        for piece in pieces:
            lp, memory = core(piece, memory, training=False)
            steps.append(lp.numpy())
        lp = np.concatenate(steps, 1)
        results.append((lp[:, -1] if log_probs == "last" else lp,
                        memory.mems.numpy(), memory.mem_mask.numpy()))
    return results


def runtime_outputs(runtime, segments):
    """Per segment `(log_probs, mems, mem_mask)` numpy from a `Runtime`, memory carried."""
    memory = runtime.initial_memory(segments[0].shape[0])
    results = []
    for ids in segments:
        lp, memory = runtime.step(ids, memory)
        results.append((lp, *memory.numpy()))
    return results


def cached_outputs(runtime, segments):
    """`runtime_outputs` through the cached decode interface: each segment read
    one token at a time on the decode cache of the memory before it."""
    memory = runtime.initial_memory(segments[0].shape[0])
    results = []
    for ids in segments:
        cache = runtime.decode_init(memory)
        steps = []
        for column in ids.T:
            lp, cache = runtime.decode_step(column, cache)
            steps.append(lp)
        memory = runtime.cache_memory(cache)
        lp = np.stack(steps, 1) if runtime.log_probs_mode == "all" else steps[-1]
        results.append((lp, *memory.numpy()))
    return results


def largest_difference(a, b):
    """The largest abs difference of two arrays: inf where they differ by a
    NaN (either side's), so that no tolerance passes it; 0 where both hold
    the same inf."""
    a, b = np.asarray(a), np.asarray(b)
    gap = np.where(a == b, 0.0, np.abs(a - b))
    return float(np.nan_to_num(gap, nan=np.inf).max(initial=0))


def max_differences(reference, other):
    """`{"log_probs": max abs diff, "mems": max abs diff, "mem_mask_equal": bool}`
    (a NaN on either side counts as an infinite difference)."""
    diff = {"log_probs": 0.0, "mems": 0.0, "mem_mask_equal": True}
    reference, other = list(reference), list(other)
    if len(reference) != len(other):
        raise ParityError(f"{len(other)} segments' outputs for {len(reference)} segments")
    for (lp_a, s_a, v_a), (lp_b, s_b, v_b) in zip(reference, other):
        if lp_a.shape != lp_b.shape or s_a.shape != s_b.shape or v_a.shape != v_b.shape:
            raise ParityError(f"shape mismatch: {lp_a.shape}/{s_a.shape}/{v_a.shape} vs "
                              f"{lp_b.shape}/{s_b.shape}/{v_b.shape}")
        diff["log_probs"] = max(diff["log_probs"], largest_difference(lp_a, lp_b))
        diff["mems"] = max(diff["mems"], largest_difference(s_a, s_b))
        diff["mem_mask_equal"] &= bool(np.array_equal(v_a, v_b))
    return diff


def check_parity(core, runtimes, segments, tol=1e-4):
    """Compares each runtime with the core.

    Args:
        core: the `TransformerXL` the runtimes were exported from.
        runtimes: `Runtime`s (non-empty; the first's `mem_len`, log-probs
            mode and zero-filled start are used for the core too).
        segments: int `[B, T]` arrays, read in order from a fresh memory.
        tol: the largest absolute difference allowed (default 1e-4; a
            16-bit decode cache or decode graph gets at least its own).

    Returns:
        `{backend: differences}` (`max_differences`).

    Raises:
        ParityError: naming the backend and the quantity that differs.
        TxlError: no runtimes, or a `tol` that passes anything.
    """
    runtimes = list(runtimes)
    if not runtimes:  # the first was runtimes[0]: an IndexError
        raise TxlError("check_parity needs at least one runtime")
    first = runtimes[0]
    options = (first.mem_len, first.log_probs_mode, first.info.zero_filled)
    reference = core_outputs(core, segments, *options)
    by_token = core_outputs(core, segments, *options, token_by_token=True)
    return {runtime.backend: check_runtime(reference, runtime, segments, tol, by_token)
            for runtime in runtimes}


# The least tolerance a decode cache of 16-bit keys and values is checked
# with: they are rounded to 11 significant bits, which moves a trained
# model's log-probs by about 1e-3 (docs/export-and-serving.md).
CACHE_TOLERANCES = {"float16": 1e-2}
# The least tolerance decode graphs computing in 16 bits (`--decode_dtype`)
# are checked with: their weights, activations, keys and values are rounded
# to 11 significant bits (docs/export-and-serving.md).
DECODE_TOLERANCES = {"float16": 5e-2}


def check_runtime(reference, runtime, segments, tol=1e-4, token_reference=None):
    """`max_differences` of a runtime from `reference` (the core's `core_outputs` on
    the same `segments`), or `ParityError` beyond `tol`; with `token_reference`
    (`core_outputs(..., token_by_token=True)`) also its cached decode interface
    (beyond `CACHE_TOLERANCES` or `DECODE_TOLERANCES` where its cache or
    its compute is 16-bit and `tol` is less)."""
    diff = max_differences(reference, runtime_outputs(runtime, segments))
    _check(diff, runtime.backend, tol)
    if runtime.has_decode_cache and token_reference is not None:
        diff["decode_cache"] = check_cached_decode(runtime, segments, token_reference, tol,
                                                   f"{runtime.backend}'s cached decode")
    return diff


def check_cached_decode(runtime, segments, token_reference, tol=1e-4, what="cached decode"):
    """`max_differences` of `runtime`'s cached decode interface from
    `token_reference` (`core_outputs(..., token_by_token=True)`), or
    `ParityError` naming `what` beyond `tol` (or `CACHE_TOLERANCES`,
    `DECODE_TOLERANCES` where its cache or its compute is 16-bit)."""
    diff = max_differences(token_reference, cached_outputs(runtime, segments))
    _check(diff, what, max(tol, CACHE_TOLERANCES.get(runtime.info.cache_dtype, tol),
                           DECODE_TOLERANCES.get(runtime.info.decode_dtype, tol)))
    return diff


def check_tolerance(tol):
    """`TxlError` unless `tol` is below inf: NaN (and inf) passes any difference."""
    if not tol < np.inf:
        raise TxlError(f"tol must be a finite number (NaN or inf passes any difference), "
                       f"got {tol}")


def _check(diff, what, tol):
    check_tolerance(tol)
    if diff["log_probs"] > tol or diff["mems"] > tol or not diff["mem_mask_equal"]:
        raise ParityError(f"{what} differs from the Keras core: {diff} (tolerance {tol})")
