"""Adam whose global-norm clip sees the gradient summed over replicas.

Keras 3 clips each replica's *local* gradient and all-reduces afterwards, so
with N replicas the clip acts on N partial gradients instead of the full one,
and training differs from the same global batch on one device. The paper
clips the summed gradient; `ReplicaClippedAdam` does (the reordering lives in
`txl_tf.keras_support.keras_compat.ClipAfterReplicaSum`). With one replica it is plain
`Adam(global_clipnorm=...)`.
"""
import keras

from txl_tf.keras_support.keras_compat import ClipAfterReplicaSum


@keras.saving.register_keras_serializable(package="txl_tf")
class ReplicaClippedAdam(ClipAfterReplicaSum, keras.optimizers.Adam):
    """`keras.optimizers.Adam` with `global_clipnorm` applied after the
    cross-replica gradient sum (see the module docstring)."""
