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


def core_outputs(core, segments, mem_len, log_probs="all", zero_filled=False):
    """Per segment `(log_probs, mems, mem_mask)` numpy from the eager Keras core."""
    memory = core.initial_memory(segments[0].shape[0], mem_len, zero_filled)
    results = []
    for ids in segments:
        lp, memory = core(ids, memory, training=False)
        lp = lp.numpy()
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


def max_differences(reference, other):
    """`{"log_probs": max abs diff, "mems": max abs diff, "mem_mask_equal": bool}`."""
    diff = {"log_probs": 0.0, "mems": 0.0, "mem_mask_equal": True}
    for (lp_a, s_a, v_a), (lp_b, s_b, v_b) in zip(reference, other):
        if lp_a.shape != lp_b.shape or s_a.shape != s_b.shape or v_a.shape != v_b.shape:
            raise ParityError(f"shape mismatch: {lp_a.shape}/{s_a.shape}/{v_a.shape} vs "
                              f"{lp_b.shape}/{s_b.shape}/{v_b.shape}")
        diff["log_probs"] = max(diff["log_probs"], float(np.abs(lp_a - lp_b).max(initial=0)))
        diff["mems"] = max(diff["mems"], float(np.abs(s_a - s_b).max(initial=0)))
        diff["mem_mask_equal"] &= bool(np.array_equal(v_a, v_b))
    return diff


def check_parity(core, runtimes, segments, tol=1e-4):
    """Compares each runtime with the core; returns `{backend: differences}` or
    raises `ParityError` naming the backend and the quantity that differs."""
    first = runtimes[0]
    reference = core_outputs(core, segments, first.mem_len, first.log_probs_mode,
                             first.info.zero_filled)
    return {runtime.backend: check_runtime(reference, runtime, segments, tol)
            for runtime in runtimes}


def check_runtime(reference, runtime, segments, tol=1e-4):
    """`max_differences` of a runtime from `reference` (the core's `core_outputs` on
    the same `segments`), or `ParityError` beyond `tol`."""
    diff = max_differences(reference, runtime_outputs(runtime, segments))
    if diff["log_probs"] > tol or diff["mems"] > tol or not diff["mem_mask_equal"]:
        raise ParityError(f"{runtime.backend} differs from the Keras core: {diff} "
                          f"(tolerance {tol})")
    return diff
