"""One tail bin's share of the adaptive softmax's NLL in static shapes (for
XLA), computed on the rows whose target falls in the bin and no others.

XLA needs static shapes, so the bin's rows cannot be selected with
`tf.where` (its shapes would be bounded by the row count). Scoring every row
against every tail instead costs, at `wt103_base`, as much work as the rest
of the model (benchmarks/NOTES.md, section 12). Here the bin's rows are put
first (a permutation of all rows) and read in chunks of a fixed number of
rows, in a `tf.while_loop` that stops after the chunk holding the bin's last
row; the gradient reads them again the same way (`tf.custom_gradient`), so
no `[rows, bin size]` tensor is kept from the forward pass.
"""
import math

import tensorflow as tf

# A chunk's rows: this share of all the rows, rounded up. A bin holding no
# more rows than that (the usual case for every tail bin of wt103's
# vocabulary) is read in one chunk.
CHUNK_SHARE = 1 / 8


def chunk_rows(n_rows):
    """The rows of a chunk for `n_rows` rows (>= 1)."""
    return max(1, math.ceil(n_rows * CHUNK_SHARE))


def bin_rows_first(in_bin):
    """int32 `[N]`: a permutation of the rows, those where `in_bin` is
    True first, each group in row order; and the count of those rows."""
    in_bin = tf.cast(in_bin, tf.int32)
    count = tf.reduce_sum(in_bin)
    rank = tf.where(in_bin > 0, tf.cumsum(in_bin) - 1, count + tf.cumsum(1 - in_bin) - 1)
    n = tf.shape(in_bin)[0]
    return tf.scatter_nd(rank[:, None], tf.range(n), [n]), count


def tail_nll(hidden, target, low, high, proj, weight, bias):
    """`[N]` float32: at each row whose target is in `[low, high)`, the
    log-sum-exp of the bin's logits less the target's logit; 0 elsewhere.

    A row's logits are `hidden @ proj^T @ weight^T + bias` (without `proj`:
    `hidden @ weight^T + bias`) in the compute dtype, cast to float32, as
    `AdaptiveLogSoftmax._logits` gives them. The gradients reach `hidden`,
    `proj`, `weight` and `bias` (float32 sums, cast to their dtype).

    Args:
      hidden: `[N, d_model]`, N static.
      target: int32 `[N]`.
      low, high: the bin's first id and the one past its last.
      proj: None or `[d_proj, d_model]`.
      weight: `[high - low, d_proj]` (`d_model` without `proj`).
      bias: `[high - low]`.

    Returns:
      float32 `[N]`.
    """
    n = hidden.shape[0]
    size, size_bin = chunk_rows(n), high - low
    most_chunks = -(-n // size)
    order, count = bin_rows_first((target >= low) & (target < high))
    order = tf.pad(order, [[0, most_chunks * size - n]])  # the last chunk's extra rows: masked
    labels = target - low
    chunks = (count + size - 1) // size

    def chunk(j):
        """The rows of chunk j and whether each is one of the bin's."""
        return tf.slice(order, [j * size], [size]), j * size + tf.range(size) < count

    def over_chunks(body, start):
        """`start` carried through `body(j, *carried)` for each chunk."""
        return tf.while_loop(lambda j, *_: j < chunks,
                             lambda j, *carried: (j + 1,) + body(j, *carried),
                             (tf.constant(0),) + start, maximum_iterations=most_chunks)[1:]

    def scores(rows, in_bin, hidden, proj, weight, bias):
        """The rows' hidden states (0 in the rows outside the bin, so that a
        NaN or infinity there cannot reach the bin's gradients through a
        product by 0), inputs to `weight`, float32 logits, one-hot targets."""
        states = tf.where(in_bin[:, None], tf.gather(hidden, rows), tf.zeros([], hidden.dtype))
        inputs = states if proj is None else tf.matmul(states, proj, transpose_b=True)
        logits = tf.cast(tf.matmul(inputs, weight, transpose_b=True) + bias, tf.float32)
        return states, inputs, logits, tf.one_hot(tf.gather(labels, rows), size_bin)

    @tf.custom_gradient
    def nll_of(hidden, *weights):
        proj, weight, bias = weights if len(weights) == 3 else (None,) + weights

        def forward(j, nll):
            rows, in_bin = chunk(j)
            _, _, logits, one_hot = scores(rows, in_bin, hidden, proj, weight, bias)
            value = tf.reduce_logsumexp(logits, -1) - tf.reduce_sum(logits * one_hot, -1)
            return (tf.tensor_scatter_nd_add(nll, rows[:, None],
                                             tf.where(in_bin, value, 0.0)),)

        def gradient(upstream):
            def backward(j, d_hidden, d_proj, d_weight, d_bias):
                rows, in_bin = chunk(j)
                states, inputs, logits, one_hot = scores(rows, in_bin, hidden, proj, weight,
                                                         bias)
                scale = tf.where(in_bin, tf.gather(upstream, rows), 0.0)
                d_logits = (tf.nn.softmax(logits) - one_hot) * scale[:, None]
                d_bias += tf.reduce_sum(d_logits, 0)
                d_logits = tf.cast(d_logits, weight.dtype)
                d_weight += tf.cast(tf.matmul(d_logits, inputs, transpose_a=True), tf.float32)
                d_inputs = tf.matmul(d_logits, weight)
                if proj is not None:
                    d_proj += tf.cast(tf.matmul(d_inputs, states, transpose_a=True), tf.float32)
                    d_inputs = tf.matmul(d_inputs, proj)
                d_hidden = tf.tensor_scatter_nd_add(d_hidden, rows[:, None],
                                                    tf.cast(d_inputs, tf.float32))
                return d_hidden, d_proj, d_weight, d_bias

            zeros = (tf.zeros(hidden.shape, tf.float32),
                     tf.zeros(() if proj is None else proj.shape, tf.float32),
                     tf.zeros(weight.shape, tf.float32), tf.zeros(bias.shape, tf.float32))
            d_hidden, d_proj, d_weight, d_bias = over_chunks(backward, zeros)
            grads = ((d_hidden, hidden.dtype),) + (() if proj is None else ((d_proj, proj.dtype),))
            grads += ((d_weight, weight.dtype), (d_bias, bias.dtype))
            return tuple(tf.cast(g, dtype) for g, dtype in grads)

        return over_chunks(forward, (tf.zeros([n], tf.float32),))[0], gradient

    weights = (weight, bias) if proj is None else (proj, weight, bias)
    return nll_of(hidden, *weights)
