"""`TransformerXLClassifier`: a classification head on the Transformer-XL backbone."""
import contextlib
import math
import numbers
import re

import keras
import numpy as np
import tensorflow as tf

from txl_tf.checks.inputs import (InputError, NumpyInputsChecked, check_numpy_data,
                                  checked_data, input_errors)
from txl_tf.checks.numpy_checks import as_array, is_float_dtype, is_integer_dtype
from txl_tf.checks.python_batches import is_python_batches, map_python_batches
from txl_tf.core import TransformerXL, as_config, check_grad_segments
from txl_tf.errors import TxlError
from txl_tf.keras_support.compile_mixin import AutoJitCompile
from txl_tf.keras_support.keras_compat import (PrebuiltModel, StepsOnStrategyDevice,
                                               resolve_policy_maps)
from txl_tf.keras_support.precision import choose as choose_precision
from txl_tf.layers.dropout import Dropout
from txl_tf.layers.init import normal

INPUT_KEYS = ("token_ids", "lengths")


def split_inputs(inputs):
    """`(token_ids, lengths)` from `{"token_ids": [B, L], "lengths": [B]}`."""
    if not isinstance(inputs, dict) or set(INPUT_KEYS) - set(inputs):
        got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise InputError(f"classifier inputs must be a dict with keys {list(INPUT_KEYS)} "
                         f"(token_ids int [B, L], lengths int [B]); got {got}")
    return inputs["token_ids"], inputs["lengths"]


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLClassifier(NumpyInputsChecked, AutoJitCompile, PrebuiltModel,
                              StepsOnStrategyDevice, keras.Model):
    """Sequence classifier that reads long documents segment by segment.

    ```python
    model = TransformerXLClassifier.from_model_dir("runs/lm", num_classes=3)
    model.compile(keras.optimizers.Adam(1e-4),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(ds)  # ({"token_ids": int [B, L], "lengths": int [B]}, label) batches
    logits = model({"token_ids": ids, "lengths": lengths})  # float32 [B, num_classes]
    ```
    Row b's document is `token_ids[b, :lengths[b]]` (right padding with any
    valid id). The backbone reads it right-aligned, `segment_len` tokens at
    a time, carrying `mem_len` slots of memory that start empty
    (`TransformerXL.read_documents`); padding is never attended, so a
    document's logits do not depend on the rest of its batch. The head
    (dropout, then one dense layer) reads the final hidden state of the
    last token, which has seen the whole document through memory.
    Gradients flow through the last `grad_segments` segments (default 1:
    the memory carries none, as in the paper's training, and the earlier
    segments are read with the same weights but are not differentiated).
    With the memory cut, a classifier trained from fresh weights learns to
    use only what lies within `mem_len` of its last segment; `grad_segments`
    > 1 lets the loss reach what the weights do with earlier segments
    through the memory (docs/classification.md, "Memory
    reach").

    The core's language-model softmax is unused and frozen. Logits are
    float32 under any dtype policy.

    Args:
        backbone: a `TransformerXLConfig` or dict (fresh weights) or a
            `TransformerXL` core (pretrained: its weights are fine-tuned).
        num_classes: classes, an int >= 2.
        segment_len: positions read per segment (None: the config's
            `tgt_len`).
        mem_len: memory slots carried between segments (None: the config's
            `mem_len`; 0 allowed).
        head_dropout: dropout before the head, in [0, 1) (None: the
            config's `dropout`).
        label_names: None, or one name per class.
        grad_segments: the last segments gradients flow through (default 1).
        **kwargs: Keras model arguments. `dtype` (a Keras dtype policy, or
            "auto": the fastest for the hardware, as for `TransformerXLLM`)
            applies to backbone and head alike: a fresh backbone and
            `from_model_dir`'s are built under it; a core passed in keeps
            its own policy, which is the model's when `dtype` is left out,
            and a different `dtype` is a `TxlError` (the core is not rebuilt
            behind the caller's back).

    Raises:
        TxlError: a bad count, dropout, label list or dtype.
    """

    def __init__(self, backbone, num_classes, segment_len=None, mem_len=None,
                 head_dropout=None, label_names=None, grad_segments=1, **kwargs):
        kwargs["dtype"] = resolve_dtype(kwargs.get("dtype"))
        if isinstance(backbone, TransformerXL) and kwargs["dtype"] is None:
            kwargs["dtype"] = backbone.dtype_policy  # a core given alone sets the policy
        super().__init__(**kwargs)
        if isinstance(backbone, TransformerXL):
            if backbone.dtype_policy.name != self.dtype_policy.name:
                raise TxlError(
                    f"the backbone computes under the dtype policy "
                    f"{backbone.dtype_policy.name!r} but the classifier was asked for "
                    f"{self.dtype_policy.name!r}: build the core with that dtype "
                    "(TransformerXL(config, dtype=...)), or use from_model_dir(..., dtype=...), "
                    "or leave dtype out to take the core's")
            self.core = backbone
        else:
            self.core = TransformerXL(as_config(backbone), dtype=self.dtype_policy,
                                      name="transformer")
        cfg = self.core.config
        self.core.crit.trainable = False  # the LM softmax: no gradient reaches it
        self.num_classes = _positive("num_classes", num_classes)
        if self.num_classes == 1:
            raise TxlError("num_classes=1: the class probabilities are a softmax of the logits, "
                           "1 for a single logit; a two-way task takes num_classes=2 (labels 0 "
                           "and 1, SparseCategoricalCrossentropy)")
        self.segment_len = _positive("segment_len",
                                     cfg.tgt_len if segment_len is None else segment_len)
        self.mem_len = cfg.mem_len if mem_len is None else _positive("mem_len", mem_len, 0)
        self.grad_segments = _positive("grad_segments", grad_segments)
        check_grad_segments(self.grad_segments, self.segment_len)
        self.head_dropout = cfg.dropout if head_dropout is None else head_dropout
        if not isinstance(self.head_dropout, numbers.Real) or \
                not 0.0 <= self.head_dropout < 1.0:
            raise TxlError(f"head_dropout must be in [0, 1), got {head_dropout!r}")
        self.head_dropout = float(self.head_dropout)
        if isinstance(label_names, (str, bytes)):
            raise TxlError(f"label_names must be a list of names, got {label_names!r}")
        self.label_names = None if label_names is None else [str(n) for n in label_names]
        if self.label_names is not None and len(self.label_names) != self.num_classes:
            raise TxlError(f"{len(self.label_names)} label_names for {self.num_classes} "
                           "classes")
        self.dropout = Dropout(self.head_dropout, dtype=self.dtype_policy, name="head_dropout")
        self.dropout.build((None, cfg.d_model))  # a shape: summary() prints it
        self.head = keras.layers.Dense(self.num_classes, kernel_initializer=normal(cfg.init_std),
                                       dtype=self.dtype_policy, name="classifier")
        self.head.build((None, cfg.d_model))
        resolve_policy_maps(self)  # a loaded quantized model saves again
        self.vocab_dir = None  # set by from_model_dir; the export ships it
        self.built = True

    @classmethod
    def from_model_dir(cls, path, num_classes, checkpoint=None, config_overrides=None,
                       **kwargs):
        """A classifier on the backbone of a model directory (or training run
        directory, or one written by `python -m txl_tf.convert` from the
        published checkpoints), via `txl_tf.weights.model_dir`.

        Args:
            path: the model (or run) directory, or a shipped model's name.
            num_classes: classes, an int >= 2.
            checkpoint: None (the directory's weights), or which checkpoint
                of a run directory (as `txl_tf.weights.model_dir.resolve`).
            config_overrides: None, or fields that change the backbone's
                config (e.g. `{"dropout": 0.1}`).
            **kwargs: the constructor's (`segment_len`, `mem_len`, ...); the
                backbone is built under their `dtype` policy ("auto"
                resolved first).

        Returns:
            A `TransformerXLClassifier`; its `vocab_dir` is the directory's
            vocabulary.
        """
        from txl_tf.weights import model_dir
        kwargs["dtype"] = resolve_dtype(kwargs.get("dtype"))
        policy = keras.dtype_policies.get(kwargs["dtype"] or keras.config.dtype_policy())
        kwargs["dtype"] = policy  # the backbone is built under it, as the head
        source = model_dir.resolve(path, checkpoint=checkpoint)
        core = model_dir.load_core(source, dtype=policy, **(config_overrides or {}))
        model = cls(core, num_classes, **kwargs)
        model.vocab_dir = source.vocab_dir
        return model

    @property
    def config(self):
        return self.core.config

    # fit / evaluate / predict check the ids, and integer labels, outside the
    # step, where the check survives XLA (`checked_data`, `_checked_labels`).
    def fit(self, x=None, y=None, batch_size=None, epochs=1, *, validation_data=None,
            **kwargs):
        """`keras.Model.fit`, the ids and integer labels checked first.

        Args:
            x: `{"token_ids": [B, L], "lengths": [B]}` arrays, or a dataset
                of `(inputs, labels)`.
            y: class ids `[B]` in `[0, num_classes)` (integers or whole
                floats; with arrays), or one-hot rows `[B, num_classes]`.
            batch_size: Keras's.
            epochs: Keras's.
            validation_data: as `x` and `y`, a tuple or a dataset.
            **kwargs: `keras.Model.fit`'s.

        Returns:
            The Keras `History`.
        """
        n_token = self.config.n_token
        check_numpy_data(x, y, kwargs.get("sample_weight"), labels="labels")
        if isinstance(validation_data, (tuple, list)):
            check_numpy_data(*validation_data[:3], labels="labels")
        with input_errors(), _label_errors():
            x, y = _checked_labels(checked_data(x, n_token, y, targets=False), y,
                                   self.num_classes)
            if isinstance(validation_data, (tuple, list)) and len(validation_data) > 1:
                _checked_labels(None, validation_data[1], self.num_classes)  # arrays
            else:
                validation_data = _checked_labels(validation_data, None, self.num_classes)[0]
            return super().fit(x, y, batch_size=batch_size, epochs=epochs,
                               validation_data=checked_data(validation_data, n_token,
                                                            targets=False), **kwargs)

    def evaluate(self, x=None, y=None, **kwargs):
        """`keras.Model.evaluate`, the ids and integer labels checked first.

        Args:
            x: as for `fit`.
            y: as for `fit`.
            **kwargs: `keras.Model.evaluate`'s.

        Returns:
            What `keras.Model.evaluate` returns (the loss and metrics).
        """
        check_numpy_data(x, y, kwargs.get("sample_weight"), labels="labels")
        with input_errors(), _label_errors():
            x, y = _checked_labels(checked_data(x, self.config.n_token, y, targets=False), y,
                                   self.num_classes)
            return super().evaluate(x, y, **kwargs)

    def predict(self, x, **kwargs):
        """`keras.Model.predict`, the ids checked first.

        Args:
            x: `{"token_ids": [B, L], "lengths": [B]}` arrays, or a dataset.
            **kwargs: `keras.Model.predict`'s.

        Returns:
            float32 numpy logits `[B, num_classes]`.
        """
        check_numpy_data(x)
        with input_errors():
            return super().predict(checked_data(x, self.config.n_token, targets=False),
                                   **kwargs)

    def call(self, inputs, training=False):
        """The logits of each document.

        Args:
            inputs: `{"token_ids": int [B, L], "lengths": int [B]}`; row b's
                document is `token_ids[b, :lengths[b]]`.
            training: Keras's flag (dropout and `grad_segments` on when True).

        Returns:
            float32 `[B, num_classes]`.
        """
        token_ids, lengths = split_inputs(inputs)
        state = self.core.read_documents(  # the same values; only training needs more
            token_ids, lengths, self.segment_len, self.mem_len, training=training,
            grad_segments=self.grad_segments if training else 1)
        logits = self.head(self.dropout(state, training=training))
        return tf.cast(logits, tf.float32)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """Keras's `export` (a serving artifact of `call`; the project's own,
        with metadata and ONNX, is `export.export_classifier`), whose
        `input_signature` defaults to `{"token_ids": int32 [B, L],
        "lengths": int32 [B]}`: Keras reads it from a first call's shapes,
        which a model built at construction never records.

        Args:
            filepath: the artifact's path.
            format: Keras's (`"tf_saved_model"`, ...).
            verbose: Keras's.
            input_signature: None, or Keras's.
            **kwargs: Keras's.
        """
        if input_signature is None:
            input_signature = [{"token_ids": tf.TensorSpec([None, None], tf.int32, "token_ids"),
                                "lengths": tf.TensorSpec([None], tf.int32, "lengths")}]
        return super().export(filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)

    def predict_probabilities(self, inputs):
        """Softmax of the logits.

        Args:
            inputs: as for `call`.

        Returns:
            float32 `[B, num_classes]`.
        """
        return tf.nn.softmax(self(inputs, training=False))

    def get_config(self):
        config = {**super().get_config(), "backbone": self.config.to_dict(),
                  "num_classes": self.num_classes, "segment_len": self.segment_len,
                  "mem_len": self.mem_len, "head_dropout": self.head_dropout,
                  "label_names": self.label_names, "grad_segments": self.grad_segments}
        # After `quantize`: a policy map naming the quantized layers (as
        # keras-hub's backbones write it), so that loading builds them so.
        quantized = {layer.path: layer.dtype_policy for layer in self._flatten_layers()
                     if layer.quantization_mode is not None}
        if quantized and not isinstance(self.dtype_policy, keras.dtype_policies.DTypePolicyMap):
            policies = keras.dtype_policies.DTypePolicyMap(default_policy=self.dtype_policy)
            for path, policy in quantized.items():
                policies[path] = policy
            config["dtype"] = keras.dtype_policies.serialize(policies)
        return config


def resolve_dtype(dtype):
    """`dtype` with "auto" replaced by the fastest policy for the hardware
    (`txl_tf.keras_support.precision.choose`); None stays None."""
    if isinstance(dtype, str) and dtype == "auto":
        return choose_precision(tf.distribute.get_strategy()).policy
    return dtype


_LABELS_ASSERTED = "class labels out of range for"


def _checked_labels(x, y, num_classes):
    """`(x, y)` with class labels (`y`, or a dataset's, a generator's or a
    `PyDataset`'s second item: integers, or float class ids) checked to be
    whole numbers in `[0, num_classes)`:
    eagerly for arrays, in the input pipeline for a dataset, batch by batch
    as Keras reads a generator or a `PyDataset`. In the step Keras's loss
    raises on CPU, and under XLA gives a NaN loss."""
    def check(labels):
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer and not _class_ids(labels.shape):
            return labels  # one-hot or probabilities
        if tf.executing_eagerly():
            _check_label_values(labels.numpy(), num_classes)
            return labels
        if not labels.dtype.is_integer:
            return _checked_float_labels(labels, num_classes)
        ok = tf.reduce_all((labels >= 0) & (labels < num_classes))
        assertion = tf.debugging.Assert(ok, [f"{_LABELS_ASSERTED} {num_classes} classes "
                                             f"(valid labels are 0..{num_classes - 1}); min:",
                                             tf.reduce_min(labels), "max:",
                                             tf.reduce_max(labels)])
        with tf.control_dependencies([assertion]):
            return tf.identity(labels)

    if isinstance(x, tf.data.Dataset):
        return x.map(lambda *batch: (batch[0], check(batch[1]), *batch[2:])
                     if len(batch) > 1 else batch[0]), y
    if is_python_batches(x):
        def check_batch(batch):
            labels = keras.utils.unpack_x_y_sample_weight(batch)[1]
            if labels is not None:
                _check_label_values(as_array(labels, "labels"), num_classes)
            return batch
        return map_python_batches(x, check_batch), y
    if y is not None and (tf.is_tensor(y) or hasattr(y, "__array__")):
        check(y)
    return x, y


def _class_ids(shape):
    """Whether labels of `shape` are class ids (`[B]` or `[B, 1]`), not
    one-hot rows or probabilities (`[B, num_classes]`, num_classes >= 2)."""
    shape = tf.TensorShape(shape)
    return shape.rank == 1 or (shape.rank == 2 and shape[1] == 1)


def _check_label_values(values, num_classes):
    """Raises `InputError` for a class label outside `[0, num_classes)`, or
    for class ids (`_class_ids`) that are not integers or whole floats: a
    sparse loss casts them (1.5 read as class 1, True as 1)."""
    if not is_integer_dtype(values.dtype):
        if not _class_ids(values.shape):  # one-hot or probabilities
            return
        if not is_float_dtype(values.dtype):
            raise InputError(f"labels must be class ids (integers 0..{num_classes - 1}), got "
                             f"dtype {values.dtype}")
        broken = values[values != np.floor(values)]  # NaN too
        if broken.size:
            raise InputError(f"class label {broken.flat[0]} is not a whole number: labels are "
                             f"class ids 0..{num_classes - 1} (a sparse loss would cut it to "
                             "an integer)")
    bad = values[(values < 0) | (values >= num_classes)]
    if bad.size:
        raise InputError(f"class label {bad.flat[0]} is out of range for "
                         f"{num_classes} classes (valid labels are 0..{num_classes - 1})")


_FLOAT_LABELS_ASSERTED = "class labels must be whole numbers in"


def _checked_float_labels(labels, num_classes):
    """Float class ids `labels` (a dataset's, in its graph) with an assertion
    that they are whole numbers in `[0, num_classes)`; others raise."""
    if not labels.dtype.is_floating:
        raise InputError(f"labels must be class ids (integers 0..{num_classes - 1}), got "
                         f"dtype {labels.dtype.name}")
    ok = (labels == tf.floor(labels)) & (labels >= 0) & (labels < num_classes)
    assertion = tf.debugging.Assert(
        tf.reduce_all(ok), [f"{_FLOAT_LABELS_ASSERTED} 0..{num_classes - 1} ({num_classes} "
                            "classes); first bad label:", tf.boolean_mask(labels, ~ok)[:1]])
    with tf.control_dependencies([assertion]):
        return tf.identity(labels)


@contextlib.contextmanager
def _label_errors():
    """`_checked_labels`' input-pipeline assertion as an `InputError`."""
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        message = error.message or ""
        found = re.search(r"\[(class labels must be whole numbers in [^\]]*)\] \[\[?([^\]]*)",
                          message)
        if found:  # `_checked_float_labels`' assertion
            raise InputError(f"{found[1]} {found[2]}") from None
        if _LABELS_ASSERTED not in message:
            raise
        found = re.search(r"\[(class labels out of range[^\]]*)\] \[(-?\d+)\] \[max:\] "
                          r"\[(-?\d+)\]", message)
        raise InputError(f"{found[1]} {found[2]} max: {found[3]}" if found else message) \
            from None


def _positive(name, value, low=1):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or \
            not -math.inf < value < math.inf or int(value) != value or int(value) < low:
        raise TxlError(f"{name} must be " + ("a positive integer" if low == 1 else
                                             f"an integer >= {low}") + f", got {value!r}")
    return int(value)
