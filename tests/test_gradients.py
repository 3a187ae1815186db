"""The training step's gradients are the gradients of the paper's loss:
compared with central differences of the float64 numpy transcription of the
paper's code (memory carried), and dropout's masks differ between steps and
layers and keep the right fraction."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from reference_numpy import forward as reference_forward

from txl_tf import TransformerXLConfig, TransformerXLLM
from txl_tf.layers.dropout import Dropout
from txl_tf.weights.checkpoints import get_weights
from bfloat16_cpu import needs_bfloat16_matmuls

T = 6


def reference_loss(weights, config, x, y, mems):
    """Mean NLL of the float64 numpy forward (time-major inside)."""
    log_probs, _ = reference_forward(weights, config, x.T, mems)
    picked = np.take_along_axis(log_probs, y.T[..., None], -1)
    return -picked.mean()


@pytest.mark.parametrize("variant", [dict(), dict(cutoffs=[60, 150], div_val=2, d_embed=32,
                                                  untie_r=True)])
def test_the_training_steps_update_is_the_gradient_of_the_papers_loss(variant):
    keras.utils.set_random_seed(2)
    config = TransformerXLConfig.preset("tiny", n_token=200, dropout=0.0, tgt_len=T,
                                        mem_len=T, init_std=0.1, **variant)
    model = TransformerXLLM(config, batch_size=2)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0))  # update = -gradient
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 200, (2, 2 * T + 1)).astype(np.int32)
    model.fit(stream[:, :T], stream[:, 1:T + 1], batch_size=2, verbose=0)  # fills the memory
    mems = [m.astype(np.float64) for m in np.transpose(model.mems.numpy(), (0, 2, 1, 3))]
    before = {k: v.astype(np.float64) for k, v in get_weights(model.core).items()}
    x, y = stream[:, T:2 * T], stream[:, T + 1:2 * T + 1]
    model.fit(x, y, batch_size=2, verbose=0)
    after = get_weights(model.core)
    # A small step: a wider one can cross a ReLU kink and miss the derivative.
    eps, checked = 1e-6, 0
    for name, value in before.items():
        for flat in rng.choice(value.size, size=min(3, value.size), replace=False):
            index = np.unravel_index(flat, value.shape)
            losses = []
            for sign in (1, -1):
                moved = dict(before)
                moved[name] = value.copy()
                moved[name][index] += sign * eps
                losses.append(reference_loss(moved, config, x, y, mems))
            numeric = (losses[0] - losses[1]) / (2 * eps)
            applied = value[index] - after[name][index]
            assert applied == pytest.approx(numeric, rel=2e-3, abs=2e-6), (name, index)
            checked += abs(numeric) > 1e-4
    assert checked > len(before)  # most checks are of gradients that are not ~0


def test_dropout_masks_differ_between_steps_and_layers_and_keep_the_rate():
    keras.utils.set_random_seed(3)
    model = TransformerXLLM(TransformerXLConfig.preset("tiny", dropout=0.25, dropatt=0.1),
                            batch_size=2)
    layers = [layer for layer in model.core._flatten_layers() if isinstance(layer, Dropout)]
    assert len(layers) >= 2 * model.config.n_layer + 3
    x = tf.ones([64, 256])
    masks = [[layer(x, training=True).numpy() != 0 for _ in range(2)] for layer in layers]
    for layer, (first, second) in zip(layers, masks):
        assert (first != second).any()  # a new mask every step
        assert abs(first.mean() - (1 - layer.rate)) < 0.01
    firsts = [m[0] for m, layer in zip(masks, layers) if layer.rate == 0.25]
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            assert (firsts[i] != firsts[j]).any(), (i, j)  # no two layers share a mask



@needs_bfloat16_matmuls
def test_the_feed_forwards_bias_gradients_sum_in_float32_under_bfloat16():
    """TensorFlow's `BiasAdd` gradient (Keras's `Dense`) sums a bfloat16
    gradient in bfloat16 on CPU: 3.8% error over 1,024 rows. With
    `pre_lnorm` the layer's output is `inputs + (... + b2)`, so b2's
    gradient must be the upstream gradient summed over the rows, up to its
    rounding to bfloat16."""
    from txl_tf.layers.feedforward import PositionwiseFeedForward
    rng = np.random.default_rng(0)
    ff = PositionwiseFeedForward(64, 256, pre_lnorm=True, dtype="mixed_bfloat16")
    inputs = tf.constant(rng.normal(size=(16, 64, 64)), tf.float32)
    upstream = rng.normal(size=(16, 64, 64)).astype(np.float32) * 1e-3
    with tf.GradientTape() as tape:
        out = ff(inputs)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * upstream)
    assert out.dtype == tf.bfloat16
    got = tape.gradient(loss, ff.layer_2.bias).numpy()
    want = tf.cast(tf.cast(upstream, tf.bfloat16), tf.float64).numpy().sum((0, 1))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-3
