"""`fit` / `evaluate` / `predict` of `TransformerXLCausalLM` over stream
batches: each batch row continues a stream of text, its memory carried from
batch to batch (a `StreamMemory`) and cleared where its next document
starts. The loss is the NLL the core computes from the targets (the adaptive
softmax never forms the full log-probs), reported as `loss` (nats per
token), `bpc` and `ppl`."""
import contextlib
import math

import keras
import tensorflow as tf

from txl_tf.checks.inputs import (InputError, check_batch, check_numpy_data, checked_data,
                                  checked_float_targets, input_errors)
from txl_tf.checks.numpy_checks import check_count
from txl_tf.checks.python_batches import is_python_batches, map_python_batches
from txl_tf.errors import TxlError
from txl_tf.keras_support.keras_compat import OptimizerBuiltForTraining, PrebuiltModel
from txl_tf.keras_support.untracked import Untracked
from txl_tf.learning.metrics import TokenNLL
from txl_tf.models.transformer_xl.stream_memory import (StreamMemory, checked_batch_size,
                                                        split_inputs)

_STREAM_KEYS = ("document_start", "padding_mask")


class StreamTraining(OptimizerBuiltForTraining):
    """Mixin of `TransformerXLCausalLM`: stream batches (inputs with a
    `document_start`, see `document_dataset`) through `fit`, `evaluate`
    and `predict`; other batches go to keras-hub's methods."""

    # Whether the training memory is among the model's saved variables
    # (`TransformerXLLM`'s is; the causal LM sizes its own from the data).
    _memory_saved = False

    def _init_streams(self):
        # (training memory, evaluation memory, metrics), made by `_size_streams`.
        self._streams = Untracked(None)
        self._streaming = False

    # ------------------------------------------------------------ the memory
    @property
    def stream_batch_size(self):
        """Rows per replica of the stream memory (None before a stream `fit`)."""
        return None if self._streams.value is None else self._streams.value[0].batch_size

    def _size_streams(self, per_replica, zero_filled=None):
        """Makes an empty training and evaluation memory of `per_replica`
        rows (and the stream metrics), under the model's strategy."""
        config = self.core.config
        zero_filled = config.zero_filled_memory if zero_filled is None else zero_filled
        if not tf.config.list_physical_devices("GPU"):  # else the memories are the GPU's
            from txl_tf.checks.memory_budget import check_memory_state
            # Two memories (training, evaluation) per replica, in host memory.
            check_memory_state(config.n_layer, config.d_model,
                               per_replica * self.distribute_strategy.num_replicas_in_sync,
                               self.mem_len, "the training and evaluation memories")
        with self.distribute_strategy.scope():
            memories = [StreamMemory(config, per_replica, self.mem_len, zero_filled, prefix)
                        for prefix in ("", "eval_")]
            metrics = tuple(TokenNLL(kind, name=name)
                            for kind, name in (("nll", "loss"), ("bpc", "bpc"), ("ppl", "ppl")))
        self._streams = Untracked(*memories, metrics)
        self._drop_step_functions()

    def _drop_step_functions(self):
        self.train_function = self.test_function = self.predict_function = None

    def reset_memory(self):
        """Forgets the streams' history (training and evaluation memory)."""
        for memory in (self._streams.value or ())[:2]:
            memory.clear()

    def load_weights(self, filepath, *args, **kwargs):
        """Keras's `load_weights`; where the file does not hold the training
        memory (this model's is not saved), the memory is cleared: it was
        computed by other weights, and a restored run (`BackupAndRestore`)
        then starts as a new model would, not on the memory of the batches
        it is going back over.

        Args:
            filepath: the weights file.
            *args, **kwargs: those of `keras.Model.load_weights`.
        """
        result = super().load_weights(filepath, *args, **kwargs)
        if not self._memory_saved:
            self.reset_memory()
        return result

    def reset_state(self):
        """`reset_memory()` under the name of Keras's stateful layers."""
        self.reset_memory()

    def _call_memory(self, training):
        """The memory a stream call reads: training's, or evaluation's."""
        return self._streams.value[0 if training else 1]

    # ----------------------------------------------------------------- steps
    @property
    def metrics(self):
        if getattr(self, "_streaming", False):
            return list(self._streams.value[2])
        return super().metrics

    def _read_streams(self, inputs, memory_of, targets=None, training=False, store=True):
        """Reads one stream batch on `memory_of` (a `StreamMemory`) and
        stores the memory it leaves: log-probs, or the NLL of `targets`
        (`store=False`: `(that, the memory)`, not stored)."""
        if self._streams.value is None:
            raise TxlError("stream batches (with 'document_start') are read by fit, evaluate "
                           "and predict, which size the memory; call one of them")
        token_ids, extra = split_inputs(inputs, optional=_STREAM_KEYS)
        mask = extra["padding_mask"]
        out, memory = self.core(token_ids, memory_of.read(extra["document_start"]),
                                targets=targets, training=training,
                                token_mask=None if mask is None else tf.cast(mask, tf.bool))
        if not store:
            return out, memory
        memory_of.write(memory)
        return out

    def _track(self, nll, weights):
        for metric in self.metrics:
            metric.update_state(nll, sample_weight=weights)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return self._step_logs({m.name: m.result() for m in self.metrics})
        # A replica reads its own sums: its rows' mean, not the batch's (Keras
        # averages the replicas' results, and their token counts can differ).
        sums = context.all_reduce("SUM", [[tf.identity(m.total.value), tf.identity(m.count.value)]
                                          for m in self.metrics])
        return self._step_logs({m.name: m.result_of(total, count)
                                for m, (total, count) in zip(self.metrics, sums)})

    @staticmethod
    def _step_logs(logs):
        """Keras reduces step outputs across workers along axis 0, which fails
        for scalars (tensorflow/tensorflow#72388); the metrics are already
        synchronised, so give them shape [1] when there are several workers."""
        strategy = tf.distribute.get_strategy()
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            spec = strategy.cluster_resolver.cluster_spec()
            if sum(spec.num_tasks(job) for job in spec.jobs) > 1:
                return {k: tf.reshape(v, [1]) for k, v in logs.items()}
        return logs

    def _unpack(self, data):
        """`(inputs, labels, weights [B, T] float32 or None)` of a batch;
        float labels, whole numbers in the vocabulary (`checked_float_targets`),
        as the ids they stand for (keras-hub's loss casts them too)."""
        inputs, labels, weights = keras.utils.unpack_x_y_sample_weight(data)
        if labels is not None and labels.dtype.is_floating:
            labels = tf.cast(checked_float_targets(labels, self.core.config.n_token), tf.int32)
        if weights is not None:
            weights = tf.cast(weights, tf.float32)
            per_row, tokens = weights.shape[1:].num_elements(), labels.shape[-1]
            if weights.shape.rank and per_row not in (None, 1, tokens) and tokens is not None:
                raise InputError(f"sample_weight holds {per_row} weights a row but the targets "
                                 f"{tokens} tokens: give one weight a stream [B] or one a "
                                 "token [B, T]")
            # One weight per stream ([B]) or per token ([B, T]); a retraced
            # step can see them with an unknown rank.
            weights = tf.reshape(weights, [tf.shape(labels)[0], -1])
            weights = tf.broadcast_to(weights, tf.shape(labels))
        return inputs, labels, weights

    @staticmethod
    def _replica_loss(nll, weights):
        """This replica's share of the loss the gradients are summed from: the
        mean NLL over all replicas' positions, weighted as Keras weights
        losses ("sum_over_batch_size": zero-weight positions count in the
        denominator, so no extra cross-replica sum is needed)."""
        if weights is not None:
            nll = nll * weights
        return tf.reduce_mean(nll) / tf.distribute.get_strategy().num_replicas_in_sync

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Under a strategy Keras pulls a first batch and builds the compiled
        loss and metrics on its replicas' mean (float ids); stream steps use
        neither, and the pulled batch would be read twice from a stream
        (see `PrebuiltModel`): nothing is built (the optimizer is, with the
        train function, `make_train_function`)."""
        if not self._streaming:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        return PrebuiltModel._maybe_symbolic_build(self, iterator, data_batch)

    def train_step(self, data):
        if not self._streaming:
            return super().train_step(data)
        inputs, labels, weights = self._unpack(data)
        memory_of = self._streams.value[0]
        with tf.GradientTape() as tape:
            nll, memory = self._read_streams(inputs, memory_of, targets=labels, training=True,
                                             store=False)
            scaled = self.optimizer.scale_loss(self._replica_loss(nll, weights))
        grads = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        # Stored once the step is taken: a step stopped before (Ctrl-C or an
        # error while run eagerly) leaves the memory of the batch it would read.
        memory_of.write(memory)
        return self._track(nll, weights)

    def test_step(self, data):
        if not self._streaming:
            return super().test_step(data)
        inputs, labels, weights = self._unpack(data)
        nll = self._read_streams(inputs, self._streams.value[1], targets=labels)
        return self._track(nll, weights)

    def predict_step(self, data):
        if not self._streaming:
            return super().predict_step(data)
        inputs = data[0] if isinstance(data, (tuple, list)) else data
        return self._read_streams(inputs, self._call_memory(False))

    # ------------------------------------------------------- fit / evaluate
    def is_stream(self, x):
        """Whether `x` (a dataset or arrays) holds stream batches: inputs
        with a `document_start`."""
        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            x = spec[0] if isinstance(spec, tuple) else spec
        return isinstance(x, dict) and "document_start" in x

    def _stream_batch_size(self, x, batch_size, method):
        """The global rows of `x`'s batches (a new, empty memory when it
        changes); returns the `batch_size` to hand Keras."""
        if isinstance(x, tf.data.Dataset):
            first = tf.nest.flatten(x.element_spec)[0]
            size = first.shape[0] if first.shape.rank else None
            if size is None:
                raise InputError(f"{method}: stream batches need a fixed batch size (batch with "
                                 "drop_remainder=True)")
        else:
            size = batch_size or 32
        replicas = self.distribute_strategy.num_replicas_in_sync
        fix = (f"stream batches hold {size} rows, split over {replicas} replicas; batch the "
               f"data in {size}s with drop_remainder=True")
        if size % replicas:
            raise InputError(f"{method}: {fix}")
        batch_size = checked_batch_size(x, batch_size, size, method, fix)
        if self.stream_batch_size != size // replicas:
            self._size_streams(size // replicas)
        return batch_size

    def _global_rows(self):
        """The rows of a stream batch over all replicas (the memory's streams)."""
        return self.stream_batch_size * self.distribute_strategy.num_replicas_in_sync

    def _prepare_streams(self, x, batch_size, method, shuffle=False):
        if shuffle and not isinstance(x, tf.data.Dataset):
            raise InputError(f"{method}: shuffle=True would move rows between batches, so each "
                             "row of the memory would continue another stream; a "
                             "Transformer-XL reads its streams in order (shuffle=False)")
        batch_size = self._stream_batch_size(x, batch_size, method)
        self._set_streaming(True)
        return batch_size

    def preprocess_samples(self, x, y=None, sample_weight=None):
        """keras-hub's preprocessing (mapped over the data by its `fit`,
        `evaluate` and `predict`), then the ids checked (`check_batch`)."""
        data = super().preprocess_samples(x, y, sample_weight)
        return check_batch(data, self.core.config.n_token)

    def _preprocessed(self, data):
        """`data` (batches that are not stream batches) preprocessed and
        checked (`preprocess_samples`) for `keras.Model`'s methods, beside
        training data of a generator or a `PyDataset`, which keras-hub's own
        methods cannot read (TensorFlow's "unsupported type" error): such
        batches as Keras reads them (a masked array named, as `fit` names
        one), a dataset mapped, arrays `(inputs, labels[, weights])` at once.
        None stays None."""
        def preprocessed(batch):
            inputs, labels, weights = keras.utils.unpack_x_y_sample_weight(batch)
            check_numpy_data(inputs, labels, weights)
            batch = self.preprocess_samples(inputs, labels, weights)
            return batch if isinstance(batch, tuple) else (batch,)  # Keras's form
        if data is None:
            return None
        if is_python_batches(data):
            return map_python_batches(data, preprocessed)
        if isinstance(data, tf.data.Dataset):
            return data.map(self.preprocess_samples)
        return preprocessed(tuple(data))

    def _set_streaming(self, streaming):
        if self._streaming != streaming:
            self._streaming = streaming
            self._drop_step_functions()

    def fit(self, x=None, y=None, batch_size=None, sample_weight=None, validation_data=None,
            validation_split=None, *, shuffle=False, **kwargs):
        """keras-hub's `fit` (its positional arguments, in its order); stream
        batches (see `document_dataset`) carry the memory from batch to
        batch, in order (never shuffled)."""
        kwargs.update({name: value for name, value in (
            ("sample_weight", sample_weight), ("validation_data", validation_data),
            ("validation_split", validation_split)) if value is not None})
        check_numpy_data(x, y, sample_weight)  # Keras would convert them, dropping a mask
        if isinstance(validation_data, (tuple, list)):
            check_numpy_data(*validation_data[:3])
        self.check_vocabulary()
        if kwargs.get("class_weight") is not None:
            raise InputError("fit: class_weight weighs each row by the class of its targets' "
                             "argmax (Keras's rule for one-hot targets), but a language model's "
                             "targets are ids [B, T]; weigh tokens with sample_weight [B, T] "
                             "(e.g. each label's weight looked up)")
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)):
            validation = validation[0]
        # Validation comes through `evaluate` between epochs: data of the
        # other kind, or of another batch size, would drop the step functions
        # `fit` goes on with (and the training memory).
        if not self.is_stream(x):
            if validation is not None and self.is_stream(validation):
                raise InputError("fit: validation_data holds stream batches (with "
                                 "'document_start') but the training data does not; "
                                 "evaluate them apart")
            self._set_streaming(False)
            with input_errors(), _one_restore(self):
                if is_python_batches(x):
                    kwargs["validation_data"] = self._preprocessed(kwargs.get("validation_data"))
                    return keras.Model.fit(self, self._preprocessed(x), y, batch_size=batch_size,
                                           shuffle=shuffle, **kwargs)
                if is_python_batches(validation):
                    raise InputError("fit: validation_data is a Python generator or a "
                                     "PyDataset but the training data is not; pass "
                                     "validation_data as arrays or a tf.data.Dataset")
                return super().fit(x, y, batch_size=batch_size, shuffle=shuffle, **kwargs)
        _refuse_batch_backups(kwargs.get("callbacks"))
        batch_size = self._prepare_streams(x, batch_size, "fit", shuffle)
        if validation is None:  # Keras cuts no rows where validation_data is given
            self._check_validation_split(x, kwargs.get("validation_split"))
        if validation is not None:
            if not self.is_stream(validation):
                raise InputError("fit: the training data holds stream batches (with "
                                 "'document_start') but validation_data does not; evaluate "
                                 "them apart")
            expected = self.stream_batch_size * self.distribute_strategy.num_replicas_in_sync
            checked_batch_size(validation, kwargs.get("validation_batch_size"), expected, "fit",
                               f"validation_data must come in batches of the training data's "
                               f"{expected} streams (drop_remainder=True), or be evaluated apart")
        x = checked_data(x, self.core.config.n_token, y, rows=self._global_rows())
        kwargs["validation_data"] = checked_data(kwargs.get("validation_data"),
                                                 self.core.config.n_token,
                                                 rows=self._global_rows())
        with input_errors(), _one_restore(self):
            return keras.Model.fit(self, x, y, batch_size=batch_size, shuffle=shuffle, **kwargs)

    def _check_validation_split(self, x, validation_split):
        """Raises `InputError` where Keras's `validation_split` (the last rows
        of arrays `x`, cut before batching) leaves a part of a stream batch
        on either side (an assertion deep in the graph)."""
        arrays = tf.nest.flatten(x)
        if not validation_split or isinstance(x, tf.data.Dataset) or \
                not getattr(arrays[0] if arrays else None, "shape", None):
            return
        rows = int(arrays[0].shape[0])
        train = int(math.floor(rows * (1.0 - validation_split)))  # Keras's cut
        expected = self.stream_batch_size * self.distribute_strategy.num_replicas_in_sync
        if train % expected or (rows - train) % expected:
            raise InputError(
                f"fit: validation_split={validation_split} leaves {train} rows to train on and "
                f"{rows - train} to validate; both must be multiples of the {expected} streams "
                "a batch holds (choose the split so, or pass validation_data)")

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `evaluate`; stream batches are read from an empty
        evaluation memory, carried from batch to batch (training's memory
        is left as it is; `fit`'s validation comes here too)."""
        check_numpy_data(x, y, kwargs.get("sample_weight"))
        self.check_vocabulary()
        if not self.is_stream(x):
            self._set_streaming(False)
            with input_errors():
                if is_python_batches(x):
                    return keras.Model.evaluate(self, self._preprocessed(x), y, **kwargs)
                return super().evaluate(x, y, batch_size=batch_size, **kwargs)
        batch_size = self._prepare_streams(x, batch_size, "evaluate")
        self._streams.value[1].clear()
        x = checked_data(x, self.core.config.n_token, y, rows=self._global_rows(),
                         method="evaluate")
        with input_errors():
            return keras.Model.evaluate(self, x, y, batch_size=batch_size, **kwargs)

    def predict(self, x=None, batch_size=None, **kwargs):
        """keras-hub's `predict`; stream batches give log-probs `[B, T,
        n_token]`, read from an empty evaluation memory."""
        check_numpy_data(x)
        self.check_vocabulary()
        if not self.is_stream(x):
            self._set_streaming(False)
            with input_errors():
                if is_python_batches(x):
                    return keras.Model.predict(self, self._preprocessed(x), **kwargs)
                return super().predict(x, batch_size=batch_size, **kwargs)
        batch_size = self._prepare_streams(x, batch_size, "predict")
        if self._call_memory(False) is self._streams.value[1]:
            self._streams.value[1].clear()
        x = checked_data(x, self.core.config.n_token, rows=self._global_rows(),
                         method="predict")
        with input_errors():
            return keras.Model.predict(self, x, batch_size=batch_size, **kwargs)

    def document_dataset(self, documents, batch_size, segment_len=None):
        """Batches for `fit` / `evaluate` that stream `documents` through the
        memory: each of the `batch_size` rows reads documents one after
        another in segments, and a row's memory is cleared where its next
        document starts (the other rows keep theirs).

        Args:
            documents: strings (tokenized with the preprocessor's tokenizer)
                or sequences of ids, each at least 2 ids long.
            batch_size: rows (streams) per batch.
            segment_len: ids per segment (default the config's `tgt_len`).

        Returns:
            A `tf.data.Dataset` of `({"token_ids", "padding_mask",
            "document_start"}, labels, weights)`, one pass in order.
        """
        from txl_tf.data.documents import document_segments
        if any(isinstance(d, (str, bytes)) for d in documents):
            tokenizer = getattr(self.preprocessor, "tokenizer", None)
            self.check_vocabulary()
            if tokenizer is None:
                raise TxlError("documents as text need a preprocessor with a tokenizer; "
                               "give ids, or build the model with a preprocessor")
            documents = [tokenizer.tokenize(d).numpy() if isinstance(d, (str, bytes)) else d
                         for d in documents]
        seg = (self.core.config.tgt_len if segment_len is None
               else check_count("segment_len", segment_len, low=1))
        token_ids, labels, weights, start = document_segments(documents, batch_size, seg)
        inputs = {"token_ids": token_ids, "padding_mask": (weights > 0).astype("int32"),
                  "document_start": start}
        return tf.data.Dataset.from_tensor_slices((inputs, labels, weights))


def _refuse_batch_backups(callbacks):
    """Raises `InputError` for a `keras.callbacks.BackupAndRestore` that backs
    up every N batches: Keras restores such a backup at the start of the
    epoch it was made in (its `training_metadata.json` records the batch,
    which Keras 3.15 does not read), so the batches before it would be
    trained on twice, the first of them read on the memory left after
    them."""
    for callback in getattr(callbacks, "callbacks", callbacks) or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore) and \
                callback.save_freq != "epoch":
            raise InputError(
                f"fit: BackupAndRestore(save_freq={callback.save_freq!r}) backs up within an "
                "epoch, but Keras resumes from the start of that epoch: stream batches before "
                "the backup would be trained on again, on the memory left after them; use "
                "save_freq='epoch', or python -m training.train, which resumes at the step "
                "and place in the data where it stopped")


@contextlib.contextmanager
def _one_restore(model):
    """Within: `fit`. Keras 3.15's `BackupAndRestore` sets the model's
    `_initial_epoch` for the `fit` it restores and nothing resets it, so a
    later `fit(epochs=n)` of the same model would start at that epoch
    (trained on nothing when n is not larger); reset when `fit` ends."""
    try:
        yield
    finally:
        model._initial_epoch = None
