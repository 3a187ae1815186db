"""The memory of a Keras model whose batches continue streams: variables
that carry each row's memory from batch to batch, cleared per row where a
document starts. `TransformerXLLM` and `TransformerXLCausalLM` read and
write it the same way."""
import keras
import tensorflow as tf

from txl_tf.checks.inputs import InputError
from txl_tf.layers.memory import Memory


class StreamMemory:
    """A `Memory` in per-replica (sync-on-read) variables: `mems [n_layer,
    batch_size, mem_len, d_model]` and `mem_mask [batch_size, mem_len]`.

    Args:
        config: the core's `TransformerXLConfig`.
        batch_size: rows (streams) per replica.
        mem_len: memory slots per row.
        zero_filled: an empty memory is attended zeros (the paper's TF
            code) rather than no slots.
        prefix: prefix of the variables' names.
    """

    def __init__(self, config, batch_size, mem_len, zero_filled, prefix=""):
        per_replica = dict(dtype="float32", trainable=False, autocast=False,
                           synchronization="on_read", aggregation="only_first_replica")
        self.batch_size, self.zero_filled = int(batch_size), bool(zero_filled)
        self.mems = keras.Variable(
            initializer="zeros", name=prefix + "mems", **per_replica,
            shape=(config.n_layer, self.batch_size, mem_len, config.d_model))
        self.mem_mask = keras.Variable(
            initializer="ones" if self.zero_filled else "zeros", name=prefix + "mem_mask",
            shape=(self.batch_size, mem_len), **per_replica)

    def read(self, document_start=None):
        """The memory, with the rows where `document_start` (bool `[B]`) is
        True cleared (the other rows keep theirs)."""
        memory = Memory(tf.convert_to_tensor(self.mems), tf.convert_to_tensor(self.mem_mask) > 0.5)
        if document_start is None:
            return memory
        return memory.reset_rows(document_start, zero_filled=self.zero_filled)

    def write(self, memory):
        """Stores `memory` (a `Memory` of this shape)."""
        self.mems.assign(memory.mems)
        self.mem_mask.assign(tf.cast(memory.mem_mask, tf.float32))

    def clear(self):
        """Forgets every row's history."""
        self.mems.assign(tf.zeros(self.mems.shape))
        self.mem_mask.assign((tf.ones if self.zero_filled else tf.zeros)(self.mem_mask.shape))


def split_inputs(x, optional=("document_start",)):
    """`(token_ids, {key: tensor or None})` of a batch's inputs: ids alone, or
    a dict with `token_ids` and the `optional` keys (`document_start` cast
    to bool).

    Raises:
        InputError: a dict without `token_ids` or with another key.
    """
    if not isinstance(x, dict):
        return x, dict.fromkeys(optional)
    unknown = set(x) - {"token_ids", *optional}
    if unknown or "token_ids" not in x:
        allowed = " and optionally ".join(["'token_ids'", ", ".join(repr(k) for k in optional)])
        raise InputError(f"inputs as a dict take {allowed}, got keys {sorted(x)}")
    extra = {key: x.get(key) for key in optional}
    if extra.get("document_start") is not None:
        extra["document_start"] = tf.cast(extra["document_start"], tf.bool)
    return x["token_ids"], extra


def checked_batch_size(x, batch_size, expected, method, fix):
    """The `batch_size` to hand Keras, after checking that every batch of `x`
    (a `tf.data.Dataset` or arrays) has `expected` rows: a batch of another
    size would be a shape error deep in a graph.

    Args:
        x: the data given to `fit` / `evaluate` / `predict`.
        batch_size: the `batch_size` given with it.
        expected: the global batch size the memory holds.
        method: the method's name, for the message.
        fix: what the user should do, for the message.

    Raises:
        InputError: batches of another size, or of no fixed size.
    """
    if isinstance(x, tf.data.Dataset):
        first = tf.nest.flatten(x.element_spec)[0]
        size = first.shape[0] if first.shape.rank else None
        if size is None:
            raise InputError(f"{method}: the dataset's batches have no fixed size; {fix}")
        if size != expected:
            raise InputError(f"{method}: the dataset gives batches of {size}; {fix}")
        return batch_size
    arrays = tf.nest.flatten(x)
    count = arrays[0].shape[0] if arrays and getattr(arrays[0], "shape", None) else None
    if batch_size not in (None, expected) or (count is not None and count % expected):
        got = f"batch_size={batch_size}" if batch_size not in (None, expected) else \
            f"{count} rows (not a multiple of {expected})"
        raise InputError(f"{method}: {got}; {fix}")
    return expected if count is not None else batch_size
