"""Decoding with the memory's keys and values carried (`cached_hidden_states`)
computes what the plain core computes, in every configuration."""
import numpy as np
import pytest
import tensorflow as tf

from test_core import VARIANTS, ids, make_core
from txl_tf import Memory


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("step_len", [1, 3])
def test_cached_steps_equal_plain_steps(name, step_len):
    """A prompt, then steps of `step_len` tokens: the cached path gives the
    plain path's hidden states and memory, and its keys / values are those of
    the new memory (also through invalid slots, since the memory starts
    empty and fills up)."""
    core = make_core(**VARIANTS[name])
    memory = core.initial_memory(2)
    _, memory = core.hidden_states(ids(2, 4, seed=3), memory)  # slots 0..3 valid of mem_len
    plain = cached = memory
    keys_values = core.memory_keys_values(memory)
    for step in range(4):
        x = ids(2, step_len, seed=10 + step)
        want, plain = core.hidden_states(x, plain)
        got, cached, keys_values = core.cached_hidden_states(x, cached, keys_values)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(cached.mems, plain.mems, atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(cached.mem_mask, plain.mem_mask)
        fresh = core.memory_keys_values(cached)
        for carried, recomputed in zip(keys_values, fresh):
            valid = np.asarray(cached.mem_mask)[None, :, None, :, None]
            np.testing.assert_allclose(np.where(valid, carried, 0), np.where(valid, recomputed, 0),
                                       atol=2e-5, rtol=1e-5)


def test_memory_keys_values_geometry_and_invalid_slots():
    core = make_core()
    cfg = core.config
    memory = core.initial_memory(3)
    garbage = Memory(tf.fill(memory.mems.shape, np.nan), memory.mem_mask)  # all slots invalid
    keys, values = core.memory_keys_values(garbage)
    assert keys.shape == values.shape == (cfg.n_layer, 3, cfg.n_head, cfg.mem_len, cfg.d_head)
    assert np.all(np.asarray(keys) == 0) and np.all(np.asarray(values) == 0)  # never NaN


def test_cached_path_with_no_memory():
    core = make_core()
    memory = core.initial_memory(2, mem_len=0)
    want, _ = core.hidden_states(ids(2, 5), memory)
    got, new, (keys, values) = core.cached_hidden_states(ids(2, 5), memory,
                                                         core.memory_keys_values(memory))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    assert keys.shape[3] == values.shape[3] == 0 and new.mems.shape[2] == 0
