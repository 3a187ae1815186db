"""`ReplicaClippedAdam`'s update of a variable is one op
(`txl_tf.keras_support.keras_compat.FusedAdamUpdate`): it traces one `ResourceApplyAdam` per
variable and far fewer ops than Keras's update, and moves the weights as
Keras's Adam does, to float32 round-off, eagerly, under XLA and on the
replicas of a strategy (the numpy oracle of the paper's TF code is
tests/test_recipe.py's)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import ReplicaClippedAdam

SHAPES = [(6, 4), (4,), (3, 2, 2), (50, 8)]


class KerasUpdateAdam(ReplicaClippedAdam):
    """The same optimizer with Keras 3's own update."""
    update_step = keras.optimizers.Adam.update_step


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def _gradients(steps, seed=1):
    rng = np.random.default_rng(seed)
    return [[tf.constant(rng.normal(size=s).astype(np.float32) * (3.0 if t % 3 == 0 else 0.1))
             for s in SHAPES] for t in range(steps)]


def _train(optimizer_class, gradients, jit_compile=None, **options):
    weights = _weights()
    optimizer = optimizer_class(learning_rate=1e-2, global_clipnorm=1.0, **options)
    optimizer.build(weights)
    def apply(grads):
        optimizer.apply(grads, weights)

    if jit_compile is not None:
        apply = tf.function(apply, jit_compile=jit_compile, autograph=False)
    for grads in gradients:
        apply(grads)
    return [w.numpy() for w in weights]


def _traced_ops(optimizer_class):
    weights = _weights()
    optimizer = optimizer_class(learning_rate=1e-2, global_clipnorm=1.0)
    optimizer.build(weights)
    grads = _gradients(1)[0]
    graph = tf.function(lambda: optimizer.apply(grads, weights),
                        autograph=False).get_concrete_function().graph
    return [op.type for op in graph.get_operations()]


def test_each_variable_is_updated_by_one_op_and_the_trace_shrinks():
    fused, plain = _traced_ops(ReplicaClippedAdam), _traced_ops(KerasUpdateAdam)
    assert fused.count("ResourceApplyAdam") == len(SHAPES)
    assert plain.count("ResourceApplyAdam") == 0
    # Keras's update: about twenty ops a variable; the fused one: a handful.
    assert len(plain) - len(fused) > 10 * len(SHAPES)


@pytest.mark.parametrize("jit_compile", [None, False, True])
def test_the_weights_move_as_with_kerass_update(jit_compile):
    gradients = _gradients(8)
    fused = _train(ReplicaClippedAdam, gradients, jit_compile)
    plain = _train(KerasUpdateAdam, gradients, jit_compile)
    start = _weights()
    moved = max(np.abs(f - s.numpy()).max() for f, s in zip(fused, start))
    assert moved > 1e-2
    for f, p in zip(fused, plain):
        np.testing.assert_allclose(f, p, rtol=0, atol=1e-6)


def test_amsgrad_keeps_kerass_update():
    gradients = _gradients(4)
    fused = _train(ReplicaClippedAdam, gradients, amsgrad=True)
    plain = _train(KerasUpdateAdam, gradients, amsgrad=True)
    for f, p in zip(fused, plain):
        np.testing.assert_array_equal(f, p)


def test_each_replica_updates_its_own_copies():
    """Two CPU replicas of a `MirroredStrategy`: the update reaches every
    copy of the weights and of the moments, as one device's does."""
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    assert len(devices) == 2, "the suite runs with two logical CPUs (conftest)"
    gradients = _gradients(5)
    alone = _train(ReplicaClippedAdam, gradients)
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        weights = _weights()
        optimizer = ReplicaClippedAdam(learning_rate=1e-2, global_clipnorm=1.0)
        optimizer.build(weights)

    @tf.function(autograph=False)
    def step(grads):
        # Each replica holds half of the gradient; the optimizer sums them.
        strategy.run(lambda: optimizer.apply([g / 2 for g in grads], weights))

    for grads in gradients:
        step(grads)
    for w, a in zip(weights, alone):
        for copy in strategy.experimental_local_results(w.value):
            np.testing.assert_allclose(copy.numpy(), a, rtol=0, atol=1e-6)
    for m in optimizer._momentums:
        first, second = strategy.experimental_local_results(m.value)
        np.testing.assert_array_equal(first.numpy(), second.numpy())
        assert np.abs(first.numpy()).max() > 0


def _embedding_rows_after(optimizer_class, sparse):
    """An embedding table after steps whose gradients are an embedding
    lookup's `tf.IndexedSlices` (rows repeated, rows left out), or the same
    gradients dense; no clip, so they reach the update as they are."""
    table = keras.Variable(np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32))
    optimizer = optimizer_class(learning_rate=1e-2)
    optimizer.build([table])
    for step in range(5):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table.value, [step, 3, 3]) ** 2)
        (gradient,) = tape.gradient(loss, [table.value])
        assert isinstance(gradient, tf.IndexedSlices)
        optimizer.apply([gradient if sparse else tf.convert_to_tensor(gradient)], [table])
    return table.numpy()


def test_a_sparse_gradient_moves_the_weights_as_its_dense_sum():
    """The op is dense Adam (as the paper's TF optimizer): every row's moments
    decay, repeated rows' gradients add up. Keras 3.15's own update of
    `tf.IndexedSlices` does not (it differs from its dense update by over
    1e-2 here), so here the fused update and Keras's part."""
    dense = _embedding_rows_after(keras.optimizers.Adam, sparse=False)
    fused = _embedding_rows_after(ReplicaClippedAdam, sparse=True)
    np.testing.assert_allclose(fused, dense, rtol=0, atol=1e-6)
