"""`TransformerXLLM`: the stateful Keras model for compile / fit / evaluate / predict."""
import keras
import tensorflow as tf

from txl_tf.core import TransformerXL, as_config
from txl_tf.layers.memory import Memory
from txl_tf.metrics import TokenNLL


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLLM(keras.Model):
    """A Transformer-XL language model whose memory lives in variables.

    Each batch continues the streams of the previous one (see
    `txl_tf.data`), so the memory is carried from batch to batch like the state
    of a Keras stateful RNN; `reset_memory()` forgets it. `batch_size` is the
    fixed *per-replica* batch (use `drop_remainder=True`). Under
    `tf.distribute` the memory variables are per replica (sync on read), so
    each replica keeps the memory of its own streams.

    `fit` / `evaluate` take `(token_ids, labels)` batches; the loss is the mean
    token NLL and the metrics report it as bits per token (`bpc`) and
    perplexity (`ppl`). `predict` / `model(token_ids)` return log-probs.
    """

    def __init__(self, config, batch_size, mem_len=None, zero_filled=None, **kwargs):
        super().__init__(**kwargs)
        self.core = TransformerXL(as_config(config), dtype=self.dtype_policy, name="transformer")
        cfg = self.core.config
        self.batch_size = int(batch_size)
        self.mem_len = cfg.mem_len if mem_len is None else int(mem_len)
        self.zero_filled = cfg.zero_filled_memory if zero_filled is None else bool(zero_filled)
        self.mems = keras.Variable(
            initializer="zeros", shape=(cfg.n_layer, self.batch_size, self.mem_len, cfg.d_model),
            dtype="float32", trainable=False, autocast=False, name="mems",
            synchronization="on_read", aggregation="only_first_replica")
        self.mem_mask = keras.Variable(
            initializer="ones" if self.zero_filled else "zeros",
            shape=(self.batch_size, self.mem_len), dtype="float32", trainable=False,
            autocast=False, name="mem_mask", synchronization="on_read",
            aggregation="only_first_replica")
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
        """The current `Memory` (this replica's, inside a replica context)."""
        return Memory(tf.convert_to_tensor(self.mems),
                      tf.convert_to_tensor(self.mem_mask) > 0.5)

    def _store(self, memory):
        self.mems.assign(memory.mems)
        self.mem_mask.assign(tf.cast(memory.mem_mask, tf.float32))

    def reset_memory(self):
        """Forgets all history (like `reset_state()` of stateful RNNs)."""
        self.mems.assign(tf.zeros(self.mems.shape))
        fill = tf.ones if self.zero_filled else tf.zeros
        self.mem_mask.assign(fill(self.mem_mask.shape))

    # ------------------------------------------------------------------ steps
    @property
    def metrics(self):
        return [self.loss_tracker, self.bpc_tracker, self.ppl_tracker]

    def _track(self, nll):
        for metric in self.metrics:
            metric.update_state(nll)
        return {m.name: m.result() for m in self.metrics}

    def call(self, token_ids, training=False):
        log_probs, memory = self.core(token_ids, self.memory, training=training)
        self._store(memory)
        return log_probs

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras 3.15 pulls and MEAN-reduces a first batch under any strategy to
        build the model symbolically, even a built one; that reduce fails
        under MultiWorkerMirroredStrategy. The model is built at construction,
        so only the optimizer needs building here."""
        if self.optimizer is not None and not self.optimizer.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)

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

    def train_step(self, data):
        token_ids, labels = data[0], data[1]
        with tf.GradientTape() as tape:
            nll, memory = self.core(token_ids, self.memory, targets=labels, training=True)
            loss = tf.reduce_mean(nll)
            # Gradients are summed over replicas; scale so they average.
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            scaled = self.optimizer.scale_loss(loss / replicas)
        grads = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self._store(memory)
        return self._step_logs(self._track(nll))

    def test_step(self, data):
        token_ids, labels = data[0], data[1]
        nll, memory = self.core(token_ids, self.memory, targets=labels, training=False)
        self._store(memory)
        return self._step_logs(self._track(nll))

    def predict_step(self, data):
        token_ids = data[0] if isinstance(data, (tuple, list)) else data
        return self(token_ids, training=False)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "batch_size": self.batch_size, "mem_len": self.mem_len,
                "zero_filled": self.zero_filled}
