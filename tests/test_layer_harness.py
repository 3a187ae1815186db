"""One harness for every Keras layer in `txl_tf/layers/` (in the manner of
keras-hub's `run_layer_test`): `get_config` / `from_config` gives the same
outputs with the same weights; a `.keras` file of a model holding the layer
gives them back; a training step reaches every weight with a finite gradient
and lowers the loss; float32 and 16-bit dtype policies compute in their dtype
with float32 weights; masked keys change nothing where the layer masks."""
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import layers as layers_package
from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
from txl_tf.layers.adaptive_softmax import AdaptiveLogSoftmax
from txl_tf.layers.absolute_attention import AbsoluteMultiHeadAttention
from txl_tf.layers.attention import RelativeMultiHeadAttention
from txl_tf.layers.learnable_attention import LearnableRelativeAttention
from txl_tf.layers.block import TransformerXLBlock
from txl_tf.layers.dropout import Dropout
from txl_tf.layers.feedforward import PositionwiseFeedForward
from txl_tf.layers.masks import attention_visibility
from txl_tf.layers.positional import RelativePositionalEncoding
from bfloat16_cpu import needs_bfloat16_matmuls

B, Q, M, D = 2, 3, 4, 8
RNG = np.random.default_rng(0)
HIDDEN = RNG.normal(size=(B, Q, D)).astype(np.float32)
MEMORY = RNG.normal(size=(B, M, D)).astype(np.float32)
MEM_VALID = np.array([[False, True, True, True], [True, True, True, True]])
IDS = np.array([[1, 6, 12], [0, 9, 4]], np.int32)


BIASES = RNG.normal(size=(2, 2, 4)).astype(np.float32)  # r_w_bias, r_r_bias [n_head, d_head]


def attention_inputs(dtype="float32"):
    """`(inputs, pos_emb, memory, visible, r_w_bias, r_r_bias)` for a segment of Q after M slots."""
    pos = RelativePositionalEncoding(D)(tf.constant(M + Q))
    biases = [tf.constant(b) for b in BIASES]
    visible = attention_visibility(Q, tf.constant(MEM_VALID))
    return (tf.cast(HIDDEN, dtype), tf.cast(pos, dtype), tf.cast(MEMORY, dtype), visible,
            *biases)


def learnable_inputs(dtype="float32"):
    """`attention_inputs` with attn_type 1's position terms: an embedding
    `[M + Q, n_head, d_head]` and a bias `[M + Q, n_head]` per key."""
    hidden, _, memory, visible, u, _ = attention_inputs(dtype)
    return hidden, tf.cast(EMBEDDINGS, dtype), memory, visible, u, tf.cast(POSITION_BIASES, dtype)


EMBEDDINGS = RNG.normal(size=(M + Q, 2, 4)).astype(np.float32)
POSITION_BIASES = RNG.normal(size=(M + Q, 2)).astype(np.float32)


# name: (class, constructor kwargs, call(layer, dtype) -> output, whether it has weights)
CASES = {
    "adaptive_embedding": (AdaptiveEmbedding, dict(n_token=13, d_embed=8, d_model=D,
                                                   cutoffs=[5, 9], div_val=2),
                           lambda layer, dtype: layer(IDS), True),
    "adaptive_softmax": (AdaptiveLogSoftmax, dict(n_token=13, d_embed=8, d_model=D,
                                                  cutoffs=[5, 9], div_val=2, tie_weight=False,
                                                  tie_projs=[False, False, False]),
                         lambda layer, dtype: layer(tf.cast(HIDDEN, dtype), tf.constant(IDS)),
                         True),
    "attention": (RelativeMultiHeadAttention, dict(d_model=D, n_head=2, d_head=4),
                  lambda layer, dtype: layer(*attention_inputs(dtype)), True),
    "absolute_attention": (AbsoluteMultiHeadAttention, dict(d_model=D, n_head=2, d_head=4),
                           lambda layer, dtype: layer(*attention_inputs(dtype)), True),
    "learnable_attention": (LearnableRelativeAttention, dict(d_model=D, n_head=2, d_head=4),
                            lambda layer, dtype: layer(*learnable_inputs(dtype)), True),
    "block": (TransformerXLBlock, dict(d_model=D, n_head=2, d_head=4, d_inner=16),
              lambda layer, dtype: layer(*attention_inputs(dtype)), True),
    "feedforward": (PositionwiseFeedForward, dict(d_model=D, d_inner=16),
                    lambda layer, dtype: layer(tf.cast(HIDDEN, dtype)), True),
    "positional": (RelativePositionalEncoding, dict(d_model=D, clamp_len=3),
                   lambda layer, dtype: layer(tf.constant(M + Q)), False),
    "dropout": (Dropout, dict(rate=0.5),
                lambda layer, dtype: layer(tf.cast(HIDDEN, dtype), training=False), False),
}


def build(name, **overrides):
    cls, kwargs, call, _ = CASES[name]
    layer = cls(**{**kwargs, **overrides})
    call(layer, "float32")
    return layer


def test_the_harness_covers_every_layer():
    classes = {obj for module in vars(layers_package).values() if inspect.ismodule(module)
               for obj in vars(module).values()
               if inspect.isclass(obj) and issubclass(obj, keras.layers.Layer)
               and obj.__module__.startswith("txl_tf.layers")}
    import pkgutil, importlib  # noqa: E401
    for info in pkgutil.iter_modules(layers_package.__path__):
        module = importlib.import_module(f"txl_tf.layers.{info.name}")
        classes |= {obj for obj in vars(module).values()
                    if inspect.isclass(obj) and issubclass(obj, keras.layers.Layer)
                    and obj.__module__ == module.__name__}
    assert classes == {case[0] for case in CASES.values()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_config_with_the_same_weights_gives_the_same_outputs(name):
    cls, _, call, _ = CASES[name]
    layer = build(name)
    clone = cls.from_config(layer.get_config())
    call(clone, "float32")
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(call(clone, "float32").numpy(), call(layer, "float32").numpy())


@keras.saving.register_keras_serializable(package="txl_tf_tests")
class Holder(keras.Model):
    """A model that holds one layer (by its serialized config)."""

    def __init__(self, layer_config, **kwargs):
        super().__init__(**kwargs)
        self.layer_config = layer_config
        self.inner = keras.saving.deserialize_keras_object(layer_config)

    def build(self, input_shape=None):
        if not self.inner.built:
            self.inner.build(None)
        self.built = True

    def call(self, inputs):
        return inputs

    def get_config(self):
        return {**super().get_config(), "layer_config": self.layer_config}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_keras_file_of_a_model_holding_the_layer_gives_the_same_outputs(name, tmp_path):
    _, _, call, _ = CASES[name]
    layer = build(name)
    holder = Holder(keras.saving.serialize_keras_object(layer))
    holder.build((1,))
    holder.inner.set_weights(layer.get_weights())
    path = str(tmp_path / f"{name}.keras")
    holder.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(call(loaded.inner, "float32").numpy(),
                                  call(layer, "float32").numpy())


@pytest.mark.parametrize("name", [n for n, case in sorted(CASES.items()) if case[3]])
def test_a_training_step_reaches_every_weight_and_lowers_the_loss(name):
    _, _, call, _ = CASES[name]
    layer = build(name)

    def loss():
        out = tf.cast(call(layer, "float32"), tf.float32)
        return tf.reduce_mean(out) if name == "adaptive_softmax" else tf.reduce_mean(out ** 2)

    with tf.GradientTape() as tape:
        before = loss()
    grads = tape.gradient(before, layer.trainable_weights)
    assert layer.trainable_weights and all(g is not None for g in grads)
    grads = [tf.convert_to_tensor(g) for g in grads]
    assert all(np.isfinite(g.numpy()).all() for g in grads)
    assert sum(float(tf.reduce_sum(g ** 2)) for g in grads) > 0
    keras.optimizers.SGD(0.05).apply_gradients(zip(grads, layer.trainable_weights))
    assert float(loss()) < float(before)


@pytest.mark.parametrize("policy", [
    "float32", pytest.param("mixed_bfloat16", marks=needs_bfloat16_matmuls), "mixed_float16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_dtype_policies(name, policy):
    _, _, call, _ = CASES[name]
    layer = build(name, dtype=policy)
    compute = keras.mixed_precision.Policy(policy).compute_dtype
    out = call(layer, compute)
    # The adaptive softmax returns float32 losses / log-probs under any policy.
    assert out.dtype == (tf.float32 if name == "adaptive_softmax" else compute)
    assert all(w.dtype == "float32" for w in layer.weights)
    reference = call(build(name), "float32")
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), reference.numpy(),
                               rtol=0.1, atol=0.1)


@pytest.mark.parametrize("name", ["attention", "absolute_attention", "learnable_attention",
                                  "block"])
def test_masked_memory_slots_change_nothing(name):
    layer = build(name)
    inputs = list(learnable_inputs() if name == "learnable_attention" else attention_inputs())
    out = layer(*inputs).numpy()
    garbage = MEMORY.copy()
    garbage[0, 0] = 1e3  # the only slot that row 0 may not see
    inputs[2] = tf.constant(garbage)
    np.testing.assert_array_equal(layer(*inputs).numpy(), out)
    garbage[0, 1] = 1e3  # a visible slot does change the output
    inputs[2] = tf.constant(garbage)
    assert not np.allclose(layer(*inputs).numpy()[0], out[0])
