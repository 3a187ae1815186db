"""Memory reach you can train for: a label decided only by a document's first
segment (3 segments of 8 tokens, memory of one segment, 2 layers) is out of
reach with the paper's gradient cut and learnt with the gradient through the
memory (`TransformerXLClassifier(grad_segments=...)`; the task of
`benchmarks.memory_worth --part=reach`)."""
import keras
import numpy as np
import pytest

from txl_tf import TransformerXLClassifier, TransformerXLConfig, WarmupCosineDecay

CLASSES, MARKER = 3, 253
SEGMENT, SEGMENTS, STEPS, BATCH = 8, 3, 800, 32


def documents(n, seed):
    """`({"token_ids", "lengths"}, labels)`: noise over 0..252 with one marker
    (253 + label) somewhere in the first segment."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, MARKER, (n, SEGMENT * SEGMENTS)).astype(np.int32)
    labels = rng.integers(0, CLASSES, n).astype(np.int32)
    ids[np.arange(n), rng.integers(0, SEGMENT, n)] = MARKER + labels
    return {"token_ids": ids, "lengths": np.full(n, ids.shape[1], np.int32)}, labels


def held_out_accuracy(grad_segments, seed):
    keras.utils.set_random_seed(seed)
    config = TransformerXLConfig.preset("tiny", n_token=256, tgt_len=SEGMENT, mem_len=SEGMENT)
    model = TransformerXLClassifier(config, CLASSES, mem_len=SEGMENT,
                                    grad_segments=grad_segments, dtype="float32")
    model.compile(keras.optimizers.Adam(WarmupCosineDecay(3e-3, STEPS)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = documents(STEPS * BATCH, seed)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    tx, ty = documents(300, 10_000 + seed)
    predicted = np.argmax(model.predict(tx, batch_size=BATCH, verbose=0), -1)
    return float(np.mean(predicted == ty))


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_through_the_memory_learns_what_the_first_segment_decides(seed):
    assert held_out_accuracy(grad_segments=3, seed=seed) >= 0.9  # measured 1.0 for seeds 0-2


def test_with_the_memory_cut_the_first_segment_is_out_of_reach():
    assert held_out_accuracy(grad_segments=1, seed=0) < 0.45  # chance is 1/3
