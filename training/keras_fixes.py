"""Work-arounds for Keras 3.15 `fit` under tf.distribute (TensorFlow backend).

Both patch one model instance; nothing global changes.
"""
import tensorflow as tf


def skip_symbolic_build(model):
    """Stops `fit` from peeking at the first batch under a strategy.

    `TensorFlowTrainer._maybe_symbolic_build` pulls the first batch of every
    `fit` under a tf.distribute strategy and MEAN-reduces it across replicas
    to build the model symbolically, even when the model is built: the reduce
    fails under MultiWorkerMirroredStrategy (a PerReplica of one local
    replica) and reads one batch more than is trained on. `TransformerXLLM`
    is built at construction, so the symbolic build is never needed.
    """
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def fix_multi_worker_logs(model, strategy):
    """Makes `fit` work under MultiWorkerMirroredStrategy with several workers.

    Keras reduces the train step's outputs across workers with
    `strategy.reduce("MEAN", v, axis=0)`, which fails for scalar metrics
    ("Invalid reduction dimension 0 for input with 0 dimensions",
    tensorflow/tensorflow#72388). The metrics are already synchronised
    (sum-aggregated variables), so each value is returned with shape [1];
    the reduce then yields the scalar.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    if not strategy.extended._in_multi_worker_mode():
        return
    train_step = model.train_step

    def step(data):
        return {k: tf.reshape(v, [1]) for k, v in train_step(data).items()}
    model.train_step = step
