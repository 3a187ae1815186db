"""`TransformerXLCausalLM`: keras-hub's causal LM task over the core, whose
`generate` continues prompts with Transformer-XL's memory (the decode cache)
and takes every keras-hub sampler."""

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from txl_tf.checks.inputs import (InputError, NumpyInputsChecked, check_int32_ids,
                                  check_numpy, out_of_range_message)
from txl_tf.checks.numpy_checks import as_array, check_count, flags_message, is_real
from txl_tf.errors import TxlError
from txl_tf.generation.nan_rows import NonFiniteLogProbsError
from txl_tf.generation.sampling import usable_rows
from txl_tf.keras_support.compile_mixin import XlaOnOneDevice
from txl_tf.keras_support.keras_compat import StepsOnStrategyDevice
from txl_tf.keras_support.keras_hub_samplers import final_loop_vars, sampler_logits
from txl_tf.keras_support.untracked import Untracked
from txl_tf.layers.padding import right_align
from txl_tf.layers.ring_cache import DecodeCache
from txl_tf.models.transformer_xl import presets
from txl_tf.models.transformer_xl.stream_training import StreamTraining
from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
    TransformerXLCausalLMPreprocessor)
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer
from txl_tf.weights import model_dir

_RING = ("mems", "keys", "values", "valid", "row_slot")


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLCausalLM(NumpyInputsChecked, XlaOnOneDevice, StepsOnStrategyDevice,
                            StreamTraining, keras_hub.models.CausalLM):
    """A Transformer-XL language model with keras-hub's `CausalLM` contract.

    Calling it on `{"token_ids", "padding_mask"}` gives log-probabilities
    `[B, T, n_token]` of each row read from an empty memory (keras-hub's
    `from_logits=True` loss is then the NLL exactly); `fit` / `evaluate` /
    `predict` on stream batches (`document_dataset`) carry each row's memory
    from batch to batch, cleared where its next document starts. `generate` reads each
    prompt the way `txl_tf.Decoder` does (in segments of `segment_len`,
    aligned on the prompt's end, into a memory of `mem_len` slots), then
    decodes one token at a time on the decode cache (a ring of `mem_len +
    1` slots per layer: older tokens fall out of the memory, as in the
    paper's evaluation), with the sampler given to `compile` (`greedy`,
    `top_k`, `top_p`, `random`, `beam`, `contrastive`).

    Args:
        backbone: a `TransformerXLBackbone`.
        preprocessor: a `TransformerXLCausalLMPreprocessor` or None (then
            `generate` takes `{"token_ids", "padding_mask"}`, right-padded).
        mem_len: memory length `generate` reads with (default the config's).
        segment_len: prompt positions read per step of the prompt (default
            the config's `tgt_len`).

    ```python
    causal_lm = TransformerXLCausalLM.from_preset("path/to/model_dir")
    causal_lm.compile(sampler="greedy")
    causal_lm.generate("import os", max_length=64)
    ```
    Each row of a batch generates what it would alone, up to `max_length`
    ids in all (prompt included). Rows read together share the memory's
    geometry: where a converted model starts from a zero-filled memory
    (`zero_filled_memory`), a row shorter than the batch's longest prompt
    has padding, not zeros, in front of it.
    """

    int32_ids = True  # a functional model: Keras casts the ids to its int32 input

    backbone_cls = TransformerXLBackbone
    preprocessor_cls = TransformerXLCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, mem_len=None, segment_len=None, **kwargs):
        unknown = sorted(set(kwargs) - {"name", "trainable", "dtype", "compile"})
        if unknown:  # Keras's functional model would drop them silently
            raise TxlError(f"{type(self).__name__} got unknown arguments {unknown}")
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs = backbone.input
        log_probs = backbone.transformer.crit(backbone(inputs))
        super().__init__(inputs=inputs, outputs=log_probs, **kwargs)
        cfg = backbone.config
        self.mem_len = check_count("mem_len", cfg.mem_len if mem_len is None else mem_len)
        self.segment_len = check_count(
            "segment_len", cfg.tgt_len if segment_len is None else segment_len, low=1)
        self._init_streams()
        self._checked_vocabulary = Untracked(None)
        self.check_vocabulary()

    def check_vocabulary(self):
        """Refuses a preprocessor whose tokenizer is not the model's
        vocabulary (`n_token` entries; the config's `vocab_fingerprint` where
        it records one): keras-hub's `from_preset` and `.keras` files load the
        tokenizer's files after the model, and one swapped there would give
        other ids. `generate`, `fit`, `evaluate`, `predict` and
        `document_dataset` check again, once per tokenizer.

        Raises:
            ModelDirError: the tokenizer is of another size or vocabulary.
        """
        inner = getattr(getattr(self.preprocessor, "tokenizer", None), "inner", None)
        if inner is not None and inner is not self._checked_vocabulary.value:
            model_dir.check_vocab(inner, self.core.config, "the preprocessor's tokenizer")
            self._checked_vocabulary = Untracked(inner)

    @property
    def core(self):
        """The backbone's `TransformerXL`."""
        return self.backbone.transformer

    def save_to_preset(self, preset_dir, **kwargs):
        """Saves a keras-hub preset folder (keras-hub's `save_to_preset`),
        its config recording the fingerprint of the preprocessor's
        vocabulary, as `save_pretrained` records it: loading the preset
        then refuses other tokenizer files of the same size. Written through
        a temporary folder, `config.json` last (`presets.save_staged`).
        The save holds one extra copy of the weights file in memory
        (`wt103_large`: about 1.05 GiB); a sharded save (`max_shard_size`)
        writes its shards straight to disk.

        Args:
            preset_dir: the folder.
            **kwargs: keras-hub's (`max_shard_size`).
        """
        def save(folder):
            return super(TransformerXLCausalLM, self).save_to_preset(folder, **kwargs)

        inner = getattr(getattr(self.preprocessor, "tokenizer", None), "inner", None)
        if inner is None:
            return presets.save_staged(save, preset_dir)
        self.check_vocabulary()  # a recorded fingerprint is the tokenizer's
        core, config = self.core, self.core.config
        core.config = config.replace(vocab_fingerprint=inner.fingerprint())
        try:  # the model itself is left as it was
            return presets.save_staged(save, preset_dir)
        finally:
            core.config = config

    # --------------------------------------------------------------- presets
    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """A causal LM from a keras-hub preset folder, a model directory of
        this library (its vocabulary becomes the preprocessor), or one of
        the paper's named configurations (`load_weights=False`).

        Args:
            preset: a name in `txl_tf.PRESETS`, a model directory or a
                keras-hub preset folder (`save_to_preset`).
            load_weights: False builds the architecture with random weights.
            **kwargs: `sequence_length` (the preprocessor's, default the
                config's `tgt_len`), `mem_len`, `segment_len`, `dtype`, ...

        Returns:
            A `TransformerXLCausalLM`.
        """
        found = presets.local_source(preset, load_weights)
        if found is None:
            sequence_length = kwargs.pop("sequence_length", None)
            with presets.keras_hub_errors(preset):
                model = super().from_preset(preset, load_weights=load_weights,
                                            **presets.keras_hub_dtype(preset, kwargs))
            if sequence_length is not None and model.preprocessor is not None:
                model.preprocessor.sequence_length = sequence_length
            model.check_vocabulary()
            return model
        sequence_length = kwargs.pop("sequence_length", found.config.tgt_len)
        dtype = {"dtype": kwargs.pop("dtype")} if "dtype" in kwargs else {}
        backbone = presets.backbone_from(TransformerXLBackbone, found, **dtype)
        tokenizer = presets.tokenizer_of(found)
        preprocessor = kwargs.pop("preprocessor", None)
        if preprocessor is None and tokenizer is not None:
            preprocessor = TransformerXLCausalLMPreprocessor(
                TransformerXLTokenizer(tokenizer), sequence_length=sequence_length)
        return cls(backbone, preprocessor=preprocessor, **kwargs)

    # ------------------------------------------------------------ the cache
    def call_with_cache(self, token_ids, cache, cache_update_index=None, position_keys=None):
        """Reads one id per row (`token_ids [B, 1]`) on the decode cache.

        Args:
            token_ids: int `[B, 1]`.
            cache: the dict `_build_cache` makes (each layer's ring of layer
                inputs, keys and values, slot validity, each row's free
                slot; batch first, so beam and contrastive search can copy
                rows).
            cache_update_index: unused: the ring knows its own position.
            position_keys: the cache's `decode_position_keys`, if made once
                for a loop (else each call makes them).

        Returns:
            `(log_probs [B, 1, n_token], hidden [B, 1, d_model], new cache)`.
        """
        del cache_update_index
        token_ids = tf.convert_to_tensor(token_ids)  # numpy ids too
        if token_ids.shape.rank != 2 or token_ids.shape[1] not in (None, 1):
            raise TxlError(f"call_with_cache reads one id per row ([B, 1]), got shape "
                           f"{token_ids.shape}")
        log_probs, hidden, cache = self._step(token_ids[:, 0], cache, position_keys)
        return log_probs[:, None], hidden[:, None], cache

    def _ring(self, cache, position_keys=()):
        """The `DecodeCache` of a keras-hub cache dict (batch first, so
        that samplers can copy rows; the position keys live outside it)."""
        size = tf.shape(cache["valid"])[1]
        positions = tf.tile(self.core.pos_emb(size), [2, 1])
        return DecodeCache(cache["mems"], cache["keys"], cache["values"], cache["valid"],
                           cache["row_slot"][0], cache["row_slot"], positions,
                           tuple(position_keys or ()))

    def _step(self, ids, cache, position_keys=(), output_weights=None):
        hidden, ring = self.core.call_with_cache(ids, self._ring(cache, position_keys))
        log_probs = self.core.crit.log_probs(hidden, output_weights)
        new = {name: getattr(ring, name) for name in _RING}
        return log_probs, hidden, {**new, "log_probs": log_probs, "hidden": hidden}

    def _build_cache(self, token_ids, padding_mask):
        """Reads each row's prompt (the `padding_mask` True positions of
        `token_ids [B, N]`, right-padded) into a memory, the way `Decoder`
        does; returns `(hidden [B, N, d_model], cache)`: the hidden states
        of each row's prompt aligned on its end (zeros in front), and the
        decode cache, holding the log-probs after each prompt."""
        core = self.core
        width = token_ids.shape[1]
        if width is None:
            raise TxlError("generate needs prompts of a static width (max_length)")
        lengths = tf.reduce_sum(tf.cast(padding_mask, tf.int32), 1)
        # Segments aligned on the prompts' end (`Decoder`'s cut): the short
        # one first, left-padded to a whole segment (padding is masked, so
        # it is what reading the short one is), then one loop over them.
        seg = self.segment_len
        ids, mask = right_align(tf.cast(token_ids, tf.int32), lengths, seg, width=width)
        pad = ids.shape[1] - width
        batch = tf.shape(ids)[0]
        count = ids.shape[1] // seg
        states = tf.TensorArray(core.compute_dtype, size=count, element_shape=[None, seg, None])

        # On a zero-filled memory (attended zero states) the padding must
        # not move them: `_read_on_zeros`. On an empty one it changes nothing.
        zero_filled = core.config.zero_filled_memory and self.mem_len > 0

        def read(i, memory, states):
            begin, size = tf.stack([0, i * seg]), tf.stack([batch, seg])
            if zero_filled:
                hidden, memory = self._read_on_zeros(tf.slice(ids, begin, size),
                                                     tf.slice(mask, begin, size), memory)
            else:
                hidden, memory = core.hidden_states(tf.slice(ids, begin, size), memory,
                                                    training=False,
                                                    token_mask=tf.slice(mask, begin, size))
            return i + 1, memory, states.write(i, hidden)

        memory = core.initial_memory(batch, mem_len=self.mem_len)
        _, memory, states = tf.while_loop(lambda i, *_: i < count, read,
                                          (tf.constant(0), memory, states))
        hidden = tf.reshape(tf.transpose(states.stack(), [1, 0, 2, 3]),
                            [batch, count * seg, core.config.d_model])[:, pad:]
        mask = mask[:, pad:]
        ring = core.decode_cache(memory)
        last = hidden[:, -1]
        cache = {**{name: getattr(ring, name) for name in _RING},
                 "log_probs": core.crit.log_probs(last), "hidden": last}
        return tf.where(mask[:, :, None], hidden, tf.zeros_like(hidden)), cache

    def _read_on_zeros(self, ids, mask, memory):
        """A segment (`ids`, `mask` `[B, seg]`, left-padded) read on a memory
        that started zero-filled, as each row reads it alone: left padding
        would sit between the zero states and the ids (moving the attended
        zeros farther back), and a segment of padding alone would push them
        out. The ids are read right-padded (padding after them is never
        attended), each row's new memory ending at its last id (the core's
        `row_lengths`).

        Returns:
            `(hidden [B, seg, d_model] aligned as ids, memory)`.
        """
        seg = ids.shape[1]
        real = tf.reduce_sum(tf.cast(mask, tf.int32), 1)
        pad = seg - real
        columns = tf.range(seg)[None, :]
        right_mask = columns < real[:, None]
        right_ids = tf.gather(ids, tf.minimum(columns + pad[:, None], seg - 1), batch_dims=1)
        right_ids = tf.where(right_mask, right_ids, tf.zeros_like(right_ids))
        hidden, memory = self.core.hidden_states(right_ids, memory, training=False,
                                                 token_mask=right_mask, row_lengths=real)
        hidden = tf.gather(hidden, tf.maximum(columns - pad[:, None], 0), batch_dims=1)
        return hidden, memory

    # --------------------------------------------------------------- streams
    def call(self, inputs, training=None, mask=None):
        """Reads a batch.

        Args:
            inputs: keras-hub's `{"token_ids", "padding_mask"}` `[B, T]`,
                read from an empty memory; or stream batches (a
                `"document_start"` key too, bool `[B]`), which continue the
                memory of the batch before, each row cleared where its
                document starts (see `document_dataset`).
            training: Keras's flag (dropout on when True).
            mask: Keras's.

        Returns:
            Log-probs `[B, T, n_token]`.
        """
        if isinstance(inputs, dict) and "document_start" in inputs:
            return self._read_streams(inputs, self._call_memory(training), training=training)
        return super().call(inputs, training=training, mask=mask)

    # ------------------------------------------------------------ generation
    def generate_step(self, inputs, stop_token_ids=None):
        """keras-hub's compiled generation of one batch.

        Args:
            inputs: `{"token_ids", "padding_mask"}` `[B, N]`, right-padded.
            stop_token_ids: None, or ids that end a row.

        Returns:
            `{"token_ids", "padding_mask"}` `[B, N]`: each row's prompt
            followed by its new ids (up to N in all), the mask ending after
            a row's first stop id; and `"nan_step"` `[B]`: the new id at
            which a row's log-probs were no distribution (NaN or +inf), -1
            for none (`generate_function` raises for it and drops it).
        """
        token_ids = tf.cast(inputs["token_ids"], tf.int32)
        padding_mask = tf.cast(inputs["padding_mask"], tf.bool)
        width = token_ids.shape[1]
        lengths = tf.reduce_sum(tf.cast(padding_mask, tf.int32), 1)
        start = tf.reduce_min(lengths)
        with tf.control_dependencies([tf.debugging.assert_positive(
                start, message="every prompt needs at least one id")]):
            start = tf.identity(start)
        aligned_hidden, cache = self._build_cache(token_ids, padding_mask)
        ring = self._ring(cache)
        position_keys = self.core.decode_position_keys(ring)
        output_weights = self.core.crit.decode_weights() if token_ids.shape[0] == 1 else None
        columns = tf.range(width)
        # Generation buffer: column start + k holds each row's k-th new id;
        # the columns before `start` are the last `start` prompt positions.
        before = tf.gather(aligned_hidden, tf.math.floormod(columns + width - start, width),
                           axis=1)
        hidden = tf.where((columns < start)[None, :, None], before, tf.zeros_like(before))
        keep = tf.broadcast_to(columns[None, :] < start, tf.shape(token_ids))
        # The kept columns hold prompt ids (never read): a buffer of constant
        # zeros is constant-folded by Grappler into a wrong output at batch 1.
        # The columns to generate hold -1, never a stop id: keras-hub's samplers
        # take a stop id in any column outside `mask` for a row's end (with 0
        # there, stop id 0 ended every row before its first step).
        buffer = tf.where(keep, token_ids, -tf.ones_like(token_ids))

        # Row i keeps the ids of columns [start, start + width - lengths[i]);
        # past them its log-probs are one sure id, so that a beam's score
        # counts only the ids its row keeps (else a row with a longer prompt
        # took the beam best over ids dropped after). A stop id: the loop
        # ends once every row has stopped or filled its columns (not under
        # contrastive search, whose penalty may pick another candidate: the
        # columns past a row's are never read, so only time is lost).
        row_end = start + width - lengths
        sure_id = stop_token_ids[0] if stop_token_ids else 0
        sure = tf.where(tf.range(self.core.config.n_token) == sure_id, 0.0, -1e9)

        def stopped(prompt, index):  # bool [rows of prompt]: a new id before index is a stop id
            new = (columns >= start) & (columns < index)
            ends = tf.zeros_like(prompt, tf.bool)
            for stop in stop_token_ids or ():
                ends |= tf.equal(prompt, stop)
            return tf.reduce_any(ends & new[None, :], -1)

        def next(prompt, cache, index):
            nan_step = cache["nan_step"]
            cache = {name: value for name, value in cache.items() if name != "nan_step"}

            def pending():  # the log-probs after the prompts
                return cache["log_probs"], cache["hidden"], cache

            def step():
                ids = tf.gather(prompt, index - 1, axis=1)
                return self._step(ids, cache, position_keys, output_weights)
            log_probs, hidden, cache = tf.cond(index > start, step, pending)
            # Samplers repeat each row (beams, candidates) next to itself.
            copies = tf.shape(prompt)[0] // tf.shape(row_end)[0]
            dropped = tf.repeat(index >= row_end, copies)
            # A row whose log-probs are no distribution (NaN: a weight that
            # holds NaN, a 16-bit overflow) is marked with the step, carried in
            # the cache (the loop cannot raise), and draws the sure id, not an
            # id a sampler makes of NaN (out of the vocabulary). A row that
            # drew a stop id is not marked: the samplers go on with it until
            # every row has stopped, but its ids after the stop are dropped.
            unusable = ~usable_rows(log_probs)
            broken = unusable & ~dropped & ~stopped(prompt, index)
            nan_step = tf.where((nan_step < 0) & broken, index - start, nan_step)
            log_probs = tf.where((dropped | unusable)[:, None], tf.cast(sure, log_probs.dtype),
                                 log_probs)
            return sampler_logits(log_probs, self.sampler), hidden, {**cache, "nan_step": nan_step}

        cache = {**cache, "nan_step": tf.fill([tf.shape(token_ids)[0]], -1)}
        with final_loop_vars(self.sampler) as final:
            buffer = self.sampler(next=next, prompt=buffer, cache=cache, index=start,
                                  mask=keep, stop_token_ids=stop_token_ids, hidden_states=hidden,
                                  model=self)
        nan_step = final.cache()["nan_step"]
        # Beams and candidates: a row's copies are next to each other.
        nan_step = tf.reduce_max(tf.reshape(nan_step, [tf.shape(token_ids)[0], -1]), -1)
        in_prompt = columns[None, :] < lengths[:, None]
        source = tf.clip_by_value(columns[None, :] - lengths[:, None] + start, 0, width - 1)
        # Columns left at -1 (the loop ended: every row had stopped) come after a stop.
        buffer = tf.maximum(buffer, 0)
        token_ids = tf.where(in_prompt, token_ids, tf.gather(buffer, source, batch_dims=1))
        if stop_token_ids is None:
            padding_mask = tf.ones_like(token_ids, tf.bool)
        else:
            ends = tf.zeros_like(in_prompt)
            for stop in stop_token_ids:
                ends |= tf.equal(token_ids, stop)
            ends = tf.cast(ends & ~in_prompt, tf.int32)
            padding_mask = tf.equal(tf.cumsum(ends, axis=1) - ends, 0)
        return {"token_ids": token_ids, "padding_mask": tf.cast(padding_mask, tf.int32),
                "nan_step": nan_step}

    def make_generate_function(self):
        """`generate_step` compiled with XLA, as `Decoder` does, also on CPUs
        (where `compile`'s "auto" leaves `fit` without XLA). Not without it:
        TensorFlow's graph optimizer (Grappler) turns the uncompiled graph's
        output at batch 1 into an empty tensor (TF 2.21). The function it
        returns checks the prompts first (`InputError`: an empty or
        left-padded prompt, an id outside the vocabulary) and runs it on
        the device of the model's `OneDeviceStrategy` (`StepsOnStrategyDevice`).

        Returns:
            `generate_function(inputs, stop_token_ids=None)`.
        """
        if self.generate_function is None and not self.run_eagerly:
            # Traced as written (its control flow is TensorFlow's own): AutoGraph's
            # rewrite of every function it reaches, keras-hub's sampler loop
            # included, was most of the first call's time.
            self.generate_function = tf.function(self.generate_step, jit_compile=True,
                                                 autograph=False)
        compiled = self._on_strategy_device(super().make_generate_function())

        def generate_function(inputs, stop_token_ids=None):
            # XLA drops generate_step's assertion and the gather's range
            # check: an empty prompt would be continued from the hidden state
            # of padding, an id outside the vocabulary read as another.
            if not isinstance(inputs, dict) or {"token_ids", "padding_mask"} - set(inputs):
                got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
                raise InputError(f"generate without a preprocessor takes {{'token_ids', "
                                 f"'padding_mask'}} [B, N], right-padded; got {got}")
            mask = keras.ops.convert_to_numpy(inputs["padding_mask"])
            problem = flags_message(mask)  # 0.4 or 2 were read as True
            if problem:
                raise InputError(problem)
            mask = mask != 0
            lengths = mask.sum(axis=1)
            if (lengths < 1).any():
                raise InputError(f"generate: every prompt needs at least one id; rows "
                                 f"{np.flatnonzero(lengths < 1).tolist()} are empty")
            holes = (mask[:, 1:] & ~mask[:, :-1]).any(axis=1)  # the prompt is the first ids
            if holes.any():
                raise InputError(f"generate: prompts must be right-padded (padding_mask ones "
                                 f"then zeros); rows {np.flatnonzero(holes).tolist()} are not")
            token_ids = keras.ops.convert_to_numpy(inputs["token_ids"])
            check_int32_ids(token_ids)  # lists and datasets too: 1.5 would be cast to 1
            ids = np.where(mask, token_ids, 0)
            problem = out_of_range_message(ids, self.core.config.n_token)
            if problem:
                raise InputError(f"generate: {problem}")
            outputs = dict(compiled(inputs, stop_token_ids=stop_token_ids))
            nan_step = keras.ops.convert_to_numpy(outputs.pop("nan_step"))
            broken = np.flatnonzero(nan_step >= 0)
            if broken.size:  # after the loop: one [B] read
                raise NonFiniteLogProbsError(broken, nan_step[broken],
                                             dtype=self.core.compute_dtype)
            return outputs
        return generate_function

    def generate(self, inputs, max_length=None, stop_token_ids="auto", strip_prompt=False):
        """keras-hub's `generate` (see `keras_hub.models.CausalLM.generate`).

        Args:
            inputs: prompts: strings with a preprocessor, else
                `{"token_ids", "padding_mask"}` `[B, N]`, right-padded.
            max_length: with a preprocessor, the most ids per row, prompt
                included, in [1, 2**31 - 1] (None: its `sequence_length`).
            stop_token_ids: ids in [0, n_token) that end a row; `"auto"`
                means none: the paper's vocabularies have no end token (a
                word model's `<eos>` ends a line, not the text).
            strip_prompt: return only the new ids or text.

        Returns:
            Texts with a preprocessor, else `{"token_ids", "padding_mask"}`.
        """
        self.core._check_cacheable()  # raised while tracing, it would be a StagingError
        check_numpy(inputs)  # the ids and mask are read by numpy and TensorFlow
        self.check_vocabulary()
        _check_sampler(getattr(self, "sampler", None), self.core.config.n_token)
        if isinstance(inputs, (list, tuple)) and not inputs:
            raise InputError("generate: no prompts (an empty list)")
        if self.preprocessor is not None and isinstance(inputs, dict):
            raise InputError("generate with a preprocessor takes text; for {'token_ids', "
                             "'padding_mask'} ids set `causal_lm.preprocessor = None` first")
        if max_length is not None:
            _check_max_length(max_length, inputs)
        elif isinstance(getattr(self.preprocessor, "sequence_length", None), int):
            _check_max_length(self.preprocessor.sequence_length, inputs,
                              "generate: the preprocessor's sequence_length")
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            tokenizer = getattr(self.preprocessor, "tokenizer", None)
            end = getattr(tokenizer, "end_token_id", None)
            stop_token_ids = None if end is None else "auto"
        elif stop_token_ids is not None:  # none given: None (the samplers index the first)
            stop_token_ids = _stop_ids(stop_token_ids, self.core.config.n_token)
        return super().generate(inputs, max_length=max_length, stop_token_ids=stop_token_ids,
                                strip_prompt=strip_prompt)

    def get_config(self):
        return {**super().get_config(), "mem_len": self.mem_len,
                "segment_len": self.segment_len}

    def get_compile_config(self):
        """Keras's compile config, with the `sampler` `generate` uses (so
        `keras.models.load_model` restores it too)."""
        config = super().get_compile_config()
        if config and getattr(self, "sampler", None) is not None:
            config = {**config, "sampler": keras.saving.serialize_keras_object(self.sampler)}
        return config

    @classmethod
    def from_config(cls, config):
        """keras-hub's `from_config`, which also reads the config of the first
        keras-hub version (19601b1, before 0.3.0): its `jit_generate` chose
        whether `generate` was XLA-compiled, as it always is since (the
        uncompiled graph was wrong at batch 1), so it is dropped.

        Args:
            config: what `get_config` returned.

        Returns:
            The `TransformerXLCausalLM`.
        """
        config = {k: v for k, v in config.items() if k != "jit_generate"}
        return super().from_config(config)


def _stop_ids(stop_token_ids, n_token):
    """`stop_token_ids` as a tuple of ints in [0, n_token), None if empty
    (-1 is the generation buffer's fill: it ended every row at once)."""
    if isinstance(stop_token_ids, np.ndarray):  # masked entries: not dropped silently
        stop_token_ids = as_array(stop_token_ids, "generate: stop_token_ids")
    ids = [] if isinstance(stop_token_ids, str) else \
        np.asarray(stop_token_ids, dtype=object).reshape(-1).tolist()
    if isinstance(stop_token_ids, str) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < n_token
            for i in ids):
        raise InputError(f"generate: stop_token_ids must be None, 'auto' or ids in "
                         f"[0, {n_token}), got {stop_token_ids!r}")
    return tuple(int(i) for i in ids) or None


def _check_sampler(sampler, n_token):
    """Raises an `InputError` for a sampler `generate` cannot run as asked:
    none compiled, or a keras-hub sampler whose setting it would take
    silently (a NaN, zero or negative temperature, `k=0`, a NaN `p`) or
    fail on inside the generate graph (`k` past the vocabulary, no beams)."""
    if sampler is None or isinstance(sampler, str) or not callable(sampler):
        raise InputError(f"generate: compile a sampler first (causal_lm.compile(sampler="
                         f"\"greedy\"), or a keras_hub.samplers.Sampler); got {sampler!r}")

    number = is_real

    def integer(value):
        return is_real(value) and isinstance(value, (int, np.integer))

    def value_of(value):  # a 0-d tensor, variable or array (keras-hub divides by it): its number
        if hasattr(value, "numpy") or isinstance(value, np.ndarray):
            array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
            return array.item() if array.ndim == 0 else value
        return value

    name = type(sampler).__name__
    checks = (("temperature", lambda t: number(t) and 0 < t < float("inf"),
               "a finite number > 0 (sampler=\"greedy\" picks the most likely id)"),
              ("k", lambda k: k is None or (integer(k) and 1 <= k <= n_token),
               f"an integer in [1, {n_token}] (the vocabulary size)"),
              ("p", lambda p: number(p) and 0 < p <= 1, "in (0, 1]"),
              ("num_beams", lambda n: integer(n) and n >= 1, "an integer >= 1"),
              ("alpha", lambda a: number(a) and 0 <= a <= 1, "in [0, 1]"))
    for attribute, ok, rule in checks:
        if hasattr(sampler, attribute) and not ok(value_of(getattr(sampler, attribute))):
            raise InputError(f"generate: the sampler's {attribute} must be {rule}; "
                             f"{name} has {attribute}={getattr(sampler, attribute)!r}")


def _check_max_length(max_length, inputs, what="generate: max_length"):
    """Raises a `TxlError` unless `max_length` (named `what`) is in [1, 2**31 - 1]
    (keras-hub read 0 as its default and a negative one as a slice: `-5` cut
    five ids off the prompt) and the padded prompts (`[B, max_length]` int32
    ids and padding mask) fit in memory."""
    from txl_tf.checks.memory_budget import check_new_ids
    check_count(what, max_length, low=1, high=2 ** 31 - 1)  # an int32 length
    rows = 1 if isinstance(inputs, (str, bytes)) else \
        len(inputs) if isinstance(inputs, (list, tuple)) else None
    if rows:
        check_new_ids(rows, max_length, what=what, holds="the ids and their padding mask",
                      advice="ask for a shorter max_length or fewer prompts")
