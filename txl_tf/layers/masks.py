"""Attention masks: causal with memory, `same_length`, and memory slot validity."""
import tensorflow as tf

from txl_tf.errors import TxlError


def causal_visibility(qlen, mlen, same_length=False, convention="tf"):
    """`[qlen, mlen + qlen]` bool, True where query i may attend to key j.

    Query i (0-based within the segment; its own key is `mlen + i`) sees keys
    `j <= mlen + i`. `same_length` (the paper's evaluation setting) also
    limits how far back it looks, by the rule of the code the weights come
    from:

    * "tf" (the paper's TF code): keys `j >= i`, the last `mlen + 1`
      positions;
    * "pytorch" (the paper's PyTorch code, which masks with
      `mask_len = klen - mem_len` and `tril(ones, -(qlen - mask_len))`): keys
      `j > i`, the last `mlen` positions, itself included. There `mem_len` is
      the configured memory length, here the memory's length `mlen`; with
      `mlen == 0` a query still sees itself (that code would mask every key).

    The two differ only once the memory is full of real states.
    """
    query = tf.range(qlen)[:, None]
    key = tf.range(mlen + qlen)[None, :]
    visible = key <= query + mlen
    if same_length:
        if convention == "tf":
            visible = visible & (key >= query)
        elif convention == "pytorch":
            visible = visible & ((key > query) | (key == query + mlen))
        else:
            raise TxlError(f"unknown same_length convention {convention!r}")
    return visible


def sees_whole_memory(same_length=False, convention="tf"):
    """Whether a query right after its memory sees every key of it whatever
    the memory's length (`causal_visibility(1, mlen, same_length,
    convention)` all True for every `mlen`): all but `same_length`'s
    "pytorch" convention, which leaves a full memory's oldest key out.

    Args:
        same_length: the paper's evaluation setting.
        convention: "tf" or "pytorch", as `causal_visibility` takes it.

    Returns:
        A Python bool.
    """
    if convention not in ("tf", "pytorch"):
        raise TxlError(f"unknown same_length convention {convention!r}")
    return not (same_length and convention == "pytorch")


def attention_visibility(qlen, mem_valid, same_length=False, convention="tf", token_valid=None):
    """`[B, 1, qlen, klen]` bool: causal visibility and real memory slots.

    `mem_valid` is the memory's `[B, M]` bool slot validity; the current
    segment's own keys are real unless `token_valid` (bool `[B, qlen]`,
    False at padding) says otherwise.
    """
    batch = tf.shape(mem_valid)[0]
    mlen = tf.shape(mem_valid)[1]
    if token_valid is None:
        token_valid = tf.ones([batch, qlen], tf.bool)
    key_valid = tf.concat([mem_valid, token_valid], axis=1)
    visible = causal_visibility(qlen, mlen, same_length, convention)
    return (visible[None, :, :] & key_valid[:, None, :])[:, None, :, :]
