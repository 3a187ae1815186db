"""Decoding over the ring cache (`decode_cache`, `call_with_cache`,
`cache_memory`) computes what the plain core computes, in every
configuration, eager and under XLA, while the ring wraps around."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from test_core import VARIANTS, ids, make_core
from txl_tf import Memory
from txl_tf.app.deprecation import REMOVED
from txl_tf.layers.ring_cache import KeysValues

CASES = {**VARIANTS, "same_length_pytorch": dict(same_length=True,
                                                 same_length_convention="pytorch")}


def _assert_same_memory(got, want):
    np.testing.assert_array_equal(got.mem_mask, want.mem_mask)
    valid = np.asarray(want.mem_mask)[None, :, :, None]
    np.testing.assert_allclose(np.where(valid, got.mems, 0), np.where(valid, want.mems, 0),
                               atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name,filled", [(name, None) for name in CASES]
                         + [("plain", 3), ("untied_r_same_length_clamp", 4),
                            ("pre_lnorm_untied_outputs", 3)])
def test_cached_steps_equal_plain_steps(name, filled):
    """A prompt fills 3 of 5 slots, then 13 one-token steps: the ring (6
    slots) wraps twice; hidden states and memory stay the plain path's, and
    the carried keys / values are those of the memory it holds. With
    `filled`, the cache projects only the newest slots of the prompt's memory."""
    core = make_core(**CASES[name])
    memory = core.initial_memory(2, mem_len=5)
    _, memory = core.hidden_states(ids(2, 3, seed=3), memory)
    plain, cache = memory, core.decode_cache(memory, filled=filled)
    for step in range(13):
        x = ids(2, 1, seed=10 + step)
        want, plain = core.hidden_states(x, plain)
        got, cache = core.call_with_cache(x[:, 0], cache)
        np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5)
        _assert_same_memory(core.cache_memory(cache), plain)
    fresh = core.decode_cache(plain)
    # the ring holds the memory rotated: compare in time order, slot by slot
    order = (np.asarray(cache.slot) + 1 + np.arange(5)) % 6
    valid = np.asarray(plain.mem_mask)[:, None, :, None]
    for carried, recomputed in _keys_values_by_slot(cache, fresh):
        np.testing.assert_allclose(np.where(valid, carried[:, :, order], 0),
                                   np.where(valid, recomputed[:, :, :5], 0), atol=2e-5)


# (mem_len, same_length, convention, clamp_len (0: none), position keys)
STEP_CORNERS = [(0, True, "pytorch", 0, False), (1, True, "pytorch", 0, True),
                (1, True, "tf", 1, False), (2, True, "pytorch", 1, False),
                (2, False, "tf", 3, True), (5, True, "pytorch", 3, False),
                (5, True, "tf", 1, True), (5, True, "pytorch", 2, True)]


@pytest.mark.parametrize("seed", range(len(STEP_CORNERS)))
def test_cached_steps_equal_plain_steps_at_the_steps_corners(seed):
    """The one-pass core is the oracle over the step's corners: memories of
    0, 1, 2 and 5 (`clamp_len` below and above them), `same_length` with
    each convention, rows at different fill levels (a session table mixes
    them), with and without position keys (the Decoder's), while the ring
    wraps twice (the free slot at every slot, 0 and the last too)."""
    mem_len, same_length, convention, clamp, keys = STEP_CORNERS[seed]
    rng = np.random.default_rng(seed)
    core = make_core(seed=seed, same_length=same_length, same_length_convention=convention,
                     clamp_len=clamp, untie_r=bool(seed % 2))
    batch, cfg = 3, core.config
    fill = rng.permutation([0, mem_len // 2, mem_len])  # each row its own
    plain = Memory(rng.normal(size=(cfg.n_layer, batch, mem_len, cfg.d_model)).astype(np.float32),
                   np.arange(mem_len)[None, :] >= (mem_len - fill)[:, None])
    cache = core.decode_cache(plain)
    if keys:
        cache = cache._replace(position_keys=core.decode_position_keys(cache))
    for step in range(2 * mem_len + 3):
        x = ids(batch, 1, seed=100 + step)
        want, plain = core.hidden_states(x, plain)
        got, cache = core.call_with_cache(x[:, 0], cache)
        np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5, err_msg=f"step {step}")
        _assert_same_memory(core.cache_memory(cache), plain)


@pytest.mark.parametrize("adapt", ["lora", "int8"])
def test_cached_steps_of_an_adapted_core_equal_plain_steps(adapt):
    """A LoRA-adapted core's step joins the adapted query kernel (twice,
    with u and v as its bias); an int8 core's projects itself (three
    matmuls, u and v added): both the one-pass core's."""
    core = make_core(untie_r=True, same_length=True, same_length_convention="pytorch",
                     clamp_len=2)
    rng = np.random.default_rng(4)
    for layer in core._flatten_layers():
        if isinstance(layer, keras.layers.Dense) and layer.name in ("query", "key", "value"):
            if adapt == "int8":
                layer.quantize("int8")
            else:  # the adapters' B starts at zero: a random one changes the kernels
                layer.enable_lora(2)
                layer.lora_kernel_b.assign(rng.normal(0, 0.3, layer.lora_kernel_b.shape))
    memory = core.initial_memory(2, mem_len=4)
    _, plain = core.hidden_states(ids(2, 3, seed=3), memory)
    cache = core.decode_cache(plain)
    for step in range(7):
        x = ids(2, 1, seed=10 + step)
        want, plain = core.hidden_states(x, plain)
        got, cache = core.call_with_cache(x[:, 0], cache)
        np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5, err_msg=f"step {step}")


def _keys_values_by_slot(*caches):
    """Every layer's keys, then values, of each of `caches` as `[B, H, S,
    d_head]` numpy arrays (the cache keeps keys as columns), zipped."""
    def rows(cache):
        return ([np.swapaxes(np.asarray(k), 2, 3) for k in cache.keys]
                + [np.asarray(v) for v in cache.values])
    return zip(*(rows(c) for c in caches))


@pytest.mark.parametrize("overrides,keys", [
    (VARIANTS["untied_r_same_length_clamp"], False),
    (dict(same_length=True, same_length_convention="pytorch", clamp_len=2), True)])
def test_cached_steps_under_xla_equal_eager(overrides, keys):
    """The decoder's use: steps inside one XLA-compiled `tf.while_loop`, the
    ring updated in place, equal the same steps run eagerly (also with the
    "pytorch" convention's visibility, `clamp_len` below the memory and the
    position keys the Decoder makes)."""
    core = make_core(**overrides)
    memory = core.initial_memory(3, mem_len=4)
    _, memory = core.hidden_states(ids(3, 2, seed=3), memory)
    tokens = tf.constant(ids(3, 9, seed=4))

    def decode_cache(memory):
        cache = core.decode_cache(memory)
        return cache._replace(position_keys=core.decode_position_keys(cache)) if keys else cache

    @tf.function(jit_compile=True)
    def run(memory):
        def body(t, out, cache):
            hidden, cache = core.call_with_cache(tokens[:, t], cache)
            return t + 1, tf.tensor_scatter_nd_update(out, [[t]], hidden[None]), cache
        out = tf.zeros([9, 3, core.config.d_model])
        _, out, cache = tf.while_loop(lambda t, *_: t < 9, body,
                                      (tf.constant(0), out, decode_cache(memory)))
        return out, core.cache_memory(cache)

    got, got_memory = run(memory)
    cache = core.decode_cache(memory)  # eager, without position keys
    for t in range(9):
        want, cache = core.call_with_cache(tokens[:, t], cache)
        np.testing.assert_allclose(got[t], want, atol=2e-5, rtol=1e-5)
    _assert_same_memory(got_memory, core.cache_memory(cache))


def _after_steps(core, mem_len, prompt, steps, row_0_stops):
    """Two rows read `prompt` ids into a memory of `mem_len`, then take
    `steps` cached steps, row 0 stopping after `row_0_stops`: `(the memory
    before the steps, the step ids, the cache)`."""
    memory = core.initial_memory(2, mem_len=mem_len)
    _, memory = core.hidden_states(ids(2, prompt, seed=3), memory)
    cache = core.decode_cache(memory)
    tokens = ids(2, steps, seed=5)
    for t in range(steps):
        _, cache = core.call_with_cache(tokens[:, t], cache,
                                    stopped=tf.constant([t >= row_0_stops, False]))
    return memory, tokens, cache


def test_stopped_rows_keep_their_memory():
    """Row 0 stops after two steps: its memory stays what it was then (also
    after the ring has wrapped), while row 1 goes on as it would alone."""
    core = make_core()
    memory, tokens, cache = _after_steps(core, mem_len=3, prompt=2, steps=9, row_0_stops=2)
    got = core.cache_memory(cache)
    row = lambda m, i: Memory(m.mems[:, i:i + 1], m.mem_mask[i:i + 1])  # noqa: E731
    for i, steps in ((0, 2), (1, 9)):
        want = row(memory, i)
        for t in range(steps):  # one token at a time, as decoding reads them
            _, want = core.hidden_states(tokens[i:i + 1, t:t + 1], want)
        _assert_same_memory(row(got, i), want)


def test_invalid_slots_never_reach_the_cache():
    core = make_core()
    memory = core.initial_memory(3)
    garbage = Memory(tf.fill(memory.mems.shape, np.nan), memory.mem_mask)  # all slots invalid
    cache = core.decode_cache(garbage)
    cfg = core.config
    assert cache.keys[0].shape == (3, cfg.n_head, cfg.d_head, cfg.mem_len + 1)  # columns
    assert cache.values[0].shape == (3, cfg.n_head, cfg.mem_len + 1, cfg.d_head)
    assert all(np.all(np.asarray(k) == 0) for k in cache.keys + cache.values + cache.mems)
    hidden, _ = core.call_with_cache(ids(3, 1)[:, 0], cache)
    want, _ = core.hidden_states(ids(3, 1), memory)
    np.testing.assert_allclose(hidden, want[:, 0], atol=2e-5, rtol=1e-5)


def test_cached_path_with_no_memory():
    core = make_core()
    memory = core.initial_memory(2, mem_len=0)
    cache = core.decode_cache(memory)
    for t in range(3):
        got, cache = core.call_with_cache(ids(2, 3)[:, t], cache)
        want, _ = core.hidden_states(ids(2, 3)[:, t:t + 1], memory)
        np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5)
    assert core.cache_memory(cache).mems.shape[2] == 0


def test_filled_projects_only_the_newest_slots():
    """`filled` smaller than the memory in use drops the older slots' keys
    (the steps then differ: the window matters), and bad values are refused."""
    core = make_core()
    memory = core.initial_memory(2, mem_len=5)
    _, memory = core.hidden_states(ids(2, 3, seed=3), memory)
    x = ids(2, 1, seed=4)[:, 0]
    want, _ = core.call_with_cache(x, core.decode_cache(memory, filled=3))
    short = core.decode_cache(memory, filled=2)
    assert not np.asarray(short.keys[0])[..., 2].any()  # the oldest valid slot, not projected
    assert not np.asarray(short.values[0])[:, :, 2].any()
    assert np.asarray(short.keys[0])[..., 3].any()
    got, _ = core.call_with_cache(x, short)
    assert np.abs(np.asarray(got) - np.asarray(want)).max() > 1e-3
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="filled must be"):
            core.decode_cache(memory, filled=bad)


@pytest.mark.parametrize("name", ["plain", "untied_r_same_length_clamp",
                                  "pre_lnorm_untied_outputs"])
def test_a_segment_on_the_cache_is_a_segment_on_its_memory(name):
    """After steps that wrapped the ring and a row that stopped, segments of
    2, 4 and 7 ids (longer than the memory) read on the cache give what
    `hidden_states` gives on the memory it holds, and the new cache holds
    the new memory with its keys and values (steps go on from it)."""
    core = make_core(**CASES[name])
    _, _, cache = _after_steps(core, mem_len=5, prompt=3, steps=8, row_0_stops=5)
    plain = core.cache_memory(cache)
    for length in (2, 4, 7):
        x = ids(2, length, seed=length)
        want, plain = core.hidden_states(x, plain)
        got, cache = core.call_with_cache(x, cache)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        _assert_same_memory(core.cache_memory(cache), plain)
        fresh = core.decode_cache(plain)
        for carried, recomputed in _keys_values_by_slot(cache, fresh):
            np.testing.assert_allclose(carried[:, :, :5], recomputed[:, :, :5], atol=2e-5)
    x = ids(2, 1, seed=9)
    want, _ = core.hidden_states(x, plain)
    got, _ = core.call_with_cache(x[:, 0], cache)
    np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["plain", "untied_r_same_length_clamp",
                                  "pre_lnorm_untied_outputs"])
def test_a_segment_on_keys_and_values_is_a_segment_on_their_memory(name):
    """`call_with_cache` on `KeysValues` (a memory held as keys and values in time order, no
    layer inputs, no ring): segments of 1, 2, 4 and 7 ids from a memory
    partly filled give what `hidden_states` gives, and the new keys and
    values are those of the new memory."""
    core = make_core(**CASES[name])
    _, plain = core.hidden_states(ids(2, 3, seed=3), core.initial_memory(2, mem_len=5))

    def keys_values(memory):
        pairs = [block.rel_attn.memory_keys_values(m)
                 for block, m in zip(core.blocks, tf.unstack(memory.mems))]
        return [k for k, _ in pairs], [v for _, v in pairs]
    keys, values = keys_values(plain)
    mem_mask = plain.mem_mask
    for length in (1, 2, 4, 7):
        x = ids(2, length, seed=length)
        want, plain = core.hidden_states(x, plain)
        got, (keys, values, mem_mask) = core.call_with_cache(
            x, KeysValues(keys, values, mem_mask))
        keys, values = list(keys), list(values)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        np.testing.assert_array_equal(mem_mask, plain.mem_mask)
        valid = np.asarray(mem_mask)[:, None, :, None]
        for carried, recomputed in zip(keys + values, sum(keys_values(plain), [])):
            np.testing.assert_allclose(np.where(valid, carried, 0),
                                       np.where(valid, recomputed, 0), atol=2e-5)


REMOVED_CALLS = {  # what each removed call was, as a user wrote it
    "TransformerXL.cached_step": lambda core, cache: core.cached_step(ids(2, 1)[:, 0], cache),
    "TransformerXL.cached_read": lambda core, cache: core.cached_read,
    "TransformerXL.cached_segment": lambda core, cache: type(core).cached_segment,
    "TransformerXL.segment_on_keys": lambda core, cache: core.segment_on_keys,
    "TransformerXL.call_with_cache(position_keys=)": lambda core, cache: core.call_with_cache(
        ids(2, 1)[:, 0], cache, position_keys=core.decode_position_keys(cache)),
    "RelativeMultiHeadAttention.call_on_keys":
        lambda core, cache: core.blocks[0].rel_attn.call_on_keys,
    "RelativeMultiHeadAttention.token_call":
        lambda core, cache: type(core.blocks[0].rel_attn).token_call,
}


@pytest.mark.parametrize("name", REMOVED_CALLS)
def test_the_names_removed_in_0_4_0_name_their_replacement(name):
    """The cached reads before `call_with_cache` (deprecated in 0.3.0): one
    error naming the call that replaces each (on an instance or the class)."""
    assert set(REMOVED_CALLS) == {n for n in REMOVED if not n.startswith("Runtime.")}
    core = make_core()
    cache = core.decode_cache(core.initial_memory(2, mem_len=3))
    error = TypeError if name.endswith("=)") else AttributeError
    with pytest.raises(error, match=rf"^{re.escape(name)} was removed; use call_with_cache\("):
        REMOVED_CALLS[name](core, cache)
    if error is TypeError:  # another unknown keyword is Python's own error
        with pytest.raises(TypeError, match=r"call_with_cache\(\) got an unexpected keyword "
                                            r"argument 'stoped'$"):
            core.call_with_cache(ids(2, 1)[:, 0], cache, stoped=None)
    else:
        assert not hasattr(core.blocks[0].rel_attn if "Attention" in name else core,
                           name.split(".")[1])


def test_a_segment_on_a_cache_of_unknown_axes_in_a_graph():
    """`call_with_cache` of a segment in a `tf.function` that leaves every
    axis of the cache unknown (heads too) gives the eager result."""
    core = make_core()
    _, _, cache = _after_steps(core, mem_len=5, prompt=3, steps=8, row_0_stops=5)
    x = ids(2, 3, seed=4)
    want, _ = core.call_with_cache(x, cache)
    specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), (tf.constant(x), cache))
    read = tf.function(lambda i, c: core.call_with_cache(i, c)[0], input_signature=specs)
    np.testing.assert_allclose(read(x, cache), want, atol=2e-5, rtol=1e-5)
