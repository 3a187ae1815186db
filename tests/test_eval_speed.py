"""The two paths of the paper's evaluation-speed comparison
(`benchmarks/eval_speed.py`) compute the same thing where their contexts
coincide: a window of L tokens recomputed without memory, and segments of
L/2 with a memory of L/2."""
import json

import numpy as np

from txl_tf import TransformerXL, TransformerXLConfig


def window_log_probs(core, ids, length):
    """Log-probs of every position t of `ids` [B, N] from a window of the
    last `length` tokens ending at t, no memory."""
    out = []
    for t in range(ids.shape[1]):
        window = ids[:, max(0, t - length + 1):t + 1]
        hidden, _ = core.hidden_states(window, core.initial_memory(ids.shape[0], 0))
        out.append(np.asarray(core.crit(hidden[:, -1:]))[:, 0])
    return np.stack(out, 1)


def segment_log_probs(core, ids, length):
    """Log-probs of `ids` [B, N], a segment of `length // 2` at a time with a
    memory of `length // 2`."""
    seg = length // 2
    memory = core.initial_memory(ids.shape[0], seg)
    out = []
    for start in range(0, ids.shape[1], seg):
        log_probs, memory = core(ids[:, start:start + seg], memory)
        out.append(np.asarray(log_probs))
    return np.concatenate(out, 1)


def test_a_sliding_window_and_segments_with_memory_agree_on_the_first_l_tokens():
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40))
    length = 8
    ids = np.random.default_rng(0).integers(0, 40, (2, 2 * length))
    window = window_log_probs(core, ids, length)
    segments = segment_log_probs(core, ids, length)
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
