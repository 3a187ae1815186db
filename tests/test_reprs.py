"""The result tuples' reprs are one short line (a notebook cell ending in
`out = runtime.generate(...); out` showed hundreds of lines of arrays)."""
import numpy as np
import onnxruntime as ort
import tensorflow as tf

from export.runtime import RuntimeMemory
from txl_tf import DecodeState, Generation
from txl_tf.app.reprs import short
from txl_tf.generation.request import HeldCache, Rows
from txl_tf.layers.memory import Memory


def a_generation(vocab=256, n_layer=4, mem_len=128, d_model=128):
    rows = Rows(np.array([7], np.int64), np.ones(1, np.float32), np.zeros(1, np.int32),
                np.ones(1, np.float32), np.ones(1, np.float32), np.zeros([1, vocab], bool))
    memory = Memory(tf.zeros([n_layer, 1, mem_len, d_model]), tf.zeros([1, mem_len], tf.bool))
    cache = HeldCache(object(), {"keys": np.zeros([n_layer, 1, 4, 32, mem_len + 1], np.float32),
                                 "slot": np.int32(3)})
    state = DecodeState(np.full([1, vocab], -5.5, np.float32), memory, np.zeros([1, vocab], bool),
                        np.array([20]), np.array([False]), rows, 0, cache)
    return Generation(np.arange(20, dtype=np.int32)[None], np.full([1, 20], -0.25, np.float32),
                      np.array([20], np.int32), memory, state)


def test_a_generations_repr_names_shapes_not_values():
    generation = a_generation()
    text = repr(generation)
    assert "\n" not in text and len(text) < 1200, text
    assert text.startswith("Generation(ids=int32[1, 20], log_probs=float32[1, 20], "
                           "lengths=int32[1] [20], memory=Memory(mems=float32[4, 1, 128, 128], "
                           "mem_mask=bool[1, 128]), "
                           "state=DecodeState(next_log_probs=float32[1, 256]")
    assert "-5.5" not in text and "-0.25" not in text  # no array's values beyond 8 elements
    assert "cache=HeldCache(" in text
    assert "'keys': float32[4, 1, 4, 32, 129], 'slot': int32[] 3" in text
    assert "rows=Rows(keys=int64[1] [7], temperature=float32[1] [1]," in text
    assert repr(generation.state) == text.split("state=", 1)[1][:-1]


def test_memories_repr_on_every_backend():
    host = RuntimeMemory(np.zeros([2, 1, 64, 16], np.float32), np.zeros([1, 64], bool))
    assert repr(host) == "RuntimeMemory(mems=float32[2, 1, 64, 16], mem_mask=bool[1, 64])"
    device = RuntimeMemory(*(ort.OrtValue.ortvalue_from_numpy(x) for x in host))
    assert repr(device) == ("RuntimeMemory(mems=OrtValue tensor(float)[2, 1, 64, 16] on cpu, "
                            "mem_mask=OrtValue tensor(bool)[1, 64] on cpu)")
    assert repr(Memory(tf.zeros([2, 3, 5, 4]), tf.ones([3, 5], tf.bool))) == \
        "Memory(mems=float32[2, 3, 5, 4], mem_mask=bool[3, 5])"


def test_short_keeps_other_values_as_they_are():
    assert short(0) == "0" and short("abc") == "'abc'" and short(None) == "None"
    assert short(np.array([0.5, 1 / 3])) == "float64[2] [0.5, 0.333333]"
    assert short([np.zeros(3)] * 9) == "[9 items: float64[3] [0, 0, 0], ...]"
    assert short((np.zeros([2, 2], np.int8),)) == "(int8[2, 2] [[0, 0], [0, 0]])"


def test_caches_attention_and_examples_are_summarised():
    from txl_tf.classification.attention_picture import SegmentAttention
    from txl_tf.classification.data import Examples
    from txl_tf.classification.labels import LabelSet
    from txl_tf.layers.ring_cache import DecodeCache
    cache = DecodeCache((tf.zeros([1, 9, 8]),) * 2, (tf.zeros([1, 2, 4, 9]),) * 2,
                        (tf.zeros([1, 2, 9, 4]),) * 2, tf.ones([1, 9], tf.bool),
                        tf.constant(3), tf.constant([3]), tf.zeros([18, 8]))
    assert repr(cache) == (
        "DecodeCache(mems=(float32[1, 9, 8], float32[1, 9, 8]), keys=(float32[1, 2, 4, 9], "
        "float32[1, 2, 4, 9]), values=(float32[1, 2, 9, 4], float32[1, 2, 9, 4]), "
        "valid=bool[1, 9], slot=int32[], row_slot=int32[1], positions=float32[18, 8], "
        "position_keys=())")
    attention = SegmentAttention(np.zeros([2, 4, 12], np.float32), np.ones([4, 12], bool),
                                 np.arange(12, dtype=np.int32), 8, 0, 1)
    assert repr(attention) == ("SegmentAttention(probs=float32[2, 4, 12], visible=bool[4, 12], "
                               "key_ids=int32[12], n_memory=8, layer=0, segment=1)")
    texts = ["a long review " * 100] * 3000  # the dataclass's repr printed each
    examples = Examples(texts, [0, 1, 0] * 1000, LabelSet(["neg", "pos"]),
                        [f"reviews.tsv:{i + 1}" for i in range(3000)], ["reviews.tsv:9"])
    text = repr(examples)
    assert text == ("Examples(3,000 texts, LabelSet('neg', 'pos'), first from reviews.tsv:1, "
                    "1 skipped)"), text
