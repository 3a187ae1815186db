"""Attention masks: causal with memory, `same_length`, and memory slot validity."""
import tensorflow as tf


def causal_visibility(qlen, mlen, same_length=False):
    """`[qlen, mlen + qlen]` bool, True where query i may attend to key j.

    Query i (0-based within the segment) sees keys `j <= mlen + i`; with
    `same_length` it also stops seeing keys `j < i`, so that every query sees
    exactly `mlen + 1` keys (the paper's evaluation setting).
    """
    query = tf.range(qlen)[:, None]
    key = tf.range(mlen + qlen)[None, :]
    visible = key <= query + mlen
    if same_length:
        visible = visible & (key >= query)
    return visible


def attention_visibility(qlen, mem_valid, same_length=False):
    """`[B, 1, qlen, klen]` bool: causal visibility and real memory slots.

    `mem_valid` is the memory's `[B, M]` bool slot validity; the current
    segment's own keys are always real.
    """
    batch = tf.shape(mem_valid)[0]
    mlen = tf.shape(mem_valid)[1]
    key_valid = tf.concat([mem_valid, tf.ones([batch, qlen], tf.bool)], axis=1)
    visible = causal_visibility(qlen, mlen, same_length)
    return (visible[None, :, :] & key_valid[:, None, :])[:, None, :, :]
