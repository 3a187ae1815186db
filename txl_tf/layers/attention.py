"""Relative multi-head attention with segment memory (Dai et al., 2019, §3.3)."""
import keras
import numpy as np
import tensorflow as tf

from txl_tf.app.deprecation import answers_removed_names
from txl_tf.checks.numpy_checks import InputError
from txl_tf.layers.dropout import Dropout
from txl_tf.layers.init import normal
from txl_tf.layers.layer_norm import fused_add_layer_norm, fused_layer_norm
from txl_tf.layers.onnx_forms import onnx_forms
from txl_tf.layers.rel_shift import rel_shift_padded, with_pad_row
from txl_tf.layers.ring_cache import write_rows


def _assign_once(dense, kernel):
    """Sets `dense`'s kernel and skips its next `load_own_variables` (Keras
    reads sub-layers after their parent; an old file has no entry for them)."""
    dense.kernel.assign(kernel)

    def skip(store):
        del dense.load_own_variables

    dense.load_own_variables = skip


def _heads_first(x, batch, length, n_head, d_head):
    """`[B, len, H * d]` → `[B, H, len, d]`.

    With one head the transpose only moves a size-1 axis, so this is one
    reshape: tf2onnx turns such a transpose into a reshape that copies its
    input's first axis (`0`) and then merges it into the reshape before it,
    whose input's first axis is `B * len` (queries and keys of wrong shapes
    in the exported graph).
    """
    if n_head == 1:
        return tf.reshape(x, [batch, 1, length, d_head])
    return tf.transpose(tf.reshape(x, [batch, length, n_head, d_head]), [0, 2, 1, 3])


def _by_head(x, r):
    """`x [B, H, T, d]` times each head's shared `r [H, K, d]` transposed:
    `[B, H, T, K]` (`x`'s H static).

    With one head this is one plain matmul of the `[B * T, d]` rows:
    TensorFlow's oneDNN batch matmul on CPU (tensorflow 2.21) computes a
    product whose batch `[B, 1]` is broadcast against fewer batch axes
    wrongly (garbage, NaN, a corrupted heap) once T is more than a few rows.
    """
    if x.shape[1] != 1:
        return tf.matmul(x, r, transpose_b=True)
    shape = tf.shape(x)
    rows = tf.reshape(x, [-1, shape[3]])
    out = tf.matmul(rows, tf.reshape(r, [-1, shape[3]]), transpose_b=True)
    return tf.reshape(out, [shape[0], 1, shape[2], -1])


@keras.saving.register_keras_serializable(package="txl_tf")
@answers_removed_names("RelativeMultiHeadAttention")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """score(i, j) = (q_i + u)·k_j + (q_i + v)·W_r r_{i-j}, scaled by 1/sqrt(d_head).

    Keys and values come from `concat(memory, inputs)`; queries from the inputs.
    The projections `query`, `key`, `value` and `attention_output` are Keras
    `Dense` layers without bias (the paper's fused `qkv` and `o`), so Keras's
    LoRA (`enable_lora` on `query` and `value`) and int8 quantization act on
    them; the weight layout by the paper's names (`weights.checkpoints`)
    still stores `qkv` as one kernel. The position projection `r_kernel`
    stays a plain float weight: it maps the positional encodings shared by
    every token, and the decoder applies it transposed to the queries.
    Post-LayerNorm by default: `LN(inputs + attn)`; with `pre_lnorm`,
    `inputs + attn(LN(·))`. u and v (`r_w_bias`, `r_r_bias`, `[n_head,
    d_head]`) are passed in by the caller because they may be shared by all
    layers.
    """

    def __init__(self, d_model, n_head, d_head, *, dropout=0.0, dropatt=0.0,
                 pre_lnorm=False, init_std=0.02, layer_norm_epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.n_head, self.d_head = int(d_model), int(n_head), int(d_head)
        self.dropout, self.dropatt = float(dropout), float(dropatt)
        self.pre_lnorm = bool(pre_lnorm)
        self.init_std = float(init_std)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.scale = 1.0 / self.d_head ** 0.5
        with keras.name_scope(self.name):  # unique variable paths per layer
            self.layer_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="LayerNorm")
            self.attn_dropout = Dropout(self.dropatt, dtype=self.dtype_policy)
            heads = self.n_head * self.d_head
            self.query = self._projection(heads, "query")
            self.key = self._projection(heads, "key")
            self.value = self._projection(heads, "value")
            self.attention_output = self._projection(self.d_model, "attention_output")
            self.out_dropout = Dropout(self.dropout, dtype=self.dtype_policy)
        self.build()

    def _projection(self, units, name):
        return keras.layers.Dense(units, use_bias=False, kernel_initializer=normal(self.init_std),
                                  dtype=self.dtype_policy, name=name)

    # Whether the layer has `r_kernel` (the subclasses of the paper's other
    # attention types take their positions otherwise).
    position_projection = True

    def build(self, input_shape=None):
        heads = self.n_head * self.d_head
        if self.position_projection:
            self.r_kernel = self.add_weight(name="r_kernel", shape=(self.d_model, heads),
                                            initializer=normal(self.init_std))
        for projection in (self.query, self.key, self.value):
            projection.build((None, self.d_model))
        self.attention_output.build((None, heads))
        self.layer_norm.build((None, None, self.d_model))
        self.built = True

    def load_own_variables(self, store):
        """Reads this layer's weights from a Keras weights file; a file written
        before the projections were `Dense` layers holds three kernels here
        (`qkv`, `r`, `o`), which go into the layers."""
        if len(store.keys()) != 3:
            super().load_own_variables(store)
            return
        qkv, r, out = (np.asarray(store[str(i)]) for i in range(3))
        for projection, kernel in zip((self.query, self.key, self.value),
                                      np.split(qkv, 3, axis=1)):
            _assign_once(projection, kernel)
        _assign_once(self.attention_output, out)
        self.r_kernel.assign(r)

    def _w(self, variable):
        return tf.cast(variable, self.compute_dtype)

    def call(self, inputs, pos_emb, memory, visible, r_w_bias, r_r_bias, training=None):
        """inputs `[B, T, d]`, pos_emb `[K, d]`, memory `[B, M, d]` (K = M + T),
        visible `[B, 1, T, K]` bool, biases `[n_head, d_head]` → `[B, T, d]`.
        In inference (`training` falsy) the layer norm is written as ONNX
        Runtime fuses it (`layers.layer_norm`: the same math, one kernel of
        an exported segment graph instead of a dozen)."""
        self._check_call(inputs, pos_emb, memory, visible, r_w_bias, r_r_bias)
        fused = not training
        rows, k, v = self._rows_keys_values(inputs, memory, fused)
        return self._attend(inputs, rows, k, v, pos_emb, visible, r_w_bias, r_r_bias, training,
                            fused_norm=fused)

    def probabilities(self, inputs, pos_emb, memory, visible, r_w_bias, r_r_bias):
        """The attention probabilities `[B, n_head, T, M + T]` float32 that
        `call` (same arguments) weighs the values with, before attention
        dropout. Keys are the memory slots then the segment; a hidden key
        gets exactly 0 and each row sums to 1, except a query that sees no
        key at all (`visible` all False in its row: the core's padded
        positions, `token_mask`), which weighs every key equally, hidden
        ones included, in every dtype (finite; its output is meaningless).
        Its float arguments are cast to the compute dtype, as Keras casts
        `call`'s."""
        self._check_call(inputs, pos_emb, memory, visible, r_w_bias, r_r_bias)
        if self.autocast:
            inputs, pos_emb, memory, r_w_bias, r_r_bias = (
                _cast_float(t, self.compute_dtype)
                for t in (inputs, pos_emb, memory, r_w_bias, r_r_bias))
        rows, k, _ = self._rows_keys_values(inputs, memory, fused=True)
        return tf.nn.softmax(self._scores(rows, k, pos_emb, visible, r_w_bias, r_r_bias), axis=-1)

    def _check_call(self, inputs, pos_emb, memory, visible, r_w_bias, r_r_bias):
        """`InputError` unless `call`'s arguments have its shapes and dtypes, as
        far as the static shapes tell (no op in the graph): a visibility of
        one query row would be broadcast to every query, future keys seen."""
        inputs, memory, visible = (tf.convert_to_tensor(t) for t in (inputs, memory, visible))
        for name, tensor in (("inputs", inputs), ("memory", memory)):
            if not tensor.dtype.is_floating:
                raise InputError(f"{name} must be floating point, got {tensor.dtype.name}")
            if not tensor.shape.is_compatible_with([None, None, self.d_model]):
                raise InputError(f"{name} must be [batch, length, d_model={self.d_model}], got "
                                 f"shape {tensor.shape}")
        if inputs.shape[0] is not None and memory.shape[0] is not None \
                and inputs.shape[0] != memory.shape[0]:
            raise InputError(f"inputs have batch {inputs.shape[0]} but memory has batch "
                             f"{memory.shape[0]}")
        qlen, mlen = inputs.shape[1], memory.shape[1]
        klen = None if qlen is None or mlen is None else qlen + mlen
        batch = inputs.shape[0] if inputs.shape[0] is not None else memory.shape[0]
        if visible.dtype != tf.bool or not visible.shape.is_compatible_with(
                [None, 1, qlen, klen]) or None not in (batch, visible.shape[0]) \
                and visible.shape[0] not in (1, batch):
            raise InputError(f"visible must be bool [batch, 1, T, M + T] (T={qlen}, M={mlen}), "
                             f"got {visible.dtype.name} of shape {visible.shape}")
        if not self.position_projection:
            return
        pos_emb = tf.convert_to_tensor(pos_emb)
        if not pos_emb.shape.is_compatible_with([klen, self.d_model]):
            raise InputError(f"pos_emb must be [M + T, d_model] ({klen}, {self.d_model}), got "
                             f"shape {pos_emb.shape}")
        for name, bias in (("r_w_bias", r_w_bias), ("r_r_bias", r_r_bias)):
            # A variable's own shape: converting it would add a read that nothing uses.
            shape = tf.TensorShape(bias.shape) if hasattr(bias, "shape") else \
                tf.convert_to_tensor(bias).shape
            if not shape.is_compatible_with([self.n_head, self.d_head]):
                raise InputError(f"{name} must be [n_head, d_head] ({self.n_head}, "
                                 f"{self.d_head}), got shape {shape}")

    def _rows_keys_values(self, inputs, memory, fused=False):
        """The query rows (`inputs`, after LayerNorm with `pre_lnorm`; `fused`:
        written as ONNX Runtime fuses it) and the keys and values of
        `concat(memory, inputs)`."""
        cat = tf.concat([tf.cast(memory, inputs.dtype), inputs], axis=1)
        # Queries only for the current segment (memory positions ask nothing);
        # keys and values for all of concat(memory, inputs).
        rows = inputs
        if self.pre_lnorm:
            cat = fused_layer_norm(self.layer_norm, cat) if fused else self.layer_norm(cat)
            # The segment's normalized rows: tf.slice with explicit sizes (its
            # gradient is a Pad; tf2onnx mis-converts a size -1 slice with a
            # dynamic begin).
            shape = tf.shape(cat)
            batch, klen, qlen = shape[0], shape[1], tf.shape(inputs)[1]
            rows = tf.slice(cat, tf.stack([0, klen - qlen, 0]),
                            tf.stack([batch, qlen, self.d_model]))
        k, v = self._keys_values(cat)
        return rows, k, v

    def memory_keys_values(self, memory):
        """Keys and values `[B, H, M, d_head]` of the memory positions. They
        depend on the memory alone (position enters through `pos_emb`), so a
        decoder computes them once and carries them (`call_with_cache`)."""
        memory = tf.cast(memory, self.compute_dtype)
        return self._keys_values(self.layer_norm(memory) if self.pre_lnorm else memory)

    def call_with_cache(self, inputs, keys, values, positions, visible, r_w_bias, r_r_bias,
                        at_slot=None, write=None):
        """Inference over cached keys and values, the one cached call:
        `(outputs, key, value)`, the outputs and the new positions' own keys
        and values. Two layouts of the cache:

        * a segment after the memory (`at_slot` None): inputs `[B, T, d]`;
          keys and values `[B, H, M, d_head]` of the memory in time order
          (`memory_keys_values`); positions `[M + T, d]` (`pos_emb`);
          visible bool `[B, 1, T, M + T]`. Returns outputs `[B, T, d]`, keys
          and values `[B, H, T, d_head]`.
        * one position per row on a ring (`layers.ring_cache`), read in
          place: inputs `[B, d]`; keys as columns `[B, H, d_head, S]`,
          values `[B, H, S, d_head]`; `at_slot` (bool `[S]`, one True) the
          slot that is stale or already holds this position (its own key
          and value are used there); visible bool `[B, S]`; positions either
          `[S, d]`, each slot's relative encoding in ring order, or
          `(position_keys, order)`: this layer's `distance_keys` of the
          distinct encodings by distance `[H, d_head, D]` (D <= S: a clamp
          shares one) and each slot's index among them (int32 `[S]`), made
          once by a decoding loop. Returns outputs `[B, d]`, key and value
          `[B, H, d_head]`. With `write` (`(key, value)`, the layer's
          `ring_cache.RowWrite`s), the ring written first: the key and value
          go into the rings (in their dtype) at each row's slot, the read
          takes them from there, and the written rings are returned in
          place of the key and value.
        """
        if at_slot is None:
            return self._segment_on_keys(inputs, keys, values, positions, visible, r_w_bias,
                                         r_r_bias)
        hidden = tf.expand_dims(tf.where(visible, 0.0, -1e30), 1)
        return self._token_on_ring(inputs, keys, values, at_slot, hidden, positions, r_w_bias,
                                   r_r_bias, write)

    def _segment_on_keys(self, inputs, mem_keys, mem_values, pos_emb, visible, r_w_bias,
                         r_r_bias):
        """`call_with_cache` of a segment: `call` with the memory's keys and
        values in place of the memory (it is not projected again)."""
        rows = fused_layer_norm(self.layer_norm, inputs) if self.pre_lnorm else inputs
        k, v = self._keys_values(rows)
        keys = tf.concat([tf.cast(mem_keys, k.dtype), k], 2)
        values = tf.concat([tf.cast(mem_values, v.dtype), v], 2)
        out = self._attend(inputs, rows, keys, values, pos_emb, visible, r_w_bias, r_r_bias,
                           training=False, fused_norm=True)
        return out, k, v

    def _token_on_ring(self, inputs, keys, values, at_slot, hidden, positions, r_w_bias,
                       r_r_bias, write=None):
        """`call_with_cache` of one position per row on a ring; `hidden`:
        float32 `[B, 1, S]`, -1e30 at hidden slots. Written for few graph
        nodes (each is a kernel launch of an exported step on a GPU): one
        projection for the query, key and value, the relative term one
        additive bias, the layer norms in the pattern ONNX Runtime fuses."""
        rows = fused_layer_norm(self.layer_norm, inputs) if self.pre_lnorm else inputs
        q_u, q_v, k_new, v_new = self._token_projections(rows, r_w_bias, r_r_bias)
        if isinstance(positions, tuple):  # the keys by distance, then into slot order
            position_keys, order = positions
            position = tf.gather(tf.matmul(q_v, position_keys), order, axis=3)  # [B, H, 1, S]
        else:
            # (q + v)·(W_r r_j) = (W_r^T (q + v))·r_j: each head's query goes
            # through `r` once, and the positions are shared by every layer (no
            # per-layer position keys to read over the ring).
            position = tf.matmul(self._through_r(q_v), positions, transpose_b=True)
        heads = [-1, self.n_head, self.d_head]
        if write is not None:  # the token's own key and value read from the ring
            keys = write_rows(keys, tf.reshape(k_new, heads), write[0])
            values = write_rows(values, tf.reshape(v_new, heads), write[1])
            content = tf.matmul(q_u, tf.cast(keys, q_u.dtype))
            score = tf.cast(content + position, tf.float32) + tf.expand_dims(hidden, 2)
            prob = tf.cast(tf.nn.softmax(score, axis=-1), self.compute_dtype)
            vec = tf.matmul(prob, tf.cast(values, prob.dtype))
            return self._attention_out(inputs, vec), keys, values
        # Reshapes, not indexing with None: tf2onnx makes that a slice, a kernel.
        slot_mask = tf.reshape(at_slot, [1, 1, 1, -1])
        content = tf.where(slot_mask, tf.matmul(q_u, k_new, transpose_b=True),
                           tf.matmul(q_u, keys))  # [B, H, 1, S]
        score = tf.cast(content + position, tf.float32) + tf.expand_dims(hidden, 2)
        prob = tf.cast(tf.nn.softmax(score, axis=-1), self.compute_dtype)
        # The slot's weight goes to the new value, the rest to the ring's. (A
        # scalar zero, not zeros_like: its shape arithmetic would leave ONNX
        # Runtime's CUDA graph nodes on the CPU.)
        own = tf.matmul(prob, tf.reshape(tf.cast(at_slot, prob.dtype), [-1, 1]))  # [B, H, 1, 1]
        vec = tf.matmul(tf.where(slot_mask, tf.zeros([], prob.dtype), prob), values) + own * v_new
        return (self._attention_out(inputs, vec), tf.reshape(k_new, heads),
                tf.reshape(v_new, heads))

    def _through_r(self, queries):
        """Each head's `queries` `[B, H, 1, d_head]` through its columns of
        the position kernel, `[B, H, 1, d_model]`. For ONNX (`onnx_forms`)
        against the kernel transposed by head, which ONNX Runtime folds at
        load; elsewhere one matmul of the queries as a block-diagonal
        `[B * H, H * d_head]` against the kernel as it is (TensorFlow would
        transpose the kernel at every step)."""
        heads, width = self.n_head, self.n_head * self.d_head
        kernel = self._w(self.r_kernel)
        if onnx_forms():
            return tf.matmul(queries, tf.transpose(
                tf.reshape(kernel, [self.d_model, heads, self.d_head]), [1, 2, 0]))
        blocks = (tf.reshape(queries, [-1, heads, 1, self.d_head])
                  * tf.reshape(tf.eye(heads, dtype=queries.dtype), [1, heads, heads, 1]))
        through = tf.matmul(tf.reshape(blocks, [-1, width]), kernel, transpose_b=True)
        return tf.reshape(through, [-1, heads, 1, self.d_model])

    def _attention_out(self, inputs, vec):
        """A token's attention output `[B, d]` from its heads' values `vec`
        `[B, H, 1, d_head]`: projected, the residual, the layer norm."""
        out = self.attention_output(tf.reshape(vec, [-1, self.n_head * self.d_head]))
        return inputs + out if self.pre_lnorm else fused_add_layer_norm(self.layer_norm, inputs,
                                                                        out)

    def _token_projections(self, rows, r_w_bias, r_r_bias):
        """The queries with u and with v, scaled by 1/sqrt(d_head), the key
        and the value of `rows` `[B, d]`, each `[B, H, 1, d_head]`. Traced
        for ONNX (`onnx_forms`): one matmul over the kernels side by
        side (the query's twice, scaled), with u and v the bias of the
        queries' columns (ONNX Runtime folds the joined weights and the bias
        into one each, once, at load; a query's column more in place of an
        add per layer); the weights are joined and scaled in their own dtype,
        then cast to the compute dtype, which ONNX Runtime folds at load in
        any dtype (its CPU provider, which folds, has no float16 Mul).
        Elsewhere (TensorFlow would join the kernels again at every step,
        copying them), and for a quantized projection, three matmuls.

        Args:
            rows: the layer's query rows `[B, d_model]`.
            r_w_bias: u `[n_head, d_head]`.
            r_r_bias: v `[n_head, d_head]`.

        Returns:
            `(q_u, q_v, k, value)`, each `[B, n_head, 1, d_head]`.
        """
        u, v = (tf.reshape(bias, [self.n_head, 1, self.d_head]) * self.scale
                for bias in (r_w_bias, r_r_bias))
        projections = (self.query, self.key, self.value)
        heads = [-1, self.n_head, 1, self.d_head]
        if not onnx_forms() or any(p.quantization_mode is not None for p in projections):
            q, k, value = (tf.reshape(p(rows), heads) for p in projections)
            q = q * self.scale
            return q + self._w(u), q + self._w(v), k, value
        query = self.query.kernel * self.scale
        kernel = self._w(tf.concat([query, query, self.key.kernel, self.value.kernel], 1))
        width = self.n_head * self.d_head
        bias = self._w(tf.concat([tf.reshape(u, [width]), tf.reshape(v, [width]),
                                  tf.zeros([2 * width], u.dtype)], 0))
        joint = tf.reshape(tf.matmul(rows, kernel) + bias, [-1, 4 * self.n_head, 1, self.d_head])
        q_u, q_v, k, value = tf.split(joint, 4, axis=1)
        return q_u, q_v, k, value

    def distance_keys(self, encodings):
        """The position keys of `encodings [S, d]` as columns `[n_head,
        d_head, S]` (`call_with_cache`'s `positions`)."""
        return tf.transpose(self.position_keys(encodings), [0, 2, 1])

    def position_keys(self, pos_emb):
        """The projected relative encodings `[n_head, K, d_head]` of `pos_emb [K, d]`."""
        r = tf.matmul(pos_emb, self._w(self.r_kernel))
        return tf.transpose(tf.reshape(r, [-1, self.n_head, self.d_head]), [1, 0, 2])

    def _keys_values(self, x):
        """`[B, len, d]` → keys, values `[B, H, len, d_head]`."""
        # Projections of the flattened rows (their kernel gradient is one
        # matmul, not a batch matmul and a sum over the batch).
        shape = tf.shape(x)
        rows = tf.reshape(x, [-1, self.d_model])
        k, v = self.key(rows), self.value(rows)
        return (_heads_first(k, shape[0], shape[1], self.n_head, self.d_head),
                _heads_first(v, shape[0], shape[1], self.n_head, self.d_head))

    def _scores(self, rows, k, pos_emb, visible, r_w_bias, r_r_bias):
        """float32 scores `[B, H, T, K]` of the query `rows` `[B, T, d]` over
        keys `[B, H, K, d_head]`; hidden keys at -1e30."""
        shape = tf.shape(rows)
        q = self.query(tf.reshape(rows, [-1, self.d_model]))
        # Heads-major [B, H, len, d_head] so that every product below is a
        # plain batch matmul: their gradients are batch matmuls too (einsum's
        # are einsums with transposes, slower in bfloat16: benchmarks/NOTES.md).
        q = _heads_first(q, shape[0], shape[1], self.n_head, self.d_head)
        # A zero encoding first (every layer pads the same tensor, which graph
        # optimizers pad once): the scores come with the shift's pad column.
        r = self.position_keys(with_pad_row(pos_emb, 0))  # [H, K + 1, d_head]
        u = tf.reshape(self._w(r_w_bias), [self.n_head, 1, self.d_head])
        w = tf.reshape(self._w(r_r_bias), [self.n_head, 1, self.d_head])
        # The 1/sqrt(d_head) scale goes on the [B, H, T, d] queries, not on
        # the K / d_head times larger scores.
        content = tf.matmul((q + u) * self.scale, k, transpose_b=True)  # [B, H, T, K]
        position = rel_shift_padded(_by_head((q + w) * self.scale, r))
        # Hidden keys get -1e30 added (the sum rounds to exactly -1e30): an
        # add, whose gradient is free, in place of a select over [B, H, T, K].
        hidden = tf.where(visible, tf.constant(0.0), tf.constant(-1e30))  # [B, 1, T, K]
        return tf.cast(content + position, tf.float32) + hidden

    def _attend(self, inputs, rows, k, v, pos_emb, visible, r_w_bias, r_r_bias, training,
                fused_norm=False):
        """Attention of the query `rows` over keys / values `[B, H, K, d_head]`,
        then the output projection and the residual onto `inputs` (the layer
        norm as ONNX Runtime fuses it with `fused_norm`: `layers.layer_norm`)."""
        score = self._scores(rows, k, pos_emb, visible, r_w_bias, r_r_bias)
        prob = tf.cast(tf.nn.softmax(score, axis=-1), self.compute_dtype)
        prob = self.attn_dropout(prob, training=training)
        shape = tf.shape(inputs)
        vec = tf.transpose(tf.matmul(prob, v), [0, 2, 1, 3])  # [B, T, H, d]
        vec = tf.reshape(vec, [-1, self.n_head * self.d_head])
        out = tf.reshape(self.attention_output(vec), [shape[0], shape[1], self.d_model])
        out = self.out_dropout(out, training=training)
        if self.pre_lnorm:
            return inputs + out
        if fused_norm:
            return fused_layer_norm(self.layer_norm, inputs + out)
        return self.layer_norm(inputs + out)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "n_head": self.n_head,
                "d_head": self.d_head, "dropout": self.dropout, "dropatt": self.dropatt,
                "pre_lnorm": self.pre_lnorm, "init_std": self.init_std,
                "layer_norm_epsilon": self.layer_norm_epsilon}


def _cast_float(tensor, dtype):
    """`tensor` in `dtype` if it is floating point, else as it is (None, the
    absolute layers' unused positions and biases, too)."""
    if tensor is None:
        return None
    tensor = tf.convert_to_tensor(tensor)
    return tf.cast(tensor, dtype) if tensor.dtype.is_floating else tensor
