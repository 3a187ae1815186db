"""Every use of a private Keras internal, in one place.

Written for Keras 3.15 on the TensorFlow backend. Importing this module
raises on another major version and warns on another minor one, and raises
if a hooked private name is gone (an override of a missing method would
silently do nothing). Each workaround names the Keras source it depends on
and the upstream report, so it can be dropped once Keras offers a public way.
"""
import contextlib
import warnings

import keras
import tensorflow as tf
from keras.src.utils import tracking

from txl_tf.keras_support.placement import on_device, strategy_device

TESTED_VERSION = (3, 15)


def check_keras_version(version=keras.__version__):
    """Raises on a Keras major version other than 3, warns on an untested minor."""
    major, minor = (int(part) for part in version.split(".")[:2])
    if major != TESTED_VERSION[0]:
        raise ImportError(f"txl_tf needs Keras {TESTED_VERSION[0]}.x, found {version}")
    if minor != TESTED_VERSION[1]:
        warnings.warn(f"txl_tf.keras_support.keras_compat was written for Keras "
                      f"{TESTED_VERSION[0]}.{TESTED_VERSION[1]}, found {version}: its "
                      "workarounds of private Keras internals are untested there",
                      stacklevel=2)


def _require(owner, name):
    if not hasattr(owner, name):
        raise ImportError(f"Keras {keras.__version__} has no {owner.__name__}.{name}; "
                          "txl_tf.keras_support.keras_compat must be updated for this version")


check_keras_version()
_require(keras.Model, "_maybe_symbolic_build")
for _name in ("make_train_function", "make_test_function", "make_predict_function"):
    _require(keras.Model, _name)
_require(keras.optimizers.Optimizer, "_clip_gradients")
_require(keras.optimizers.Optimizer, "_all_reduce_sum_gradients")
_require(keras.optimizers.Optimizer, "_get_variable_index")
_require(keras.optimizers.LossScaleOptimizer, "_stateful_handle_non_finite_grads")
_require(keras.optimizers.LossScaleOptimizer, "_stateful_handle_finite_grads")


def build_optimizer(model):
    """Builds `model`'s optimizer (its slots) in the model's strategy scope,
    once: before its train function is made, so never for `evaluate`."""
    if model.optimizer is not None and not model.optimizer.built:
        with model.distribute_strategy.scope():
            model.optimizer.build(model.trainable_variables)


class OptimizerBuiltForTraining:
    """Mixin for a `keras.Model`: its optimizer is built where a train
    function is made (`fit`, `train_on_batch`; `build_optimizer`), never by
    `evaluate`, which reads no slot."""

    def make_train_function(self, force=False):
        build_optimizer(self)
        return super().make_train_function(force)


class PrebuiltModel(OptimizerBuiltForTraining):
    """Mixin for a `keras.Model` whose layers are all built at construction.

    Keras 3.15 `fit` / `evaluate` call `_maybe_symbolic_build`
    (keras/src/backend/tensorflow/trainer.py, `TensorFlowTrainer`), which,
    under any distribution strategy and even for a built model, pulls a first
    batch and MEAN-reduces it across replicas before building symbolically;
    that reduce fails under `MultiWorkerMirroredStrategy`. Here nothing is
    built there, and the optimizer is built where a train function is made
    (`fit`, `train_on_batch`), not by `evaluate`, which never reads its
    slots (Adam's: twice the weights, 6.7 GB at `lm1b_large`). No public
    switch skips it (no upstream report found).
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        del iterator, data_batch  # see the class doc


class StepsOnStrategyDevice:
    """Mixin for a `keras.Model`: its step functions run on the device of a
    `tf.distribute.OneDeviceStrategy` it was made under.

    Keras 3.15 compiles the whole step with `jit_compile=True`, the strategy's
    `run` inside it (`TensorFlowTrainer._make_function`,
    keras/src/backend/tensorflow/trainer.py), and an XLA function runs on the
    device it is called from, the default one: under
    `OneDeviceStrategy("/cpu:0")` on a machine with a GPU (or `"/gpu:1"`) the
    step ran on the GPU (`GPU:0`) and read the variables the strategy had put
    elsewhere ("Trying to access resource ... located in device"). Here
    `fit`, `evaluate`, `predict` and the `*_on_batch` calls enter the
    strategy's device around each step function. No upstream report found.
    """

    def make_train_function(self, force=False):
        result = super().make_train_function(force)
        self.train_function = self._on_strategy_device(self.train_function)
        return result

    def make_test_function(self, force=False):
        result = super().make_test_function(force)
        self.test_function = self._on_strategy_device(self.test_function)
        return result

    def make_predict_function(self, force=False):
        result = super().make_predict_function(force)
        self.predict_function = self._on_strategy_device(self.predict_function)
        return result

    def _on_strategy_device(self, function):
        return on_device(function, strategy_device(self.distribute_strategy))


class ClipAfterReplicaSum:
    """Mixin for a Keras optimizer: clip the gradient summed over replicas.

    Keras 3.15 `BaseOptimizer.apply` calls `_clip_gradients`
    (keras/src/optimizers/base_optimizer.py) in replica context, before the
    TF backend sums gradients across replicas in `_all_reduce_sum_gradients`
    (keras/src/backend/tensorflow/optimizer.py), so `global_clipnorm` acts on
    each replica's share (the long-known ordering problem of
    tensorflow/tensorflow#33929; Keras offers no hook between the sum and the
    update). This mixin sums first, clips, then skips the second sum. With no
    strategy there is one replica and nothing to sum: it skips Keras's sum
    too, whose all-reduce under the default strategy registers a gradient
    function in TensorFlow's global registry at each trace, which keeps that
    train step's graph alive for the process's life (tensorflow/tensorflow
    #97697: a model made and fitted in a loop grew the process's memory).
    """

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
        # Summed in _clip_gradients under a strategy; one replica's otherwise.
        return list(grads_and_vars)


class AppliedStepBiasCorrection:
    """Mixin for `keras.optimizers.Adam`: under `CountingLossScaleOptimizer`
    its bias correction counts only the steps that updated the weights.

    Keras 3.15 `Adam.update_step` (keras/src/optimizers/adam.py) corrects
    the moments with t = `self.iterations + 1`. `CountingLossScaleOptimizer`
    also counts skipped steps in `iterations` (the job's global step), so
    after k skipped steps the first update would be corrected as the
    (k + 1)-th, with moments that have seen one gradient: a smaller step
    than a fresh Adam's first. While the loss-scale optimizer applies an
    update, `iterations` reads the steps applied before it; the learning
    rate schedule reads the global step (`_iterations`) as before, as the
    paper's PyTorch loop steps its schedule on every batch.
    """

    _skipped_steps = None  # a tensor, only while CountingLossScaleOptimizer applies

    @property
    def iterations(self):
        steps = super().iterations
        return steps if self._skipped_steps is None else steps - self._skipped_steps

    @contextlib.contextmanager
    def skipping(self, skipped_steps):
        """Within: `iterations` reads `iterations - skipped_steps` (a tensor)."""
        self._skipped_steps = skipped_steps
        try:
            yield
        finally:
            self._skipped_steps = None


class FusedAdamUpdate:
    """Mixin for `keras.optimizers.Adam`: each variable's update is one op.

    Keras 3.15 `Adam.update_step` (keras/src/optimizers/adam.py) builds the
    update from about twenty small ops per variable (the bias correction,
    both moments, the step): each a graph op to trace, and without XLA each
    a kernel over the variable. With over a hundred variables a training
    step's first trace spends much of its time there. Here it is
    `tf.raw_ops.ResourceApplyAdam`, the op the paper's TF code ran through
    `tf.train.AdamOptimizer` (XLA lowers it; CPU and GPU kernels), on the
    moments Keras made (`_momentums`, `_velocities`, by Keras's
    `_get_variable_index`). Its rounding differs from Keras's by float32
    ulps: the op computes `1 - beta_1` in the variable's dtype, Keras in
    Python's float64. AMSGrad keeps Keras's update (no upstream report: a
    fused update is not Keras's concern).
    """

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


@keras.saving.register_keras_serializable(package="txl_tf")
class CountingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """`keras.optimizers.LossScaleOptimizer` whose skipped steps still count.

    Keras 3.15 `LossScaleOptimizer` skips the update of a step whose scaled
    gradients are not finite, halving the scale in
    `_stateful_handle_non_finite_grads`
    (keras/src/optimizers/loss_scale_optimizer.py), and leaves the inner
    optimizer's `iterations` where it was. The training job's global step is
    `iterations`: its batch of step s, its learning rate, its checkpoints and
    its resume all count batches, so a skipped step would make a resumed job
    read batches again. Here a skipped step advances `iterations` too (its
    batch is spent; the weights and Adam's moments are left alone) and
    `skipped_steps`, so that an inner `AppliedStepBiasCorrection` optimizer
    (`ReplicaClippedAdam`) corrects its moments by the steps it applied
    (`_stateful_handle_finite_grads`). No public hook (no upstream report
    found).
    """

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list):
        super().build(var_list)
        self.skipped_steps = self.add_variable(shape=(), dtype="int", initializer="zeros",
                                               aggregation="none", name="skipped_steps")

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        inner = self.inner_optimizer
        if not isinstance(inner, AppliedStepBiasCorrection):
            return super()._stateful_handle_finite_grads(grads, trainable_variables)
        with inner.skipping(tf.convert_to_tensor(self.skipped_steps)):
            return super()._stateful_handle_finite_grads(grads, trainable_variables)

    def _stateful_handle_non_finite_grads(self):
        super()._stateful_handle_non_finite_grads()
        self.inner_optimizer.iterations.assign_add(1)
        self.skipped_steps.assign_add(1)

    def skipped_before_0_3_0_counted(self, steps, step_counter, dynamic_scale):
        """Whether the saved loss scale of txl_tf 0.3.0 (whose optimizer had no
        `skipped_steps`; a skipped step advanced `iterations`) shows a
        skipped step: `n` steps without one leave `initial_scale * 2**(n //
        dynamic_growth_steps)` and a counter of `n % dynamic_growth_steps`,
        each skip halves the scale and the growth needs that many finite steps
        in a row.

        Args:
            steps: the saved `iterations` of the inner optimizer.
            step_counter: the saved `step_counter`.
            dynamic_scale: the saved `dynamic_scale`.

        Returns:
            bool.
        """
        steps, growth = int(steps), int(self.dynamic_growth_steps)
        return (int(step_counter) != steps % growth or
                float(dynamic_scale) != float(self.initial_scale) * 2.0 ** (steps // growth))

    def load_own_variables(self, store):
        """Keras's `load_own_variables` (a `.keras` file, `load_weights`),
        which also reads the optimizer of txl_tf 0.3.0.

        Keras 3.15 `BaseOptimizer.load_own_variables`
        (keras/src/optimizers/base_optimizer.py) skips a store with another
        number of variables, with a warning only: a 0.3.0 file, saved before
        `skipped_steps` existed, would resume with a fresh Adam and loss
        scale. Its variables are those of this one without `skipped_steps`,
        in order, and are read so. Whether it skipped steps shows in its
        scale (`skipped_before_0_3_0_counted`). Without a skip
        `skipped_steps` is 0, exactly; after
        one, an inner `AppliedStepBiasCorrection` optimizer (whose update
        needs the count) refuses the file, any other ignores the count.

        Args:
            store: Keras's `{"0": value, ...}` of the saved variables.

        Raises:
            TxlError: a 0.3.0 store of a `ReplicaClippedAdam` that skipped
                steps it did not count.
        """
        others = [v for v in self.variables if v is not getattr(self, "skipped_steps", None)]
        if len(others) == len(self.variables) or len(store.keys()) != len(others) or any(
                tuple(v.shape) != tuple(store[str(i)].shape) for i, v in enumerate(others)):
            return super().load_own_variables(store)
        saved = {id(v): store[str(i)][...] for i, v in enumerate(others)}
        skipped = self.skipped_before_0_3_0_counted(saved[id(self.inner_optimizer.iterations)],
                                                    saved[id(self.step_counter)],
                                                    saved[id(self.dynamic_scale)])
        if skipped and isinstance(self.inner_optimizer, AppliedStepBiasCorrection):
            from txl_tf.errors import TxlError
            raise TxlError(
                f"this optimizer ({type(self.inner_optimizer).__name__} under float16 loss "
                "scaling) was saved by txl_tf 0.3.0, which did not count the steps loss "
                "scaling skipped, and it skipped some: its Adam state cannot resume here; "
                "load the file with compile=False (weights and memory) and compile again, "
                "or resume it with txl_tf 0.3.0")
        for v in others:
            v.assign(saved[id(v)])
        self.skipped_steps.assign(0)


def counting_loss_scale(optimizer):
    """`optimizer` with Keras's `LossScaleOptimizer` (which `compile` puts
    around it under "mixed_float16") replaced by a
    `CountingLossScaleOptimizer` of the same settings; any other optimizer
    as it is."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or \
            isinstance(optimizer, CountingLossScaleOptimizer):
        return optimizer
    return CountingLossScaleOptimizer(optimizer.inner_optimizer,
                                      initial_scale=optimizer.initial_scale,
                                      dynamic_growth_steps=optimizer.dynamic_growth_steps,
                                      name=optimizer.name)


def resolve_policy_maps(model):
    """Gives each of `model`'s layers its own entry of a dtype policy map
    (the policy `load_model` and `from_config` pass down after `quantize`).

    Keras 3.15 leaves the whole `DTypePolicyMap` on every layer and looks a
    layer's entry up in `Layer.quantization_mode` only; `Dense`'s
    `_get_kernel_with_merged_lora` reads `dtype_policy.quantization_mode`,
    the map's own (None), so `save_own_variables` stored a None kernel
    scale and a loaded quantized model could not be saved again ("Invalid
    dtype: object", keras/src/layers/core/dense.py). The map stays the
    model's own policy (its config). Layers without a path keep the map.
    """
    for layer in model._flatten_layers(include_self=False):
        policy = layer._dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
            layer._dtype_policy = policy[layer.path]


def start_tensorboard_batches_at(callback, step):
    """Makes a `keras.callbacks.TensorBoard` number its next batch `step + 1`.

    Keras 3.15 counts batch summaries in the private `_global_train_batch`,
    reset to 0 in `on_train_begin` (keras/src/callbacks/tensorboard.py), so a
    resumed job would draw over its first run's curves; there is no public
    initial step (tensorflow/tensorflow#45274). Call after `on_train_begin`.
    """
    if not hasattr(callback, "_global_train_batch"):
        raise AttributeError("keras.callbacks.TensorBoard no longer has "
                             "_global_train_batch; update txl_tf.keras_support.keras_compat")
    callback._global_train_batch = int(step)
