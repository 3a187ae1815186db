"""The evaluation-speed benchmark in CI size: both paths agree where their
contexts coincide, and the timing loop runs (no timing assertions)."""
import numpy as np

from benchmarks.eval_speed import measure, table, vanilla_log_probs, xl_log_probs
from txl_tf import TransformerXL, TransformerXLConfig


def test_vanilla_window_and_xl_segments_agree_on_the_first_l_tokens():
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40))
    length = 8
    ids = np.random.default_rng(0).integers(0, 40, (2, 2 * length))
    vanilla = vanilla_log_probs(core, ids, length)
    xl = xl_log_probs(core, ids, length)
    # Up to token L-1 both see every earlier token; later the window drops
    # the oldest tokens while the memory keeps whole segments.
    np.testing.assert_allclose(vanilla[:, :length], xl[:, :length], atol=1e-5)
    assert np.abs(vanilla[:, length + 1:] - xl[:, length + 1:]).max() > 1e-3


def test_measure_runs_tiny():
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40))
    row = measure(core, batch=2, length=8, vanilla_calls=1, xl_calls=1)
    assert row["vanilla_s_per_token"] > 0 and row["xl_s_per_token"] > 0
    assert "| 8 | 2 |" in table([row])
