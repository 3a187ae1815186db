"""The pure core: `(token_ids, memory) -> (outputs, new_memory)`, no hidden state."""
import numbers

import keras
import numpy as np
import tensorflow as tf

from txl_tf.app.deprecation import answers_removed_names, check_no_removed_keywords
from txl_tf.checks.inputs import (InputError, check_memory, check_targets, check_token_ids,
                                  check_token_mask, convertible, dense, rectangular)
from txl_tf.checks.numpy_checks import MAX_POSITIONS, check_count, check_flag
from txl_tf.config import as_config
from txl_tf.errors import TxlError
from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
from txl_tf.layers.adaptive_softmax import AdaptiveLogSoftmax
from txl_tf.layers.block import TransformerXLBlock
from txl_tf.layers.dropout import Dropout
from txl_tf.layers.init import normal
from txl_tf.layers.masks import attention_visibility, causal_visibility, sees_whole_memory
from txl_tf.layers.memory import (Memory, as_memory, clear_invalid_slots, initial_memory,
                                  update_memory)
from txl_tf.layers.padding import check_lengths, right_align
from txl_tf.layers.positional import RelativePositionalEncoding
from txl_tf.layers.ring_cache import (RING_AXES, CachedToken, DecodeCache, KeysValues, after,
                                      doubled_index, in_slot_order, in_time_order, keep_last,
                                      ring_memory, row_write, slot_order, swap_key_layout,
                                      with_free_slot, write_slots, write_token)


def check_grad_segments(grad_segments, segment_len):
    """`grad_segments` as an int, or `TxlError` unless it is an integer >= 1
    whose segments of `segment_len` positions an int32 length holds (see
    `TransformerXL.read_documents`)."""
    grad_segments = check_count("grad_segments", grad_segments, low=1)
    if grad_segments * int(segment_len) > MAX_POSITIONS:  # a numpy int32 product wraps
        raise TxlError(f"grad_segments ({grad_segments}) x segment_len ({segment_len}) must "
                       f"be at most {MAX_POSITIONS} positions (2**31 - 1: TensorFlow counts "
                       "them in int32)")
    return grad_segments


# `call`'s arguments after the memory, and those of them that are arrays.
_CALL_ARGS = ("targets", "training", "token_mask")
_CALL_ARRAYS = ("targets", "token_mask")


@keras.saving.register_keras_serializable(package="txl_tf")
@answers_removed_names("TransformerXL")
class TransformerXL(keras.layers.Layer):
    """Transformer-XL language model as a pure function of ids and memory.

    ```python
    core = TransformerXL(cfg)
    memory = core.initial_memory(batch_size)               # cfg.mem_len empty slots
    log_probs, memory = core(token_ids, memory)            # [B, T, n_token] float32
    nll, memory = core(token_ids, memory, targets=labels)  # [B, T] float32
    ```
    The memory length is whatever the given memory has (0 allowed), so a
    model trained with one `mem_len` evaluates with another. Weights are
    created at construction; variable names follow the paper's TF code.

    Args:
        config: a `TransformerXLConfig`, or a dict of its fields.
        **kwargs: Keras layer arguments (`name`, `dtype`, ...).
    """

    def __init__(self, config, **kwargs):
        # Inputs are cast by the core itself: Keras autocasting would turn the
        # float32 memory into the compute dtype under mixed precision.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        cfg = as_config(config)
        if cfg.attn_type in (1, 3) and cfg.max_klen is None:  # its weights' size, kept from here on
            cfg = cfg.replace(max_klen=cfg.learnable_positions)
        self.config = cfg
        if not tf.config.list_physical_devices("GPU"):  # else the weights are the GPU's
            from txl_tf.checks.memory_budget import check_weights
            # Before any is made (n_token=2**31 was TensorFlow's OOM), in the
            # variables' dtype (a bfloat16 model's are half a float32 one's).
            check_weights(cfg, itemsize=tf.as_dtype(self.dtype_policy.variable_dtype).size)
        with keras.name_scope(self.name):  # paths like transformer/layer_0/rel_attn/...
            policy = self.dtype_policy
            self.word_emb = AdaptiveEmbedding(
                cfg.n_token, cfg.d_embed, cfg.d_model, cutoffs=cfg.cutoffs,
                div_val=cfg.div_val, proj_same_dim=cfg.proj_same_dim, init_std=cfg.init_std,
                proj_init_std=cfg.proj_init_std, dtype=policy,
                name="adaptive_embed")
            self.pos_emb = RelativePositionalEncoding(cfg.d_model, clamp_len=cfg.clamp_len,
                                                      dtype=policy, name="pos_emb")
            self.emb_dropout = Dropout(cfg.dropout, dtype=policy)
            self.pos_dropout = Dropout(cfg.dropout, dtype=policy)
            self.out_dropout = Dropout(cfg.dropout, dtype=policy)
            self.blocks = [
                TransformerXLBlock(cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner,
                                   dropout=cfg.dropout, dropatt=cfg.dropatt,
                                   pre_lnorm=cfg.pre_lnorm, init_std=cfg.init_std,
                                   layer_norm_epsilon=cfg.layer_norm_epsilon,
                                   attn_type=cfg.attn_type, dtype=policy,
                                   name=f"layer_{i}")
                for i in range(cfg.n_layer)]
            self.crit = AdaptiveLogSoftmax(
                cfg.n_token, cfg.d_embed, cfg.d_model, cutoffs=cfg.cutoffs, div_val=cfg.div_val,
                tie_weight=cfg.tie_weight, tie_projs=cfg.tie_projs,
                proj_same_dim=cfg.proj_same_dim, init_std=cfg.init_std,
                proj_init_std=cfg.proj_init_std, embedding=self.word_emb, dtype=policy,
                name="adaptive_softmax")
        self.r_w_bias = self.r_r_bias = self.r_emb = self.r_bias = None
        if cfg.attn_type == 1:  # per layer: u, and an embedding and a bias per distance
            heads = (cfg.n_head, cfg.d_head)
            self.r_emb = self.add_weight(name="r_emb", initializer=normal(cfg.init_std),
                                         shape=(cfg.n_layer, cfg.max_klen) + heads)
            self.r_w_bias = self.add_weight(name="r_w_bias", initializer=normal(cfg.init_std),
                                            shape=(cfg.n_layer,) + heads)
            # Zeros, as the paper's `weights_init` (`init_bias`) starts them.
            self.r_bias = self.add_weight(name="r_bias", initializer="zeros",
                                          shape=(cfg.n_layer, cfg.max_klen, cfg.n_head))
        if cfg.attn_type == 3:  # per layer: an embedding per position in the window
            self.r_emb = self.add_weight(name="r_emb", initializer=normal(cfg.init_std),
                                         shape=(cfg.n_layer, cfg.max_klen, cfg.d_model))
        if cfg.attn_type == 0:
            bias_shape = ((cfg.n_layer,) if cfg.untie_r else ()) + (cfg.n_head, cfg.d_head)
            self.r_w_bias = self.add_weight(name="r_w_bias", shape=bias_shape,
                                            initializer=normal(cfg.init_std))
            self.r_r_bias = self.add_weight(name="r_r_bias", shape=bias_shape,
                                            initializer=normal(cfg.init_std))
        for layer in (self.pos_emb, self.emb_dropout, self.pos_dropout, self.out_dropout):
            if not layer.built:  # weightless: nothing builds them before the first call
                layer.build(None)
        self.built = True

    def __call__(self, token_ids, memory, *args, **kwargs):
        # Keras takes only tensors positionally: ids as nested lists, or a
        # memory that is not one, would be its error about keyword arguments.
        if isinstance(token_ids, (list, tuple, str, bytes, numbers.Number)) or \
                (isinstance(token_ids, np.ndarray) and token_ids.dtype == object):
            token_ids = rectangular(token_ids)  # rows of other lengths: an InputError
        # Keras converts numpy arguments before `call` sees them: a mask
        # dropped, TensorFlow's error for durations, dates or objects.
        token_ids = convertible(token_ids)
        args = tuple(convertible(value, name) if name in _CALL_ARRAYS else value
                     for name, value in zip(_CALL_ARGS + (None,) * len(args), args))
        kwargs = {name: convertible(value, name) if name in _CALL_ARRAYS else value
                  for name, value in kwargs.items()}
        return super().__call__(token_ids, as_memory(memory), *args, **kwargs)

    # ----------------------------------------------------------------- memory
    def initial_memory(self, batch_size, mem_len=None, zero_filled=None):
        """A fresh memory.

        Args:
            batch_size: rows, an integer >= 1 (or an int32 scalar tensor in a graph).
            mem_len: slots, an integer >= 0 (default `config.mem_len`).
            zero_filled: a bool: zero states that are attended instead of
                empty slots (default `config.zero_filled_memory`).

        Returns:
            A `Memory` (`mems` float32 `[n_layer, B, M, d_model]`, `mem_mask` bool `[B, M]`).
        """
        cfg = self.config
        zero_filled = (cfg.zero_filled_memory if zero_filled is None
                       else check_flag("zero_filled", zero_filled))
        # In a graph the shape is int32: a larger mem_len wrapped (2**32 + 4 gave 4 slots).
        mem_len = cfg.mem_len if mem_len is None else check_count("mem_len", mem_len,
                                                                   high=MAX_POSITIONS)
        if not tf.is_tensor(batch_size):
            batch_size = check_count("batch_size", batch_size, low=1)
            # A large one in host memory is checked (TensorFlow's OOM was the error);
            # a small one is not (reading the free memory costs more than it is worth).
            if cfg.n_layer * batch_size * mem_len * cfg.d_model > 2 ** 26 and \
                    not tf.config.list_physical_devices("GPU"):  # else the memory is the GPU's
                from txl_tf.checks.memory_budget import check_memory_state
                check_memory_state(cfg.n_layer, cfg.d_model, batch_size, mem_len)
        return initial_memory(cfg.n_layer, batch_size, mem_len, cfg.d_model, zero_filled)

    # ------------------------------------------------------------------- math
    def call(self, token_ids, memory, targets=None, training=None, token_mask=None):
        """Reads a segment on `memory` (call the layer: `core(ids, memory)`).

        Args:
            token_ids: int `[B, T]`, each in `[0, n_token)`.
            memory: a `Memory` of `B` rows (any number of slots).
            targets: None, or int `[B, T]`: the next ids, to score.
            training: Keras's flag (dropout on when True).
            token_mask: as in `hidden_states`.

        Returns:
            `(log_probs, new_memory)`: float32 `[B, T, n_token]` log-probs,
            or with `targets` each target's negative log-likelihood float32
            `[B, T]`; the new `Memory`.
        """
        if targets is not None:
            targets = check_targets(dense(targets, "targets"), dense(token_ids),
                                    self.config.n_token)
        hidden, new_memory = self.hidden_states(token_ids, memory, training=training,
                                                token_mask=token_mask)
        if targets is None:
            return self.crit(hidden), new_memory
        return self.crit(hidden, targets), new_memory

    def hidden_states(self, token_ids, memory, training=None, token_mask=None, _probe=None,
                      memory_gradient=False, row_lengths=None):
        """Final hidden states (after the output dropout) and the new memory.

        Relative positions depend on distances only, so a row left-padded
        inside a batch computes at its real positions what it computes
        alone.

        Args:
            token_ids: int `[B, T]`.
            memory: a `Memory` of `B` rows.
            training: Keras's flag (dropout on when True).
            token_mask: bool `[B, T]` (None: all True), True at real tokens:
                keys at padded (False) positions are never attended and
                they become invalid slots of the new memory; outputs at
                padded positions are finite but meaningless.
            _probe: internal: `_probe(i, block, *block_args)` sees the
                arguments of each block before it runs (see
                `attention_probabilities`).
            memory_gradient: the new memory keeps its gradient (see
                `read_documents`); by default it carries none.
            row_lengths: int `[B]` for right-padded rows (their real tokens
                first, `token_mask` True there): each row's new memory ends at
                its last real token, not at the segment's end
                (`layers.memory.update_memory`).

        Returns:
            `(hidden, new_memory)`: `[B, T, d_model]` and a `Memory`.
        """
        output, pos_emb, visible, memory, token_mask = self._inputs(token_ids, memory, training,
                                                                    token_mask)
        mems = tf.unstack(tf.cast(memory.mems, output.dtype), self.config.n_layer)
        if self.config.attn_type == 2:  # the first layer's memory at its positions here
            mems[0] = mems[0] + pos_emb[:tf.shape(mems[0])[1]]
        mlen, qlen = tf.shape(mems[0])[1], tf.shape(output)[1]
        klen = mlen + qlen
        layer_inputs = []
        for i, block in enumerate(self.blocks):
            if self.config.attn_type == 3:  # each layer's positions, on its input and memory
                output, mems[i] = self._add_absolute(i, output, mems[i], mlen, qlen)
            layer_inputs.append(output)
            positions, u, v = self._positions(i, pos_emb, klen)
            if _probe is not None:
                _probe(i, block, output, positions, mems[i], visible, u, v)
            output = block(output, positions, mems[i], visible, u, v, training=training)
        output = self.out_dropout(output, training=training)
        return output, update_memory(_float32(memory), tf.stack(layer_inputs), token_mask,
                                     keep_gradient=memory_gradient, row_lengths=row_lengths)

    def read_documents(self, token_ids, lengths, segment_len, mem_len, training=None,
                       grad_segments=1):
        """Final hidden state at the last token of each document.

        Rows are right-aligned (`layers.padding.right_align`) and read
        segment by segment, left to right, with a memory of `mem_len` slots
        that starts empty; padding is masked (`hidden_states`' `token_mask`),
        so a document's result does not depend on the rest of the batch.
        Gradients flow through the last `grad_segments` segments: before
        them the memory is cut from the graph (as in the paper's training)
        and the earlier segments run in a `tf.while_loop` that is never
        differentiated; inside them the memory keeps its gradient, so the
        loss reaches what the weights did with up to `grad_segments - 1`
        earlier segments (the activations of those segments are kept for the
        backward pass: memory grows with `grad_segments`).

        Args:
            token_ids: int `[B, L]`; row b's document is
                `token_ids[b, :lengths[b]]`.
            lengths: int `[B]`, each in `[1, L]`.
            segment_len: positions read per segment, >= 1.
            mem_len: memory slots, >= 0.
            training: Keras's flag (dropout on when True).
            grad_segments: the last segments gradients flow through, >= 1.

        Returns:
            `[B, d_model]`.
        """
        cfg = self.config
        segment_len = check_count("segment_len", segment_len, low=1)
        mem_len = check_count("mem_len", mem_len)
        grad_segments = check_grad_segments(grad_segments, segment_len)
        token_ids = check_token_ids(dense(token_ids), cfg.n_token)
        lengths = check_lengths(dense(lengths, "lengths"), token_ids)
        ids, mask = right_align(token_ids, lengths, segment_len)
        if not mem_len:  # without memory the earlier segments change nothing
            grad_segments = 1
        if grad_segments > 1:  # at least that many segments: fully padded ones in front
            missing = tf.maximum(grad_segments * segment_len - tf.shape(ids)[1], 0)
            ids = tf.pad(ids, [[0, 0], [missing, 0]])
            mask = tf.pad(mask, [[0, 0], [missing, 0]])
        batch = tf.shape(ids)[0]
        n_seg = tf.shape(ids)[1] // segment_len
        memory = initial_memory(cfg.n_layer, batch, mem_len, cfg.d_model)

        def segment(i):
            begin, size = tf.stack([0, i * segment_len]), tf.stack([batch, segment_len])
            return tf.slice(ids, begin, size), tf.slice(mask, begin, size)

        if mem_len:
            def read(i, mems, mem_mask):
                seg_ids, seg_mask = segment(i)
                _, new = self.hidden_states(seg_ids, Memory(mems, mem_mask), training,
                                            token_mask=seg_mask)
                return i + 1, new.mems, new.mem_mask

            _, mems, mem_mask = tf.while_loop(lambda i, *_: i < n_seg - grad_segments, read,
                                              (tf.constant(0), *memory))
            memory = Memory(tf.stop_gradient(mems), tf.stop_gradient(mem_mask))
        for k in range(grad_segments - 1, 0, -1):  # differentiated, memory included
            seg_ids, seg_mask = segment(n_seg - 1 - k)
            _, memory = self.hidden_states(seg_ids, memory, training, token_mask=seg_mask,
                                           memory_gradient=True)
        seg_ids, seg_mask = segment(n_seg - 1)
        hidden, _ = self.hidden_states(seg_ids, memory, training, token_mask=seg_mask)
        return hidden[:, -1]

    def attention_probabilities(self, token_ids, memory, layer):
        """One layer's attention for one segment, by the layer's own math, in
        inference (no dropout). Keys are the M memory slots then the T
        segment positions; hidden keys (future, invalid slots) get exactly 0
        and each row sums to 1.

        Args:
            token_ids: int `[B, T]`.
            memory: a `Memory` of `B` rows and M slots.
            layer: an int in `[0, n_layer)`.

        Returns:
            `(probs, new_memory)`: float32 `[B, n_head, T, M + T]`, and the
            `Memory` `call` returns.
        """
        n_layer = self.config.n_layer
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) \
                or not 0 <= layer < n_layer:
            raise TxlError(f"layer must be an integer in [0, {n_layer}), got {layer!r}")
        found = []

        def probe(i, block, *block_args):
            if i == layer:
                found.append(block.rel_attn.probabilities(*block_args))
        _, new_memory = self.hidden_states(token_ids, memory, training=False, _probe=probe)
        return found[0], new_memory

    # ---------------------------------------------------------------- decoding
    def decode_cache(self, memory, filled=None):
        """The decode cache of a memory, for `call_with_cache`: every layer's
        memory keys and values are computed here once, so a step projects
        only its new token.

        Args:
            memory: a `Memory` (any M >= 0).
            filled: a Python int, when no slot older than the last `filled`
                of the memory is valid (a new prompt's memory): keys and
                values are then projected for those slots alone, zeros
                elsewhere (they are never attended). The caller guarantees
                it; None projects every slot.

        Returns:
            A `layers.ring_cache.DecodeCache` of M + 1 slots (one free).
        """
        self._check_cacheable()
        cfg = self.config
        memory = as_memory(memory)
        memory = Memory(tf.convert_to_tensor(memory.mems), tf.convert_to_tensor(memory.mem_mask))
        check_memory(memory, cfg.n_layer, cfg.d_model)
        memory = _float32(clear_invalid_slots(memory))
        size = tf.shape(memory.mem_mask)[1] + 1
        pos_emb = self.pos_emb(size)  # distances M, ..., 0
        mems = tuple(with_free_slot(m, 1) for m in tf.unstack(memory.mems))
        empty = _empty_slots(memory.mem_mask, filled)
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            # The free slot's key and value are overwritten before any use.
            k, v = block.memory_keys_values(mems[i][:, empty:])
            pad = [[0, 0], [0, 0], [empty, 0], [0, 0]]
            keys.append(swap_key_layout(tf.pad(k, pad) if empty else k))
            values.append(tf.pad(v, pad) if empty else v)
        batch = tf.shape(memory.mem_mask)[0]
        slot = size - 1
        return DecodeCache(mems, tuple(keys), tuple(values), with_free_slot(memory.mem_mask, 1),
                           slot, tf.fill([batch], slot), tf.tile(pos_emb, [2, 1]))

    def decode_position_keys(self, cache):
        """Each layer's position keys of the cache's encodings by distance
        (`distance_keys`): a decoding loop makes them once, before the loop,
        as the cache's `position_keys` (`cache._replace(position_keys=...)`):
        each step's position scores are then its queries against them, where
        without them each layer takes its queries through `r` to `d_model`
        and scores them against the shared encodings (`d_model / d_head`
        times the work). With `clamp_len` below the cache's distances, only
        the `clamp_len + 1` distinct ones get keys: every farther slot
        shares the clamp's (the paper's `enwik8_base` evaluation: 821 of
        2,101).

        Args:
            cache: a `layers.ring_cache.DecodeCache` of S slots.

        Returns:
            A tuple of `n_layer` float `[H, d_head, S]` (`[H, d_head,
            clamp_len + 1]` when that is fewer).
        """
        size = tf.shape(_check_decode_cache(cache, "decode_position_keys").valid)[1]
        distinct = self._distinct_distances(size)
        encodings = cache.positions[size - distinct:size]  # distances distinct - 1, ..., 0
        return tuple(block.rel_attn.distance_keys(encodings) for block in self.blocks)

    def _distinct_distances(self, size):
        """How many of a cache's `size` distances have encodings of their own."""
        clamp = self.config.clamp_len
        return size if clamp <= 0 else tf.minimum(size, clamp + 1)

    def call_with_cache(self, token_ids, cache, *, stopped=None, write=True,
                        flags_written=False, **removed):
        """Reads ids on top of a decode cache (`decode_cache`), in inference:
        what `hidden_states` gives on `cache_memory(cache)`, with the memory's
        keys and values taken from the cache (only the new positions are
        projected). The one cached read of the core: the `Decoder`, keras-hub's
        `TransformerXLCausalLM`, the exports' decode graphs and the Triton
        cached model read through it.

        Args:
            token_ids: int `[B]`, one id per row, read on the ring: the token
                goes into the free slot in place (under XLA); or `[B, T]`, a
                segment per row (a conversation's next turn): the new cache
                holds its memory in time order, each row's free slot last (a
                segment copies the rings).
            cache: a `layers.ring_cache.DecodeCache`; a decoding loop sets its
                `position_keys` once (`decode_position_keys`). Or a
                `layers.ring_cache.KeysValues` (a memory held as its keys and
                values alone, the Triton cached model's state), read by
                segments `[B, T]`: the new one holds the last M positions.
            stopped: one id per row only: bool `[B]`, rows that keep their
                cache as it is (their `hidden` is meaningless); a row that has
                stopped must stay stopped for the cache's life.
            write: one id per row only: False reads without writing (the
                slot's entries in `cache` are not read) and returns, in place
                of the new cache, a `CachedToken` of what the free slot gets
                (an exported step returns it for the host to write). "first"
                writes each layer's key and value into its rings before it
                reads them there, each row at its slot of
                `ring_cache.write_slots` (a stopped row at its own free slot,
                outside its memory), and returns a `CachedToken` of the
                token's layer inputs and the written rings (an exported step
                that writes its rings in place).
            flags_written: with write="first" only: True where the caller
                has written `cache.valid` for this token first (each live
                row's slot True, as `export.decode_interface.decode_token`
                does): the step reads the flags as they are (two kernels
                less an exported step); False (the default) shows each row
                the ring's free slot whatever its flag.
            **removed: none taken: `position_keys=` (removed; the cache holds
                them) raises a TypeError naming what replaces it.

        Returns:
            `(hidden [B, d_model] or [B, T, d_model], new cache)`, or
            `(hidden, CachedToken)` with `write=False` or "first".
        """
        check_no_removed_keywords("TransformerXL.call_with_cache", removed)
        self._check_cacheable()
        write_first = isinstance(write, str) and write == "first"
        if not write_first and isinstance(write, str):
            raise TxlError(f"write must be a boolean or 'first', got {write!r}")
        write = write_first or check_flag("write", write)
        if check_flag("flags_written", flags_written) and not write_first:
            raise TxlError("flags_written is for write='first'")
        if isinstance(cache, KeysValues):
            if stopped is not None or not write or write_first:
                raise TxlError("stopped and write=False or 'first' are for a DecodeCache; a "
                               "KeysValues memory reads segments")
            return self._read_on_keys(token_ids, cache)
        _check_decode_cache(cache, "call_with_cache")
        token_ids = dense(token_ids)
        _check_cache_batch(token_ids, stopped, cache.valid)
        if token_ids.shape.rank == 2:
            if stopped is not None or not write or write_first:
                raise TxlError("stopped and write=False or 'first' are for one id per row "
                               "(token_ids [B]); a segment [B, T] writes its cache")
            return self._read_segment(token_ids, cache)
        if write_first:
            return self._read_token(token_ids, cache, write_slots(cache, stopped),
                                    flags_written)
        output, token = self._read_token(token_ids, cache)
        if not write:
            return output, token
        return output, self._write_token(output, token, cache, stopped)

    def _read_token(self, token_ids, cache, slots=None, flags_written=False):
        """One id per row (`[B]`) on the ring: `(hidden, CachedToken)`, read
        only; with `slots` (int32 `[B]`), each layer's key and value written
        into its rings there first, the rings returned in the token's place
        (`flags_written`: see `call_with_cache`)."""
        cfg = self.config
        # Expand and squeeze, not [:, None] and [:, 0]: tf2onnx makes those
        # slices, kernels of their own in the exported step.
        token_ids = tf.squeeze(check_token_ids(tf.expand_dims(token_ids, 1), cfg.n_token), 1)
        slot, size = cache.slot, tf.shape(cache.valid)[1]
        at_slot = tf.equal(tf.range(size), slot)
        # Each slot's row in tables of the time indices written twice over:
        # one index for the visibility and the positions, without a mod.
        index = doubled_index(slot, size)
        # Each row sees its own slot: its flag as the caller wrote it
        # (`flags_written`), else the free slot (where its key goes or stands in).
        visible = cache.valid if flags_written else cache.valid | at_slot  # [B, S]
        if not sees_whole_memory(cfg.same_length, cfg.same_length_convention):
            # Which distances a query may look back to (`same_length`), per slot.
            reach = causal_visibility(1, size - 1, cfg.same_length, cfg.same_length_convention)
            visible &= tf.gather(tf.tile(reach[0], [2]), index)
        if not cache.position_keys:
            positions = [in_slot_order(cache.positions, index)] * len(self.blocks)
        else:
            # Each slot's index among the keys: its time index less the
            # clamped distances' (those all take the first key, the clamp's).
            order = tf.maximum(slot_order(slot, size) - (size - self._distinct_distances(size)),
                               0)
            positions = [(layer_keys, order) for layer_keys in cache.position_keys]
        write = None
        if slots is not None:  # where each layer's key (as a column) and value go
            update = [None, cfg.n_head, cfg.d_head]
            write = (row_write(update, slots, RING_AXES["keys"]),
                     row_write(update, slots, RING_AXES["values"]))
        output = self.word_emb(token_ids)
        mems, keys, values = [], [], []
        for i, block in enumerate(self.blocks):
            mems.append(output)
            output, k, v = block.call_with_cache(output, cache.keys[i], cache.values[i],
                                                 positions[i], visible, *self._biases(i),
                                                 at_slot=at_slot, write=write)
            keys.append(k)
            values.append(v)
        return output, CachedToken(tuple(mems), tuple(keys), tuple(values))

    def _write_token(self, output, token, cache, stopped):
        """The cache with `token` (of `_read_token`) written into its free
        slot (`ring_cache.write_token`), after the step's reads (`after`)."""
        token = CachedToken(*(tuple(after(t, output) for t in part) for part in token))
        return write_token(cache, token, stopped)

    def _read_segment(self, token_ids, cache):
        """A segment per row (`[B, T]`) on the cache: `(hidden, new cache)`."""
        size = tf.shape(cache.valid)[1]

        def newest(old, new):
            """The last M of concat(memory, segment) `[B, H, len, d_head]`, as
            `update_memory` keeps, and the free slot."""
            return with_free_slot(keep_last(tf.concat([old, new], 2), 2, size - 1), 2)

        memory = ring_memory(cache)
        output, pos_emb, visible, memory, _ = self._inputs(token_ids, memory, False, None)
        layer_inputs, keys, values = [], [], []
        for i, block in enumerate(self.blocks):
            layer_inputs.append(output)
            # Keys as rows here: gathers, concatenations and slices along the
            # last axis of the columns cost TensorFlow several times more.
            mem_keys = in_time_order(swap_key_layout(cache.keys[i]), cache, 2)
            mem_values = in_time_order(cache.values[i], cache, 2)
            output, k, v = block.call_with_cache(output, mem_keys, mem_values, pos_emb,
                                                 visible, *self._biases(i))
            keys.append(swap_key_layout(newest(mem_keys, k)))
            values.append(newest(mem_values, v))
        new = update_memory(_float32(memory), tf.stack(layer_inputs))
        batch = tf.shape(new.mem_mask)[0]
        return output, cache._replace(
            mems=tuple(with_free_slot(m, 1) for m in tf.unstack(new.mems, self.config.n_layer)),
            keys=tuple(keys), values=tuple(values), valid=with_free_slot(new.mem_mask, 1),
            slot=size - 1, row_slot=tf.fill([batch], size - 1))

    def _read_on_keys(self, token_ids, cache):
        """A segment (`token_ids [B, T]`) on a `KeysValues` memory: `(hidden
        [B, T, d_model], the KeysValues of the memory it leaves)` (the last M
        positions)."""
        keys, values, mem_mask = cache
        cfg = self.config
        token_ids = check_token_ids(dense(token_ids), cfg.n_token)
        mem_mask = tf.convert_to_tensor(mem_mask)
        qlen, mem_len = tf.shape(token_ids)[1], tf.shape(mem_mask)[1]
        output = self.word_emb(token_ids)
        pos_emb = self.pos_emb(mem_len + qlen)
        visible = attention_visibility(qlen, mem_mask, cfg.same_length,
                                       cfg.same_length_convention, None)
        new_keys, new_values = [], []
        for i, block in enumerate(self.blocks):
            output, k, v = block.call_with_cache(output, keys[i], values[i], pos_emb, visible,
                                                 *self._biases(i))
            new_keys.append(keep_last(tf.concat([tf.cast(keys[i], k.dtype), k], 2), 2, mem_len))
            new_values.append(keep_last(tf.concat([tf.cast(values[i], v.dtype), v], 2), 2,
                                        mem_len))
        new_mask = keep_last(tf.concat([mem_mask, tf.ones(tf.shape(token_ids), tf.bool)], 1),
                             1, mem_len)
        return output, KeysValues(tuple(new_keys), tuple(new_values), new_mask)

    def cache_memory(self, cache):
        """The memory a decode cache holds, in time order.

        Args:
            cache: a `DecodeCache`.

        Returns:
            A `Memory`.
        """
        return ring_memory(_check_decode_cache(cache, "cache_memory"))

    # ------------------------------------------------------------- internals
    def _inputs(self, token_ids, memory, training, token_mask):
        """Checks; `(embedded ids, position encodings, visibility, memory with
        invalid slots cleared, token_mask)`."""
        cfg = self.config
        token_ids = check_token_ids(dense(token_ids), cfg.n_token)
        if token_mask is not None:
            token_mask = check_token_mask(dense(token_mask, "token_mask"), token_ids)
        memory = as_memory(memory)
        memory = Memory(tf.convert_to_tensor(memory.mems),
                        tf.convert_to_tensor(memory.mem_mask))
        check_memory(memory, cfg.n_layer, cfg.d_model, token_ids.shape[0])
        memory = clear_invalid_slots(memory)  # garbage in invalid slots changes nothing
        qlen = tf.shape(token_ids)[1]
        klen = tf.shape(memory.mems)[2] + qlen
        if cfg.attn_type in (1, 3):  # positions enter each layer (`_positions`, `_add_absolute`)
            output, pos_emb = self.emb_dropout(self.word_emb(token_ids), training=training), None
        elif cfg.attn_type == 2:  # the absolute sinusoid added to the ids' embeddings
            pos_emb = self.pos_emb(klen)
            output = self.emb_dropout(self.word_emb(token_ids) + pos_emb[klen - qlen:],
                                      training=training)
        else:
            output = self.emb_dropout(self.word_emb(token_ids), training=training)
            pos_emb = self.pos_dropout(self.pos_emb(klen), training=training)
        visible = attention_visibility(qlen, memory.mem_mask, cfg.same_length,
                                       cfg.same_length_convention, token_mask)
        return output, pos_emb, visible, memory, token_mask

    def _positions(self, i, pos_emb, klen):
        """Layer i's `(positions, u, v)` for its attention: the encodings
        and biases of `attn_type` 0, the encodings alone for 2 (unused), and
        for 1 its embeddings `[klen, H, d_head]`, u and biases `[klen, H]`
        by key: the last `klen` of its `max_klen` (of the last `clamp_len`,
        with a clamp), the farthest repeated where `klen` is longer."""
        cfg = self.config
        if cfg.attn_type == 0:
            return (pos_emb, *self._biases(i))
        if cfg.attn_type in (2, 3):
            return pos_emb, None, None
        size = cfg.max_klen if cfg.clamp_len <= 0 else min(cfg.clamp_len, cfg.max_klen)
        rows = (cfg.max_klen - size) + tf.maximum(size - klen + tf.range(klen), 0)
        return (tf.gather(self.r_emb[i], rows), self.r_w_bias[i],
                tf.gather(self.r_bias[i], rows))

    def _add_absolute(self, i, output, mems, mlen, qlen):
        """attn_type 3: layer i's embeddings of the window's positions, the
        last `qlen` of its `max_klen` added to `output` and the `mlen` before
        them to `mems` (a copy; the first repeated where the window is
        longer), as the paper's code adds them."""
        size = self.config.max_klen
        embeddings = tf.cast(self.r_emb[i], output.dtype)
        rows = tf.maximum(size - qlen - mlen + tf.range(mlen + qlen), 0)
        window = tf.gather(embeddings, rows)
        return output + window[mlen:], mems + window[:mlen]

    def _check_cacheable(self):
        """The decode cache holds `attn_type` 0's keys and position keys."""
        kind = self.config.attn_type
        if kind == 2:
            raise TxlError(
                "attn_type 2 adds the first layer's memory positions anew at every read, so a "
                "decode cache (generate, Decoder, the decode exports) cannot hold its keys: "
                "score and read it with the core's call")
        if kind != 0:
            raise TxlError(
                f"attn_type {kind} reads without a decode cache (generate, Decoder, the decode "
                "exports serve attn_type 0): score and read it with the core's call")

    def _biases(self, i):
        """Layer i's `(r_w_bias, r_r_bias)` (shared by all layers unless `untie_r`;
        None for `attn_type` 2)."""
        if self.config.untie_r and self.r_w_bias is not None:
            return self.r_w_bias[i], self.r_r_bias[i]
        return self.r_w_bias, self.r_r_bias

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _float32(memory):
    """The memory carried on is float32 whatever was given (float16/64)."""
    return Memory(tf.cast(memory.mems, tf.float32), memory.mem_mask)


def _empty_slots(mem_mask, filled):
    """How many of the oldest slots `decode_cache` may skip: M - `filled`
    when both are known statically, else 0."""
    if filled is None:
        return 0
    if isinstance(filled, bool) or not isinstance(filled, int) or filled < 0:
        raise TxlError(f"filled must be an int >= 0 or None, got {filled!r}")
    size = mem_mask.shape[1]
    return 0 if size is None else max(0, size - filled)


def _check_decode_cache(cache, method):
    """`cache`, or `TxlError` unless it is a `DecodeCache`."""
    if not isinstance(cache, DecodeCache):
        raise TxlError(f"{method} takes a DecodeCache (TransformerXL.decode_cache(memory)), "
                       f"got {type(cache).__name__}")
    return cache


def _check_cache_batch(token_ids, stopped, valid):
    """`InputError` unless `token_ids` is `[B]` or `[B, T]` and `stopped`
    bool `[B]`, B the cache's batch (static shapes: nothing in the graph)."""
    rank = token_ids.shape.rank
    if rank is not None and rank not in (1, 2):
        raise InputError(f"token_ids must be [batch] (one id per row) or [batch, length] "
                         f"(a segment), got shape {token_ids.shape}")
    batch = valid.shape[0]
    if rank is not None and None not in (batch, token_ids.shape[0]) \
            and token_ids.shape[0] != batch:
        raise InputError(f"token_ids have batch {token_ids.shape[0]} but the cache has batch "
                         f"{batch}")
    if stopped is None:
        return
    stopped = dense(stopped, "stopped")
    if stopped.dtype != tf.bool or not stopped.shape.is_compatible_with([batch]):
        raise InputError(f"stopped must be bool [batch] ({batch}), got {stopped.dtype.name} "
                         f"of shape {stopped.shape}")
