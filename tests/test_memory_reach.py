"""Memory reach you can train for: a label decided only by a document's first
segment (3 segments of 8 tokens, memory of one segment, 2 layers) is out of
reach with the paper's gradient cut and learnt with the gradient through the
memory (`grad_segments`)."""
import pytest

from benchmarks.bench_memory_reach import SPEC, run_arm
from txl_tf.app.flagspec import merge

TASK = dict(preset="tiny", segment_len=8, segments=3, steps=800, batch_size=32,
            learning_rate=3e-3, test_documents=300)


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_through_the_memory_learns_what_the_first_segment_decides(seed):
    result = run_arm(merge(SPEC, TASK), mem_len=8, grad_segments=3, seed=seed)
    assert result["accuracy"] >= 0.9, result  # measured 1.0 for seeds 0, 1, 2


def test_with_the_memory_cut_the_first_segment_is_out_of_reach():
    result = run_arm(merge(SPEC, TASK), mem_len=8, grad_segments=1, seed=0)
    assert result["accuracy"] < 0.45, result  # chance is 1/3
