"""Training checkpoints: weights, optimizer state, step and each replica's memory.

`tf.train.CheckpointManager` over a `tf.train.Checkpoint` holding

* `weights`: every weight of the core keyed by its TF name (Keras 3 keeps
  sub-layers in lists that `tf.train.Checkpoint` does not follow, so the
  model object alone would save little more than the r-biases);
* `optimizer`: Adam's slots and `iterations` (the global step);
* `state`: the model's other variables (dropout seed states), in order;
* `metrics`: the sums of the running training metrics (`loss`, `bpc`, `ppl`
  since the last multiple of `--checkpoint_every`; see
  `training.callbacks.MetricWindow`), `[local_replicas, variables]` like the
  memory, so the lines logged after a resume between two checkpoints equal an
  uninterrupted run's (checkpoints written before them restore without);
* `mems` / `mem_mask`: one copy of the recurrence memory per
  local replica, `[local_replicas, ...]`. The model keeps its memory in
  sync-on-read variables whose checkpoint value would be replica 0's only;
  the snapshot is gathered before each save and scattered back after a
  restore, so every replica resumes with the memory of its own streams.

Each worker writes its own directory (`checkpoints/` for the chief,
`checkpoints/worker-<k>/` for the others): weights are equal on all workers,
memories are not.

`restore_latest` tries the kept checkpoints newest first: a damaged one (a
truncated file) is reported and the previous one restored. TF writes a
checkpoint under a temporary name first; `remove_stale_temporaries` clears
what a killed job left of those.
"""
import os
import shutil

import numpy as np
import tensorflow as tf

from training.errors import TrainingError
from training.strategy import local_replicas
from txl_tf.keras_support.keras_compat import CountingLossScaleOptimizer
from txl_tf.weights.checkpoints import weight_dict
from txl_tf.weights.model_dir import CHECKPOINT_DIR

# What reading a truncated or missing checkpoint file raises (the checkpoint
# reader turns a short read into IndexError "Read less bytes than requested");
# anything else (a checkpoint of another model, out of memory) is not a reason
# to fall back to an older checkpoint.
DAMAGED = (tf.errors.DataLossError, tf.errors.OutOfRangeError, tf.errors.NotFoundError,
           IndexError)


def checkpoint_dir(model_dir, task_id=0, is_chief=True):
    """Where this worker keeps its checkpoints."""
    root = os.path.join(model_dir, CHECKPOINT_DIR)
    return root if is_chief else os.path.join(root, f"worker-{task_id}")


def has_checkpoints(directory):
    """Whether `directory` has a checkpoint state file (a run to resume)."""
    return os.path.exists(os.path.join(directory, "checkpoint"))


def remove_stale_temporaries(directory):
    """Deletes `*_temp*` files / folders and `checkpoint.tmp*` files that an
    interrupted save left in `directory` (call only while owning it); returns
    their names."""
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if "_temp" not in name and not name.startswith("checkpoint.tmp"):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
        removed.append(name)
    return removed


def _unwrap(variable):
    return getattr(variable, "value", variable)


class TrainingCheckpoint:
    """Saves and restores a `TransformerXLLM` training run (see module doc)."""

    def __init__(self, model, optimizer, directory, strategy, max_to_keep=3):
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.directory = directory
        replicas = local_replicas(strategy)
        with tf.device("/cpu:0"):
            self.mems = tf.Variable(
                tf.zeros((replicas,) + tuple(model.mems.shape), tf.float32),
                trainable=False, name="mems_per_replica")
            self.mem_mask = tf.Variable(
                tf.zeros((replicas,) + tuple(model.mem_mask.shape), tf.float32),
                trainable=False, name="mem_mask_per_replica")
        memory_ids = {id(model.mems), id(model.mem_mask)}
        state = [v for v in model.non_trainable_variables if id(v) not in memory_ids]
        parts = dict(weights=weight_dict(model.core), optimizer=optimizer, state=state,
                     mems=self.mems, mem_mask=self.mem_mask)
        with tf.device("/cpu:0"):
            self.metrics = tf.Variable(metric_values(model), trainable=False,
                                       name="metrics_per_replica")
        self._parts = parts
        self.checkpoint = tf.train.Checkpoint(**parts, metrics=self.metrics)
        self._without_metrics = tf.train.Checkpoint(**parts)  # reads older checkpoints
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                                  max_to_keep=max_to_keep)

    @property
    def step(self):
        return int(self.optimizer.iterations.numpy())

    def _local(self, variable):
        return self.strategy.experimental_local_results(_unwrap(variable))

    def save(self):
        """Writes `ckpt-<step>`; returns its path. A write that fails (a full
        disk) removes what it left and raises `TrainingError` naming the folder."""
        self.mems.assign(tf.stack([tf.convert_to_tensor(v)
                                            for v in self._local(self.model.mems)]))
        self.mem_mask.assign(tf.stack([tf.convert_to_tensor(v)
                                           for v in self._local(self.model.mem_mask)]))
        self.metrics.assign(metric_values(self.model))
        try:
            return self.manager.save(checkpoint_number=self.step)
        except (OSError, tf.errors.OpError) as err:
            remove_stale_temporaries(self.directory)
            raise TrainingError(f"cannot write checkpoint ckpt-{self.step} in "
                                f"{self.directory}: {_first_line(err)}") from None

    def restore_latest(self, warn=print):
        """Restores the newest checkpoint that can be read, if any, and returns
        its path (None without checkpoints). A damaged one is reported with
        `warn(message)` and the previous one tried; `TrainingError` if none
        restores."""
        candidates = list(reversed(self.manager.checkpoints))
        if not candidates and self.manager.latest_checkpoint:
            candidates = [self.manager.latest_checkpoint]
        failures = []
        for path in candidates:
            try:
                self._restore(path)
                return path
            except DAMAGED as err:
                reason = _first_line(err)
                failures.append(f"{os.path.basename(path)}: {reason}")
                warn(f"checkpoint {path} cannot be restored ({reason}); trying the "
                     "previous one" if path != candidates[-1] else
                     f"checkpoint {path} cannot be restored ({reason})")
        if candidates:
            raise TrainingError(
                f"no checkpoint in {self.directory} can be restored ({'; '.join(failures)}); "
                "move the folder away to start again, or use a new --model_dir")
        return None

    def _restore(self, path):
        reader = tf.train.load_checkpoint(path)
        names = reader.get_variable_to_shape_map()
        uncounted = isinstance(self.optimizer, CountingLossScaleOptimizer) and \
            any("dynamic_scale" in name for name in names) and \
            not any("skipped_steps" in name for name in names)
        if uncounted:
            self._check_no_step_skipped(path, reader)
        fused = "weights/transformer..layer_0..rel_attn..qkv..kernel/.ATTRIBUTES/VARIABLE_VALUE"
        if fused in names:
            raise TrainingError(
                f"checkpoint {path} was written before the attention's projections became "
                "query/key/value layers: its optimizer state cannot resume this run; its "
                "weights load (load_pretrained, TransformerXLCausalLM.from_preset), so start a "
                "new --model_dir from them")
        with_metrics = any(name.startswith("metrics/") for name in names)
        checkpoint = self.checkpoint if with_metrics else self._without_metrics
        status = checkpoint.restore(path)
        if uncounted:
            # 0.3.0's optimizer had no `skipped_steps` (no step skipped: 0);
            # what else the run holds must all be in the file.
            status.expect_partial()
            rest = {k: v for k, v in self._parts.items() if k != "optimizer"}
            tf.train.Checkpoint(**rest, **({"metrics": self.metrics} if with_metrics else {})
                                ).restore(path).expect_partial().assert_existing_objects_matched()
            self.optimizer.skipped_steps.assign(0)
        else:
            status.assert_existing_objects_matched()
        if with_metrics:
            set_metric_values(self.model, self.metrics.numpy())
        for target, value in zip(self._local(self.model.mems), self.mems):
            target.assign(value)
        for target, value in zip(self._local(self.model.mem_mask), self.mem_mask):
            target.assign(value)

    def _check_no_step_skipped(self, path, reader):
        """`TrainingError` unless the float16 checkpoint `path` of txl_tf 0.3.0
        (which did not count the steps loss scaling skipped) shows no skipped
        step in its loss scale."""
        keys = [f"optimizer/{name}/.ATTRIBUTES/VARIABLE_VALUE"
                for name in ("inner_optimizer/_iterations", "step_counter", "dynamic_scale")]
        if not all(reader.has_tensor(key) for key in keys) or \
                self.optimizer.skipped_before_0_3_0_counted(*map(reader.get_tensor, keys)):
            raise TrainingError(
                f"checkpoint {path} was written by txl_tf 0.3.0, which did not count the "
                "steps float16 loss scaling skipped, and its loss scale shows skipped steps: "
                "Adam's bias correction cannot resume from it; resume it with txl_tf 0.3.0, or "
                "start a new --model_dir from its weights (load_pretrained)")


def metric_values(model):
    """`[local replicas, variables]` float32: each replica's own value of every
    variable of `model.metrics` (a replica's share of a sum, as it holds it)."""
    strategy = model.distribute_strategy
    columns = [[np.float32(part.numpy()) for part in
                strategy.experimental_local_results(_unwrap(variable))]
               for metric in model.metrics for variable in metric.variables]
    return np.array(columns, np.float32).T if columns else np.zeros([1, 0], np.float32)


def set_metric_values(model, values):
    """Gives each replica its row of `values` (from `metric_values`)."""
    variables = [v for metric in model.metrics for v in metric.variables]
    for column, variable in enumerate(variables):
        parts = model.distribute_strategy.experimental_local_results(_unwrap(variable))
        for row, part in enumerate(parts):
            part.assign(values[row, column])


def _first_line(err):
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
