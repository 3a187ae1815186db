"""Training learns, and lands in about the same place on every seed: the
training job with its default warm-up, clip and schedule, a tiny model on
real text.

Measured (float32, the 2-core AVX2 machine), validation bpc for seeds 0..5
(a byte unigram model scores 4.8): before the attention's projections became
`Dense` layers (a4b9238) 3.668 / 3.711 / 3.728 / 3.726 / 3.858 / 3.852
(median 3.727, max/min 1.052); after (the same draws' distribution, other
draws) 3.790 / 3.644 / 3.760 / 3.777 / 3.872 / 3.768 (median 3.773, max/min
1.063). So three seeds spread up to about 1.06 by chance alone, and the
bound is 1.08: it catches a run that fails to learn or diverges, not a
small change of the recipe. An earlier bound of 1.03 passed on seeds 0-2 of
the old draws (1.016) and would have failed on seeds 3-5 of the same code
(1.036); it was also said to separate training without the warm-up (1.052
on seeds 0-2), which three seeds cannot. That separation is the quality
recipe's (no warm-up: held-out ppl 264 / 421 / 512 over three seeds; the
default: 215–218 over five), which needs 1,500 steps of the `small` model,
minutes per seed: `benchmarks/quality.py` measures it
(docs/training.md)."""
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
    assert max(bpc) / min(bpc) < 1.08, bpc
