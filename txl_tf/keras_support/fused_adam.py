"""Adam's update of one variable as one TensorFlow op.

Keras 3.15 `Adam.update_step` (keras/src/optimizers/adam.py) builds its
update from about twenty small ops per variable: the bias correction, both
moments and the step, each a graph op to trace, and without XLA each its own
kernel over the variable. A Transformer-XL has over a hundred variables, so
a training step's first trace spends much of its time in the optimizer.
`tf.raw_ops.ResourceApplyAdam` is the same update in one op (the op the
paper's TF code ran through `tf.train.AdamOptimizer`, with an XLA lowering
and CPU and GPU kernels).

Its rounding differs from Keras's by float32 ulps: the kernel computes
`1 - beta_1` in float32 where Keras subtracts in Python's float64.
"""
import tensorflow as tf


class FusedAdamUpdate:
    """Mixin for `keras.optimizers.Adam`: each variable's update is one
    `ResourceApplyAdam` op (AMSGrad keeps Keras's update)."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        # Under a strategy's update the slots' handles are this device's copies.
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype), beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype))
        return None
