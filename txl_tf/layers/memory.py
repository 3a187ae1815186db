"""The recurrence memory: cached layer inputs of earlier segments and which slots are real."""
from typing import NamedTuple

import tensorflow as tf


class Memory(NamedTuple):
    """Segment-level recurrence state, batch-major.

    states: float32 `[n_layer, B, M, d_model]`; `states[i]` holds the inputs of
        layer i (layer 0: the embedding output) at the last M positions.
    valid: bool `[B, M]`; True where a slot holds a real state. Invalid slots
        are never attended, so an all-invalid memory is exactly "no history".
    """

    states: tf.Tensor
    valid: tf.Tensor

    @property
    def mem_len(self):
        return self.states.shape[2]


def initial_memory(n_layer, batch_size, mem_len, d_model, zero_filled=False):
    """A fresh memory: empty (nothing attended) or, with `zero_filled`, the
    paper code's start of zero states that are attended."""
    states = tf.zeros([n_layer, batch_size, mem_len, d_model], tf.float32)
    valid = tf.fill([batch_size, mem_len], bool(zero_filled))
    return Memory(states, valid)


def update_memory(memory, layer_inputs):
    """Keeps the last M positions of `concat(memory, layer_inputs)`.

    `layer_inputs` is `[n_layer, B, T, d_model]`; new positions are real. The
    result has the memory's geometry and carries no gradient.
    """
    states = tf.concat([memory.states, tf.cast(layer_inputs, tf.float32)], axis=2)
    batch, qlen = tf.shape(layer_inputs)[1], tf.shape(layer_inputs)[2]
    valid = tf.concat([memory.valid, tf.ones([batch, qlen], tf.bool)], axis=1)
    mem_len = tf.shape(memory.states)[2]
    start = tf.shape(states)[2] - mem_len
    new_states = tf.stop_gradient(states[:, :, start:])
    new_valid = tf.stop_gradient(valid[:, start:])
    new_states.set_shape(memory.states.shape)
    new_valid.set_shape(memory.valid.shape)
    return Memory(new_states, new_valid)


def as_memory(value):
    """Accepts a `Memory`, a `(states, valid)` pair or a dict with those keys."""
    if isinstance(value, Memory):
        return value
    if isinstance(value, dict):
        try:
            return Memory(value["states"], value["valid"])
        except KeyError as missing:
            raise ValueError(f"memory dict needs keys 'states' and 'valid', missing {missing}")
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return Memory(*value)
    raise ValueError(
        "memory must be a txl_tf.Memory (states [n_layer, B, M, d_model], valid [B, M]); "
        f"got {type(value).__name__}")
