"""The decode cache's position keys (`TransformerXL.decode_position_keys`):
one key per distinct distance, the clamp's shared by every farther slot, and
`clamp_len <= 0` no clamp at all."""
import numpy as np
import pytest

from test_core import ids, make_core
from txl_tf import Memory


@pytest.mark.parametrize("clamp_len,keys", [(-1, 5), (0, 5), (2, 3), (4, 5), (9, 5)])
def test_position_keys_are_one_per_distinct_distance(clamp_len, keys):
    """A cache of 5 slots (memory 4): every distance its own key unless
    `clamp_len` (> 0) is below 4, then `clamp_len + 1` keys."""
    core = make_core(clamp_len=clamp_len)
    cache = core.decode_cache(core.initial_memory(2, mem_len=4))
    position_keys = core.decode_position_keys(cache)
    cfg = core.config
    assert len(position_keys) == cfg.n_layer
    for layer_keys in position_keys:
        assert tuple(layer_keys.shape) == (cfg.n_head, cfg.d_head, keys)


@pytest.mark.parametrize("clamp_len", [0, -1])
def test_steps_on_position_keys_without_a_clamp_equal_plain_steps(clamp_len):
    """`clamp_len` 0 and -1 both mean no clamp: steps scored against the
    position keys see every memory slot at its own distance, as the plain
    core does (a full memory, every slot visible)."""
    core = make_core(seed=1, clamp_len=clamp_len)
    cfg, rng = core.config, np.random.default_rng(1)
    plain = Memory(rng.normal(size=(cfg.n_layer, 2, 4, cfg.d_model)).astype(np.float32),
                   np.ones((2, 4), bool))
    cache = core.decode_cache(plain)
    cache = cache._replace(position_keys=core.decode_position_keys(cache))
    for step in range(6):
        x = ids(2, 1, seed=30 + step)
        want, plain = core.hidden_states(x, plain)
        got, cache = core.call_with_cache(x[:, 0], cache)
        np.testing.assert_allclose(got, want[:, 0], atol=2e-5, rtol=1e-5, err_msg=f"step {step}")
