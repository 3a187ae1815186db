"""An LSTM language model with the core's contract, the RNN baseline of the
paper's comparisons (its Tables 6 and 8).

`LSTMLanguageModel(token_ids, memory, targets=None)` returns `(log-probs or
NLL, new_memory)` like `TransformerXL`, so the same stream evaluation
(`txl_tf.learning.evaluation.evaluate_ids`) and loss-by-context scoring read both. Its
"memory" is the recurrent state carried from segment to segment, stored as a
`Memory` of two slots per layer (the LSTM's `h` and `c`); a memory of no
slots (`initial_memory(batch, 0)`) starts every segment from the zero state.
"""
import dataclasses
import io
import json
import os
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from txl_tf.app.files import parse_json, stage
from txl_tf.checks.inputs import NumpyInputsChecked, check_targets, check_token_ids
from txl_tf.errors import TxlError
from txl_tf.layers.memory import Memory

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
MODEL_KIND = "lstm"


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
    """The LSTM baseline's size.

    Attributes:
        n_token: vocabulary size.
        d_model: embedding and hidden size of every layer.
        n_layer: stacked LSTM layers.
        tgt_len: training segment length (truncated back-propagation).
        dropout: on the embeddings and on each layer's output.
        vocab_fingerprint: the tokenizer's fingerprint, as in
            `TransformerXLConfig`.
    """
    n_token: int = 256
    d_model: int = 220
    n_layer: int = 2
    tgt_len: int = 64
    dropout: float = 0.1
    vocab_fingerprint: Optional[str] = None

    def __post_init__(self):
        for name in ("n_token", "d_model", "n_layer", "tgt_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TxlError(f"LSTMConfig.{name} must be a positive int, got {value!r}")
        if not 0 <= self.dropout < 1:
            raise TxlError(f"LSTMConfig.dropout must be in [0, 1), got {self.dropout!r}")

    # What evaluation reads of a config: the state is carried by default
    # (two slots: h and c), and a fresh state is zeros.
    mem_len = 2
    zero_filled_memory = True

    def to_dict(self):
        """The config as `config.json` holds it.

        Returns:
            A dict of every field, and `"model": "lstm"`.
        """
        return {"model": MODEL_KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, values):
        """The config of `to_dict`'s dict.

        Args:
            values: the dict, with `"model": "lstm"`.

        Returns:
            An `LSTMConfig`.

        Raises:
            TxlError: no `"model": "lstm"`, an unknown field or a bad value.
        """
        values = dict(values)
        if values.pop("model", None) != MODEL_KIND:
            raise TxlError("not an LSTM baseline's config (no \"model\": \"lstm\")")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TxlError(f"unknown LSTMConfig fields: {', '.join(unknown)}")
        return cls(**values)


class LSTMLanguageModel(NumpyInputsChecked, keras.layers.Layer):
    """Embedding, `n_layer` LSTMs carrying their state, a softmax.

    Args:
        config: an `LSTMConfig`.
    """

    call_arg_names = ("memory", "targets")  # checked before Keras converts them

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.embedding = keras.layers.Embedding(config.n_token, config.d_model, name="embedding")
        self.lstms = [keras.layers.LSTM(config.d_model, return_sequences=True, return_state=True,
                                        name=f"lstm_{i}") for i in range(config.n_layer)]
        self.dropout = keras.layers.Dropout(config.dropout)
        self.softmax = keras.layers.Dense(config.n_token, name="softmax")

    def build(self, input_shape=None):
        d = self.config.d_model
        self.embedding.build((None, None))
        for lstm in self.lstms:
            lstm.build((None, None, d))
        self.softmax.build((None, None, d))
        self.built = True

    def initial_memory(self, batch_size, mem_len=None):
        """The zero state.

        Args:
            batch_size: rows.
            mem_len: None (the state carried: two slots, h and c), or 0: no
                state at all (every segment starts from zeros).

        Returns:
            A `Memory`: `mems` `[n_layer, B, 2 or 0, d_model]` zeros,
            `mem_mask` all True.
        """
        slots = 2 if mem_len is None or mem_len else 0
        return Memory(tf.zeros([self.config.n_layer, batch_size, slots, self.config.d_model]),
                      tf.fill([batch_size, slots], True))

    def call(self, token_ids, memory=None, targets=None, training=False, token_mask=None):
        """Reads one segment.

        Args:
            token_ids: int `[B, T]` (any integer dtype), each in `[0, n_token)`.
            memory: the state from the previous segment (`initial_memory`),
                or None for the zero state (then no state is returned to carry).
            targets: int `[B, T]` next ids in `[0, n_token)`, or None.
            training: dropout on.
            token_mask: accepted for the core's contract; padded positions
                are excluded by the caller's weights.

        Returns:
            `(nll [B, T], new_memory)` with targets, else
            `(log_probs [B, T, n_token], new_memory)`.

        Raises:
            InputError: ids or targets that are not integers `[B, T]` in
                `[0, n_token)` (in a graph, an assertion).
        """
        del token_mask
        n_token = self.config.n_token
        token_ids = check_token_ids(tf.convert_to_tensor(token_ids), n_token)
        if targets is not None:
            targets = check_targets(tf.convert_to_tensor(targets), token_ids, n_token)
        token_ids = tf.cast(token_ids, tf.int32)
        batch = tf.shape(token_ids)[0]
        carried = memory is not None and memory.mems.shape[2] != 0
        x = self.dropout(self.embedding(token_ids), training=training)
        states = []
        for i, lstm in enumerate(self.lstms):
            if carried:
                start = [memory.mems[i, :, 0], memory.mems[i, :, 1]]
            else:
                zeros = tf.zeros([batch, self.config.d_model], x.dtype)
                start = [zeros, zeros]
            x, h, c = lstm(x, initial_state=start, training=training)
            x = self.dropout(x, training=training)
            states.append(tf.stack([h, c], axis=1))
        logits = tf.cast(self.softmax(x), tf.float32)
        if carried:
            memory = Memory(tf.stack(states), memory.mem_mask)
        elif memory is None:
            memory = self.initial_memory(batch, 0)
        if targets is None:
            return tf.nn.log_softmax(logits), memory
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.cast(targets, tf.int32), logits=logits)
        return nll, memory


def save_lstm(model, directory, tokenizer=None, replaces=()):
    """Writes `config.json`, `model.weights.h5` (and the tokenizer into
    `vocab/`) into `directory`.

    Args:
        model: an `LSTMLanguageModel` (built here if it was never called).
        directory: the folder (made if missing).
        tokenizer: None, or the `txl_tf.text.Tokenizer` the model reads with.
        replaces: paths of the previous save's files elsewhere (its
            training log), deleted when this save is renamed in.
    """
    if not model.built:  # never called: its weights are made here, not saved as none
        model.build()
    weights = {_name(v): v.numpy() for v in model.weights}
    # Renamed in together, config.json last (txl_tf.app.files): a kill leaves
    # the previous save or this one, or a folder without config.json.
    with stage(os.path.join(directory, CONFIG_FILE)) as files:
        _write_weights(files.path(os.path.join(directory, WEIGHTS_FILE)), weights)
        if tokenizer is not None:
            tokenizer.save(files.path(os.path.join(directory, "vocab")))
        with open(files.path(os.path.join(directory, CONFIG_FILE)), "w", encoding="utf-8") as f:
            json.dump(model.config.to_dict(), f, indent=2)
        for path in replaces:
            files.drop(path)


def lstm_folder(directory):
    """Where a saved LSTM baseline is.

    Args:
        directory: a model or training run directory.

    Returns:
        The folder (`directory` or its `export/`) that holds a saved LSTM
        baseline, or None.
    """
    path = _config_path(directory)
    return None if path is None else os.path.dirname(path)


def load_lstm(directory):
    """The `LSTMLanguageModel` saved in `directory` (or its `export/`).

    Args:
        directory: the folder `save_lstm` wrote (or a run directory whose
            `export/` it is).

    Returns:
        The `LSTMLanguageModel`, built, its weights set.

    Raises:
        TxlError: no LSTM baseline there, or its weights do not match.
    """
    path = _config_path(directory)
    if path is None:
        raise TxlError(f"{directory}: no LSTM baseline ({CONFIG_FILE} with \"model\": "
                       "\"lstm\") here or in its export/")
    with open(path, encoding="utf-8") as f:
        config = LSTMConfig.from_dict(parse_json(f.read()))
    model = LSTMLanguageModel(config)
    model.build()
    import h5py
    with h5py.File(os.path.join(os.path.dirname(path), WEIGHTS_FILE), "r") as f:
        saved = {}
        f.visititems(lambda name, item: saved.__setitem__(name, item)
                     if isinstance(item, h5py.Dataset) else None)
        for variable in model.weights:
            # Shape and dtype from the dataset's header, before it is read: an
            # HDF5 dataset stores only the chunks written, so a few KB may
            # declare any size.
            item = saved.pop(_name(variable), None)
            if item is None or item.shape != tuple(variable.shape):
                found = f" (it holds {item.shape})" if item is not None else ""
                raise TxlError(f"{directory}: the saved weights have no {_name(variable)} of "
                               f"shape {tuple(variable.shape)}{found}")
            if item.external or item.is_virtual:  # values read from any path it names
                raise TxlError(f"{directory}: the saved weight {_name(variable)} keeps its "
                               "values in another file (external or virtual HDF5 storage)")
            if item.dtype.kind != "f":
                raise TxlError(f"{directory}: the saved weight {_name(variable)} holds "
                               f"{item.dtype} values, where a floating-point weight belongs")
            value = item[()]
            if not np.isfinite(value).all():
                raise TxlError(f"{directory}: the saved weight {_name(variable)} holds NaN or "
                               "inf values")
            variable.assign(value)
    if saved:
        raise TxlError(f"{directory}: the saved weights hold unknown variables {sorted(saved)}")
    return model


def lstm_scorer(model):
    """A `context_losses` scorer: each window read from the zero state, so
    nothing older than the window reaches the prediction.

    Args:
        model: an `LSTMLanguageModel`.

    Returns:
        `scorer(windows)`: int windows `[N, c]` -> numpy log-probs
        `[N, n_token]` of the id after each window.
    """
    compiled = tf.function(lambda ids: model(ids, None)[0][:, -1], reduce_retracing=True,
                           autograph=False)
    return lambda windows: compiled(tf.constant(windows, tf.int32)).numpy()


def _name(variable):
    """A variable's path below the model (the model's own name varies)."""
    return variable.path.split("/", 1)[1]


def _config_path(directory):
    for folder in (directory, os.path.join(directory, "export")):
        path = os.path.join(folder, CONFIG_FILE)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    if parse_json(f.read()).get("model") == MODEL_KIND:
                        return path
            except (OSError, ValueError, AttributeError):
                return None
    return None


def _write_weights(path, weights):
    """Writes `weights` (`{name: array}`) as the HDF5 file `path` (`save_lstm`'s
    temporary): built in memory, then written with one `write`, whose full
    disk is an `OSError` (HDF5 writing to the disk itself crashed the process
    on one: a segmentation fault)."""
    import h5py
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        for name, value in weights.items():
            f.create_dataset(name, data=value)
    with open(path, "wb") as f:
        f.write(buffer.getbuffer())
