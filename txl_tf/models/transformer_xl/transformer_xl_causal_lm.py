"""`TransformerXLCausalLM`: keras-hub's causal LM task over the core, whose
`generate` continues prompts with Transformer-XL's memory (the decode cache)
and takes every keras-hub sampler."""
import keras
import keras_hub
import tensorflow as tf

from txl_tf.checks.inputs import InputError
from txl_tf.errors import TxlError
from txl_tf.keras_support.stream_memory import StreamMemory, checked_batch_size, split_inputs
from txl_tf.keras_support.untracked import Untracked
from txl_tf.layers.padding import right_align
from txl_tf.layers.ring_cache import DecodeCache
from txl_tf.models.transformer_xl import presets
from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
    TransformerXLCausalLMPreprocessor)
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer

_RING = ("mems", "keys", "values", "valid", "row_slot")


@keras.saving.register_keras_serializable(package="txl_tf")
class TransformerXLCausalLM(keras_hub.models.CausalLM):
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

    backbone_cls = TransformerXLBackbone
    preprocessor_cls = TransformerXLCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, mem_len=None, segment_len=None, **kwargs):
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs = backbone.input
        log_probs = backbone.transformer.crit(backbone(inputs))
        super().__init__(inputs=inputs, outputs=log_probs, **kwargs)
        cfg = backbone.config
        self.mem_len = cfg.mem_len if mem_len is None else int(mem_len)
        self.segment_len = cfg.tgt_len if segment_len is None else int(segment_len)
        if self.mem_len < 0 or self.segment_len < 1:
            raise TxlError(f"mem_len must be >= 0 and segment_len >= 1, got {self.mem_len} "
                           f"and {self.segment_len}")
        self._streams = Untracked(None)  # (training, evaluation) StreamMemory, made by fit

    @property
    def core(self):
        """The backbone's `TransformerXL`."""
        return self.backbone.transformer

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
        """
        found = presets.local_source(preset, load_weights)
        if found is None:
            return super().from_preset(preset, load_weights=load_weights, **kwargs)
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
        if token_ids.shape.rank != 2 or token_ids.shape[1] not in (None, 1):
            raise TxlError(f"call_with_cache reads one id per row ([B, 1]), got shape "
                           f"{token_ids.shape}")
        log_probs, hidden, cache = self._step(token_ids[:, 0], cache, position_keys)
        return log_probs[:, None], hidden[:, None], cache

    def _ring(self, cache):
        """The `DecodeCache` of a keras-hub cache dict."""
        size = tf.shape(cache["valid"])[1]
        positions = tf.tile(self.core.pos_emb(size), [2, 1])
        return DecodeCache(cache["mems"], cache["keys"], cache["values"], cache["valid"],
                           cache["row_slot"][0], cache["row_slot"], positions)

    def _step(self, ids, cache, position_keys=None, output_weights=None):
        hidden, ring = self.core.call_with_cache(ids, self._ring(cache),
                                                    position_keys=position_keys)
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

        def read(i, memory, states):
            begin, size = tf.stack([0, i * seg]), tf.stack([batch, seg])
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

    # --------------------------------------------------------------- streams
    def call(self, inputs, training=None, mask=None):
        """Log-probs `[B, T, n_token]`. keras-hub's inputs `{"token_ids",
        "padding_mask"}` are read from an empty memory; stream batches (a
        `"document_start"` key too, bool `[B]`) continue the memory of the
        batch before, each row cleared where its document starts (see
        `document_dataset`)."""
        if isinstance(inputs, dict) and "document_start" in inputs:
            return self._read_streams(inputs, training)
        return super().call(inputs, training=training, mask=mask)

    def _read_streams(self, inputs, training):
        streams = self._streams.value
        if streams is None:
            raise TxlError("stream batches (with 'document_start') are read by fit, evaluate "
                           "and predict, which size the memory; call one of them")
        token_ids, extra = split_inputs(inputs, optional=("document_start", "padding_mask"))
        memory_of = streams[0] if training else streams[1]
        mask = extra["padding_mask"]
        hidden, memory = self.core.hidden_states(
            token_ids, memory_of.read(extra["document_start"]), training=training,
            token_mask=None if mask is None else tf.cast(mask, tf.bool))
        memory_of.write(memory)
        return self.core.crit(hidden)

    def document_dataset(self, documents, batch_size, segment_len=None):
        """Batches for `fit` / `evaluate` that stream `documents` through the
        memory: each of the `batch_size` rows reads documents one after
        another in segments, and a row's memory is cleared where its next
        document starts (the other rows keep theirs).

        Args:
            documents: strings (tokenized with the preprocessor's tokenizer)
                or sequences of ids, each at least 2 ids long.
            batch_size: rows (streams) per batch.
            segment_len: ids per segment (default the config's `tgt_len`).

        Returns:
            A `tf.data.Dataset` of `({"token_ids", "padding_mask",
            "document_start"}, labels, weights)`, one pass in order.
        """
        from txl_tf.data.documents import document_segments
        if any(isinstance(d, (str, bytes)) for d in documents):
            tokenizer = getattr(self.preprocessor, "tokenizer", None)
            if tokenizer is None:
                raise TxlError("documents as text need a preprocessor with a tokenizer; "
                               "give ids, or build the model with a preprocessor")
            documents = [tokenizer.tokenize(d).numpy() if isinstance(d, (str, bytes)) else d
                         for d in documents]
        seg = self.core.config.tgt_len if segment_len is None else int(segment_len)
        token_ids, labels, weights, start = document_segments(documents, batch_size, seg)
        inputs = {"token_ids": token_ids, "padding_mask": (weights > 0).astype("int32"),
                  "document_start": start}
        return tf.data.Dataset.from_tensor_slices((inputs, labels, weights))

    def reset_memory(self):
        """Forgets the streams' history (training and evaluation memory)."""
        for memory in self._streams.value or ():
            memory.clear()

    def _prepare_streams(self, x, batch_size, method, shuffle=False):
        """Sizes the stream memory for `x`'s batches (new, empty memory when
        the size changes); returns the `batch_size` to hand Keras."""
        if isinstance(x, tf.data.Dataset):
            first = tf.nest.flatten(x.element_spec)[0]
            size = first.shape[0] if first.shape.rank else None
            if size is None:
                raise InputError(f"{method}: stream batches need a fixed batch size (batch with "
                                 "drop_remainder=True)")
        elif shuffle:
            raise InputError(f"{method}: shuffle=True would move rows between batches, so each "
                             "row of the memory would continue another stream (shuffle=False)")
        else:
            size = batch_size or 32
        replicas = self.distribute_strategy.num_replicas_in_sync
        fix = (f"stream batches hold {size} rows, split over {replicas} replicas; batch the "
               f"data in {size}s with drop_remainder=True")
        if size % replicas:
            raise InputError(f"{method}: {fix}")
        batch_size = checked_batch_size(x, batch_size, size, method, fix)
        per_replica = size // replicas
        streams = self._streams.value
        if streams is None or streams[0].batch_size != per_replica:
            config, zero_filled = self.core.config, self.core.config.zero_filled_memory
            with self.distribute_strategy.scope():
                self._streams = Untracked(*(
                    StreamMemory(config, per_replica, self.mem_len, zero_filled, prefix)
                    for prefix in ("", "eval_")))
            self.train_function = self.test_function = self.predict_function = None
        return batch_size

    def fit(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `fit`; stream batches (see `document_dataset`) carry
        the memory from batch to batch, in order (never shuffled)."""
        if not _is_stream(x):
            return super().fit(x, y, batch_size=batch_size, **kwargs)
        kwargs["shuffle"] = kwargs.get("shuffle", False)
        batch_size = self._prepare_streams(x, batch_size, "fit", kwargs["shuffle"])
        return keras.Model.fit(self, x, y, batch_size=batch_size, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `evaluate`; stream batches are read from an empty
        evaluation memory, carried from batch to batch (training's memory
        is left as it is)."""
        if not _is_stream(x):
            return super().evaluate(x, y, batch_size=batch_size, **kwargs)
        batch_size = self._prepare_streams(x, batch_size, "evaluate")
        self._streams.value[1].clear()
        return keras.Model.evaluate(self, x, y, batch_size=batch_size, **kwargs)

    def predict(self, x=None, batch_size=None, **kwargs):
        """keras-hub's `predict`; stream batches as in `evaluate`."""
        if not _is_stream(x):
            return super().predict(x, batch_size=batch_size, **kwargs)
        batch_size = self._prepare_streams(x, batch_size, "predict")
        self._streams.value[1].clear()
        return keras.Model.predict(self, x, batch_size=batch_size, **kwargs)

    # ------------------------------------------------------------ generation
    def generate_step(self, inputs, stop_token_ids=None):
        """keras-hub's compiled generation of one batch: `inputs` are
        `{"token_ids", "padding_mask"}` `[B, N]`, right-padded; returns
        them with each row's prompt followed by its new ids (up to N in
        all), the mask ending after a row's first stop id."""
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
        buffer = tf.where(keep, token_ids, tf.zeros_like(token_ids))

        def next(prompt, cache, index):
            def pending():  # the log-probs after the prompts
                return cache["log_probs"], cache["hidden"], cache

            def step():
                ids = tf.gather(prompt, index - 1, axis=1)
                return self._step(ids, cache, position_keys, output_weights)
            return tf.cond(index > start, step, pending)

        buffer = self.sampler(next=next, prompt=buffer, cache=cache, index=start, mask=keep,
                              stop_token_ids=stop_token_ids, hidden_states=hidden, model=self)
        in_prompt = columns[None, :] < lengths[:, None]
        source = tf.clip_by_value(columns[None, :] - lengths[:, None] + start, 0, width - 1)
        token_ids = tf.where(in_prompt, token_ids, tf.gather(buffer, source, batch_dims=1))
        if stop_token_ids is None:
            padding_mask = tf.ones_like(token_ids, tf.bool)
        else:
            ends = tf.zeros_like(in_prompt)
            for stop in stop_token_ids:
                ends |= tf.equal(token_ids, stop)
            ends = tf.cast(ends & ~in_prompt, tf.int32)
            padding_mask = tf.equal(tf.cumsum(ends, axis=1) - ends, 0)
        return {"token_ids": token_ids, "padding_mask": tf.cast(padding_mask, tf.int32)}

    def make_generate_function(self):
        """`generate_step` compiled with XLA, as `Decoder` does, also on CPUs
        (where `compile`'s "auto" leaves `fit` without XLA). Not without it:
        TensorFlow's graph optimizer (Grappler) turns the uncompiled graph's
        output at batch 1 into an empty tensor (TF 2.21)."""
        if self.generate_function is None and not self.run_eagerly:
            self.generate_function = tf.function(self.generate_step, jit_compile=True)
        return super().make_generate_function()

    def generate(self, inputs, max_length=None, stop_token_ids="auto", strip_prompt=False):
        """keras-hub's `generate` (see `keras_hub.models.CausalLM.generate`);
        `stop_token_ids="auto"` means none: the paper's vocabularies have no
        end token (a word model's `<eos>` ends a line, not the text)."""
        if stop_token_ids == "auto":
            tokenizer = getattr(self.preprocessor, "tokenizer", None)
            end = getattr(tokenizer, "end_token_id", None)
            stop_token_ids = None if end is None else "auto"
        return super().generate(inputs, max_length=max_length, stop_token_ids=stop_token_ids,
                                strip_prompt=strip_prompt)

    def get_config(self):
        return {**super().get_config(), "mem_len": self.mem_len,
                "segment_len": self.segment_len}


def _is_stream(x):
    """Whether `x` (a dataset or arrays) holds stream batches: inputs with a
    `document_start`."""
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        x = spec[0] if isinstance(spec, tuple) else spec
    return isinstance(x, dict) and "document_start" in x
