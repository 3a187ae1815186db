"""Training learns, and lands in the same place on every seed: the training
job with its default warm-up, clip and schedule, a tiny model on real text.

Measured (float32, 2-core AMD EPYC): validation bpc 3.756 / 3.715 / 3.725
for seeds 0 / 1 / 2 (max/min 1.011; a byte unigram model scores 4.8). With
the warm-up removed (`warmup_steps=0`) the same runs give 3.713 / 3.666 /
3.528: lower after 300 steps, but spread 1.052, which fails the spread bound.
That separation is small beside the quality recipe's (no warm-up: held-out
ppl 264 / 421 / 512 over three seeds; the default: 215–218 over five), which
needs 1,500 steps of the `small` model, minutes per seed:
`benchmarks/bench_quality.py` measures it (docs/training.md)."""
import os

import pytest

from training.train import run

TEXT = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                    "tinyshakespeare.txt")
RECIPE = dict(preset="tiny", dataset="text", data_dir=TEXT, train_steps=300, batch_size=16,
              tgt_len=32, mem_len=32, learning_rate=5e-3, eval_max_segments=100, verbose=0,
              mixed_precision="none", checkpoint_every=1000, strategy="one_device")


@pytest.mark.skipif(not os.path.isfile(TEXT), reason="needs ../shared/data/tinyshakespeare.txt")
def test_every_seed_learns_the_text_to_the_same_loss(tmp_path):
    bpc = []
    for seed in (0, 1, 2):
        result = run(model_dir=str(tmp_path / f"seed{seed}"), seed=seed,
                     cache_dir=str(tmp_path / "cache"), **RECIPE)
        bpc.append(result["final_eval"]["bpc"])
    assert max(bpc) < 3.95, bpc
    assert max(bpc) / min(bpc) < 1.03, bpc
