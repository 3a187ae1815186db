"""Adam whose global-norm clip sees the gradient summed over replicas.

Keras 3 (3.15, TensorFlow backend) clips each replica's *local* gradient in
`_clip_gradients` and all-reduces afterwards, so with N replicas the clip acts
on N partial gradients instead of the full one, and training differs from the
same global batch on one device. The paper clips the averaged gradient. This
subclass all-reduces first, then clips, then applies (and skips Keras's second
all-reduce). With one replica it is plain `Adam(global_clipnorm=...)`.
"""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="txl_tf")
class ReplicaClippedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` with `global_clipnorm` applied after the
    cross-replica gradient sum (see the module docstring)."""

    def _clip_gradients(self, grads):
        context = tf.distribute.get_replica_context()
        if context is not None and tf.distribute.has_strategy():
            present = [i for i, g in enumerate(grads) if g is not None]
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                         [grads[i] for i in present])
            grads = list(grads)
            for i, g in zip(present, reduced):
                grads[i] = g
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if tf.distribute.has_strategy():
            return list(grads_and_vars)  # already summed in _clip_gradients
        return super()._all_reduce_sum_gradients(grads_and_vars)
