"""Adam whose global-norm clip sees the gradient summed over replicas.

Keras 3 clips each replica's *local* gradient and all-reduces afterwards, so
with N replicas the clip acts on N partial gradients instead of the full one,
and training differs from the same global batch on one device. The paper
clips the summed gradient; `ReplicaClippedAdam` does (the reordering lives in
`txl_tf.keras_support.keras_compat.ClipAfterReplicaSum`). With one replica it is plain
`Adam(global_clipnorm=...)`. Under float16 loss scaling its bias correction
counts only the steps that were applied, not the skipped ones
(`txl_tf.keras_support.keras_compat.AppliedStepBiasCorrection`). Each variable's
update is TensorFlow's one Adam op, as the paper's TF code ran it
(`txl_tf.keras_support.keras_compat.FusedAdamUpdate`).
"""
import keras

from txl_tf.keras_support.keras_compat import (AppliedStepBiasCorrection, ClipAfterReplicaSum,
                                               FusedAdamUpdate)


@keras.saving.register_keras_serializable(package="txl_tf")
class ReplicaClippedAdam(ClipAfterReplicaSum, AppliedStepBiasCorrection, FusedAdamUpdate,
                         keras.optimizers.Adam):
    """`keras.optimizers.Adam` with `global_clipnorm` applied after the
    cross-replica gradient sum, whose bias correction skips the steps that
    float16 loss scaling skipped (see the module docstring), and whose
    update of each variable is one op (`FusedAdamUpdate`).

    Args:
        **kwargs: those of `keras.optimizers.Adam` (`learning_rate`,
            `beta_1`, `beta_2`, `epsilon`, `global_clipnorm`, ...).
    """
