"""The two paths of the paper's evaluation-speed comparison
(`benchmarks/eval_speed.py`, its own functions) compute the same thing where
their contexts coincide: a window of L tokens recomputed without memory, and segments of
L/2 with a memory of L/2."""
import json

import numpy as np

from benchmarks.eval_speed import vanilla_log_probs, xl_log_probs
from txl_tf import TransformerXL, TransformerXLConfig


def test_a_sliding_window_and_segments_with_memory_agree_on_the_first_l_tokens():
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40))
    length = 8
    ids = np.random.default_rng(0).integers(0, 40, (2, 2 * length))
    window = vanilla_log_probs(core, ids, length)
    segments = xl_log_probs(core, ids, length)
    # Up to token L-1 both see every earlier token; later the window drops
    # the oldest tokens while the memory keeps whole segments.
    np.testing.assert_allclose(window[:, :length], segments[:, :length], atol=1e-5)
    assert np.abs(window[:, length + 1:] - segments[:, length + 1:]).max() > 1e-3


def test_the_benchmark_runs_tiny(tmp_path, jobs):
    output = tmp_path / "eval_speed.json"
    done = jobs.run("benchmarks.eval_speed", ["--preset=tiny", "--lengths=8", "--batch_sizes=2",
                                              "--vanilla_calls=1", "--xl_calls=1",
                                              f"--output={output}"], check=True)
    assert "| 8 | 2 |" in done.stdout
    row, = json.loads(output.read_text())["rows"]
    assert row["vanilla_s_per_token"] > 0 and row["xl_s_per_token"] > 0
