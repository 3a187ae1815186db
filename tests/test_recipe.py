"""The training recipe around the forward pass, against numpy re-statements
of the paper's TF code: the initial weights' statistics, and Adam with the
global-norm clip and the warm-up + cosine schedule over several steps."""
import math

import keras
import numpy as np
import tensorflow as tf

from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.learning.optimizer import ReplicaClippedAdam
from txl_tf.learning.schedule import WarmupCosineDecay


def _near(values, std):
    """Mean 0 and standard deviation `std`, within 5 sampling sigmas."""
    n = values.size
    return (abs(values.mean()) < 5 * std / math.sqrt(n)
            and abs(values.std() - std) < 5 * std / math.sqrt(2 * n))


def test_fresh_weights_have_the_tf_codes_statistics():
    keras.utils.set_random_seed(0)
    cfg = TransformerXLConfig(n_token=3000, n_layer=2, d_model=64, n_head=4, d_head=16,
                              d_inner=128, cutoffs=[300, 1000], div_val=2, untie_r=True,
                              init_std=0.03, proj_init_std=0.01)
    core = TransformerXL(cfg)
    kinds = {}
    for v in core.weights:
        name = v.path.split("/")[-1]
        if name in ("gamma", "beta") or name.startswith(("cutoff_", "cluster")):
            kind = name.split("_")[-1] if name.startswith("cutoff_") else name
        else:
            kind = name
        kinds.setdefault(kind, []).append(np.asarray(v.numpy(), np.float64).ravel())
    kinds = {k: np.concatenate(a) for k, a in kinds.items()}
    for kind in ("r_w_bias", "r_r_bias", "table", "kernel", "r_kernel"):
        assert _near(kinds[kind], 0.03), kind
    for kind in ("W", "proj"):  # the embedding's and the softmax's projections
        assert _near(kinds[kind], 0.01), kind
    assert (kinds["gamma"] == 1).all()
    for kind in ("beta", "bias", "b", "cluster_W", "cluster_b"):
        assert not kinds[kind].any(), kind


def _tf_code_adam(init, grads, peak, total, warmup, clip=0.25, alpha=0.004):
    """tf.train.AdamOptimizer (defaults) on tf.clip_by_global_norm'd
    gradients at the rate of the global step before the update."""
    x = [a.astype(np.float64) for a in init]
    m = [np.zeros_like(a) for a in x]
    v = [np.zeros_like(a) for a in x]
    for step, g in enumerate(grads):
        norm = math.sqrt(sum(float((gg.astype(np.float64) ** 2).sum()) for gg in g))
        g = [gg.astype(np.float64) * clip / max(norm, clip) for gg in g]
        if step < warmup:
            lr = peak * step / warmup
        else:
            progress = min(step - warmup, total - warmup) / (total - warmup)
            lr = peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * progress)) + alpha)
        t = step + 1
        lr_t = lr * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        for i in range(len(x)):
            m[i] = 0.9 * m[i] + 0.1 * g[i]
            v[i] = 0.999 * v[i] + 0.001 * g[i] ** 2
            x[i] = x[i] - lr_t * m[i] / (np.sqrt(v[i]) + 1e-8)
    return x


def test_adam_clip_and_schedule_step_as_the_tf_code():
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (7,), (2, 2, 2)]
    init = [rng.normal(size=s).astype(np.float32) for s in shapes]
    total, warmup, peak = 24, 6, 2.5e-3
    # Every third gradient is far above the clip, the others below it.
    grads = [[(rng.normal(size=s) * (3.0 if t % 3 == 0 else 0.02)).astype(np.float32)
              for s in shapes] for t in range(total)]
    optimizer = ReplicaClippedAdam(learning_rate=WarmupCosineDecay(peak, total, warmup),
                                   epsilon=1e-8, beta_1=0.9, beta_2=0.999,
                                   global_clipnorm=0.25)
    weights = [keras.Variable(a) for a in init]
    optimizer.build(weights)
    optimizer.apply([tf.constant(g) for g in grads[0]], weights)
    # Step 0 of a warm-up has rate 0: the first update moves nothing.
    for w, a in zip(weights, init):
        np.testing.assert_array_equal(w.numpy(), a)
    for g in grads[1:]:
        optimizer.apply([tf.constant(gg) for gg in g], weights)
    expected = _tf_code_adam(init, grads, peak, total, warmup)
    moved = max(np.abs(e - a).max() for e, a in zip(expected, init))
    assert moved > 1e-3
    for w, e in zip(weights, expected):
        np.testing.assert_allclose(w.numpy(), e, rtol=0, atol=1e-6)
