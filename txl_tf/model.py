"""`TransformerXLLM`: the stateful Keras model for compile / fit / evaluate / predict."""
import keras
import tensorflow as tf

from txl_tf.checks.inputs import InputError
from txl_tf.core import TransformerXL, as_config
from txl_tf.keras_support.compile_mixin import AutoJitCompile
from txl_tf.keras_support.keras_compat import PrebuiltModel
from txl_tf.keras_support.precision import choose as choose_precision
from txl_tf.keras_support.stream_memory import StreamMemory, checked_batch_size, split_inputs
from txl_tf.keras_support.untracked import Untracked
from txl_tf.learning.metrics import TokenNLL


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLLM(AutoJitCompile, PrebuiltModel, keras.Model):
    """A Transformer-XL language model whose memory lives in variables.

    Each batch continues the streams of the previous one (see
    `txl_tf.data`), so the memory is carried from batch to batch like the state
    of a Keras stateful RNN; `reset_memory()` forgets it. `batch_size` is the
    fixed *per-replica* batch (use `drop_remainder=True`). Under
    `tf.distribute` the memory variables are per replica (sync on read), so
    each replica keeps the memory of its own streams.

    `fit` / `evaluate` take `(token_ids, labels)` or `(token_ids, labels,
    weights)` batches (`txl_tf.data.eval_segment_dataset` gives the latter);
    `token_ids` may be a dict `{"token_ids", "document_start"}`, where
    `document_start` (bool `[B]`) clears a row's memory before the segment,
    the other rows keeping theirs: separate documents streamed one after
    another per row (`txl_tf.data.document_dataset` gives such batches);
    the reported loss is the token-weighted mean NLL and the metrics report it
    as bits per token (`bpc`) and perplexity (`ppl`); the gradient is that of
    the weighted NLL summed over all positions / their number (Keras's
    weighting of losses). `predict` / `model(token_ids)`
    return log-probs. Training, `predict` and calls carry `mems` /
    `mem_mask`; `evaluate` (also `fit`'s validation) carries a memory of its
    own that starts empty at every call, so it never disturbs training.

    Precision: like any Keras model it takes the global dtype policy, or
    `dtype=`; `dtype="auto"` picks the fastest for the hardware present
    (`txl_tf.keras_support.precision.choose()`: `mixed_bfloat16` on CPUs with AVX512-BF16 or
    AMX, Ampere and newer GPUs and TPUs; float32 elsewhere).
    """

    def __init__(self, config, batch_size, mem_len=None, zero_filled=None, **kwargs):
        if kwargs.get("dtype") == "auto":  # the fastest policy on this hardware
            kwargs["dtype"] = choose_precision(tf.distribute.get_strategy()).policy
        super().__init__(**kwargs)
        self.core = TransformerXL(as_config(config), dtype=self.dtype_policy, name="transformer")
        self.batch_size = int(batch_size)
        self.mem_len = self.config.mem_len if mem_len is None else int(mem_len)
        self.zero_filled = (self.config.zero_filled_memory if zero_filled is None
                            else bool(zero_filled))
        self._stream = StreamMemory(self.config, self.batch_size, self.mem_len, self.zero_filled)
        self.mems, self.mem_mask = self._stream.mems, self._stream.mem_mask  # tracked: saved
        self._eval_memory = Untracked(StreamMemory(self.config, self.batch_size, self.mem_len,
                                                   self.zero_filled, prefix="eval_"))
        self.loss_tracker = TokenNLL("nll", name="loss")
        self.bpc_tracker = TokenNLL("bpc", name="bpc")
        self.ppl_tracker = TokenNLL("ppl", name="ppl")
        self.built = True

    @property
    def config(self):
        return self.core.config

    # ----------------------------------------------------------------- memory
    @property
    def memory(self):
        """The current training `Memory` (this replica's, inside a replica context)."""
        return self._stream.read()

    def reset_memory(self):
        """Forgets all history (like `reset_state()` of stateful RNNs)."""
        self._stream.clear()

    def reset_state(self):
        """`reset_memory()` under the name of Keras's stateful layers."""
        self.reset_memory()

    # ------------------------------------------------------------------ steps
    @property
    def metrics(self):
        return [self.loss_tracker, self.bpc_tracker, self.ppl_tracker]

    def _track(self, nll, weights):
        for metric in self.metrics:
            metric.update_state(nll, sample_weight=weights)
        return {m.name: m.result() for m in self.metrics}

    @staticmethod
    def _unpack(data):
        """`(token_ids, labels, weights [B, T] float32 or None)`; token_ids as
        given (a tensor or the dict of `_inputs`)."""
        token_ids, labels, weights = keras.utils.unpack_x_y_sample_weight(data)
        if weights is not None:
            weights = tf.cast(weights, tf.float32)
            if weights.shape.rank == 1:  # one weight per stream
                weights = weights[:, None]
            weights = tf.broadcast_to(weights, tf.shape(labels))
        return token_ids, labels, weights

    def call(self, token_ids, training=False):
        token_ids, extra = split_inputs(token_ids)
        log_probs, memory = self.core(token_ids, self._stream.read(extra["document_start"]),
                                      training=training)
        self._stream.write(memory)
        return log_probs

    def _step_logs(self, logs):
        """Keras reduces step outputs across workers along axis 0, which fails
        for scalars (tensorflow/tensorflow#72388); the metrics are already
        synchronised, so give them shape [1] when there are several workers."""
        strategy = tf.distribute.get_strategy()
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            spec = strategy.cluster_resolver.cluster_spec()
            if sum(spec.num_tasks(job) for job in spec.jobs) > 1:
                return {k: tf.reshape(v, [1]) for k, v in logs.items()}
        return logs

    @staticmethod
    def _replica_loss(nll, weights):
        """This replica's share of the loss the gradients are summed from: the
        mean NLL over all replicas' positions, weighted as Keras weights
        losses ("sum_over_batch_size": zero-weight positions count in the
        denominator, so no extra cross-replica sum is needed)."""
        if weights is not None:
            nll = nll * weights
        return tf.reduce_mean(nll) / tf.distribute.get_strategy().num_replicas_in_sync

    def train_step(self, data):
        token_ids, labels, weights = self._unpack(data)
        token_ids, extra = split_inputs(token_ids)
        memory = self._stream.read(extra["document_start"])
        with tf.GradientTape() as tape:
            nll, memory = self.core(token_ids, memory, targets=labels, training=True)
            scaled = self.optimizer.scale_loss(self._replica_loss(nll, weights))
        grads = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self._stream.write(memory)
        return self._step_logs(self._track(nll, weights))

    def test_step(self, data):
        token_ids, labels, weights = self._unpack(data)
        token_ids, extra = split_inputs(token_ids)
        memory = self._eval_memory.value.read(extra["document_start"])
        nll, memory = self.core(token_ids, memory, targets=labels, training=False)
        self._eval_memory.value.write(memory)
        return self._step_logs(self._track(nll, weights))

    def fit(self, x=None, *args, batch_size=None, shuffle=False, **kwargs):
        """`keras.Model.fit`; batches must have the memory's batch size, and
        arrays are not shuffled (Keras's default would give a row of the
        memory another stream's text; shuffle=True is an error)."""
        batch_size = self._checked_batches(x, batch_size, "fit")
        if shuffle and not isinstance(x, tf.data.Dataset):
            raise InputError("fit: shuffle=True would move rows between batches, so each row "
                             "of the memory would continue another stream; a Transformer-XL "
                             "reads its streams in order (shuffle=False)")
        return super().fit(x, *args, batch_size=batch_size, shuffle=shuffle, **kwargs)

    def evaluate(self, x=None, *args, batch_size=None, **kwargs):
        """`keras.Model.evaluate` from a fresh evaluation memory (Keras's `fit`
        validates through this method too)."""
        batch_size = self._checked_batches(x, batch_size, "evaluate")
        self._eval_memory.value.clear()
        return super().evaluate(x, *args, batch_size=batch_size, **kwargs)

    def predict(self, x, *args, batch_size=None, **kwargs):
        """`keras.Model.predict`; batches must have the memory's batch size."""
        batch_size = self._checked_batches(x, batch_size, "predict")
        return super().predict(x, *args, batch_size=batch_size, **kwargs)

    def _checked_batches(self, x, batch_size, method):
        """The `batch_size` to hand Keras, after checking that every batch of
        `x` (a tf.data.Dataset or arrays) has the memory's global batch size:
        a batch of another size would be a shape error deep in a graph."""
        replicas = self.distribute_strategy.num_replicas_in_sync
        expected = self.batch_size * replicas
        fix = (f"this model holds memory for batches of {expected} streams (batch_size="
               f"{self.batch_size} per replica x {replicas}); batch the data in "
               f"{expected}s with drop_remainder=True, or build the model with the batch "
               "size of the data (a new memory)")
        return checked_batch_size(x, batch_size, expected, method, fix)

    def predict_step(self, data):
        token_ids = data[0] if isinstance(data, (tuple, list)) else data
        return self(token_ids, training=False)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size, "mem_len": self.mem_len,
                "zero_filled": self.zero_filled}
