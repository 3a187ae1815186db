"""Exact small cases for the building blocks: rel_shift, masks, positions, adaptive softmax."""
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import TransformerXL, TransformerXLConfig, TransformerXLLM
from txl_tf.errors import TxlError
from txl_tf.layers.adaptive_embedding import AdaptiveEmbedding
from txl_tf.layers.adaptive_softmax import AdaptiveLogSoftmax
from txl_tf.layers.attention import RelativeMultiHeadAttention
from txl_tf.layers.block import TransformerXLBlock
from txl_tf.layers.feedforward import PositionwiseFeedForward
from txl_tf.layers.masks import attention_visibility, causal_visibility, sees_whole_memory
from txl_tf.layers.memory import Memory, update_memory
from txl_tf.layers.positional import RelativePositionalEncoding, relative_positions
from txl_tf.layers.rel_shift import rel_shift, rel_shift_padded, with_pad_row
from txl_tf.layers.tail_nll import tail_nll as module_tail_nll


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (4, 0), (3, 5), (6, 2)])
def test_rel_shift_equals_naive_gather(qlen, mlen):
    klen = qlen + mlen
    x = np.random.default_rng(0).normal(size=(2, 3, qlen, klen)).astype(np.float32)
    shifted = rel_shift(tf.constant(x)).numpy()
    for i in range(qlen):
        for j in range(klen):
            if j <= i + mlen:  # distance (mlen + i) - j lives at index klen - 1 - distance
                np.testing.assert_array_equal(shifted[:, :, i, j],
                                              x[:, :, i, klen - 1 - (mlen + i - j)])


@pytest.mark.parametrize("qlen,mlen", [(1, 0), (4, 0), (3, 5), (6, 2)])
def test_scores_with_their_pad_column_shift_as_rel_shift_shifts_them(qlen, mlen):
    """The pad column's values reach only the garbage above the diagonal:
    random ones leave every entry a query sees as `rel_shift` gives it."""
    klen = qlen + mlen
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, qlen, klen)).astype(np.float32)
    pad = rng.normal(size=(2, 3, qlen, 1)).astype(np.float32)
    padded = rel_shift_padded(tf.constant(np.concatenate([pad, x], axis=3)))
    assert padded.shape == (2, 3, qlen, klen)
    seen = np.arange(klen)[None, :] <= np.arange(qlen)[:, None] + mlen
    np.testing.assert_array_equal(padded.numpy()[..., seen],
                                  rel_shift(tf.constant(x)).numpy()[..., seen])


def test_position_keys_with_a_pad_row_score_the_pad_column_as_zeros():
    keys = tf.constant(np.random.default_rng(2).normal(size=(3, 5, 4)).astype(np.float32))
    queries = tf.constant(np.random.default_rng(3).normal(size=(2, 3, 6, 4)).astype(np.float32))
    scores = tf.matmul(queries, with_pad_row(keys, 1), transpose_b=True).numpy()
    np.testing.assert_array_equal(scores[..., 0], 0.0)
    np.testing.assert_array_equal(scores[..., 1:], tf.matmul(queries, keys, transpose_b=True))


def test_causal_mask_without_memory():
    expected = np.array([[1, 0, 0],
                         [1, 1, 0],
                         [1, 1, 1]], bool)
    np.testing.assert_array_equal(causal_visibility(3, 0).numpy(), expected)


def test_causal_mask_with_memory():
    expected = np.array([[1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(causal_visibility(3, 2).numpy(), expected)


def test_same_length_mask_sees_exactly_mlen_plus_one_keys():
    expected = np.array([[1, 1, 1, 0, 0],
                         [0, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1]], bool)
    visible = causal_visibility(3, 2, same_length=True).numpy()
    np.testing.assert_array_equal(visible, expected)
    assert (visible.sum(1) == 3).all()


@pytest.mark.parametrize("same_length,convention", [(False, "tf"), (False, "pytorch"),
                                                    (True, "tf"), (True, "pytorch")])
def test_sees_whole_memory_says_what_one_query_after_its_memory_sees(same_length, convention):
    # The cached decode step gathers no visibility by distance where it is True.
    every = [bool(causal_visibility(1, mlen, same_length, convention).numpy().all())
             for mlen in range(6)]
    assert sees_whole_memory(same_length, convention) == all(every), every
    assert sees_whole_memory(same_length, convention) == (not (same_length
                                                              and convention == "pytorch"))
    with pytest.raises(TxlError, match="unknown same_length convention 'x'"):
        sees_whole_memory(same_length, "x")


def test_invalid_memory_slots_are_hidden():
    valid = tf.constant([[False, True], [True, True]])
    visible = attention_visibility(2, valid).numpy()
    assert visible.shape == (2, 1, 2, 4)
    np.testing.assert_array_equal(visible[0, 0], [[0, 1, 1, 0], [0, 1, 1, 1]])
    np.testing.assert_array_equal(visible[1, 0], [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_positions_are_reversed_clamped_and_sin_then_cos():
    np.testing.assert_array_equal(relative_positions(5).numpy(), [4, 3, 2, 1, 0])
    np.testing.assert_array_equal(relative_positions(5, clamp_len=2).numpy(), [2, 2, 2, 1, 0])
    enc = RelativePositionalEncoding(8)(tf.constant(4)).numpy()
    inv_freq = 1 / 10000 ** (np.arange(0, 8, 2) / 8)
    angles = np.arange(3, -1, -1)[:, None] * inv_freq[None]
    np.testing.assert_allclose(enc, np.concatenate([np.sin(angles), np.cos(angles)], 1),
                               atol=1e-6)


def _softmax_pair(cutoffs=(5, 9), div_val=2, **kwargs):
    emb = AdaptiveEmbedding(13, 8, 6, cutoffs=cutoffs, div_val=div_val)
    soft = AdaptiveLogSoftmax(13, 8, 6, cutoffs=cutoffs, div_val=div_val, embedding=emb,
                              **kwargs)
    rng = np.random.default_rng(1)
    for var in soft.weights:  # non-zero cluster weights and biases
        var.assign(rng.normal(size=var.shape).astype(np.float32))
    return emb, soft


@pytest.mark.parametrize("cutoffs,div_val", [((), 1), ((5, 9), 1), ((5, 9), 2), ((4,), 2)])
def test_adaptive_log_probs_normalise_and_match_nll(cutoffs, div_val):
    emb, soft = _softmax_pair(cutoffs, div_val)
    hidden = tf.constant(np.random.default_rng(2).normal(size=(3, 7, 6)), tf.float32)
    log_probs = soft(hidden)
    assert log_probs.shape == (3, 7, 13)
    np.testing.assert_allclose(tf.reduce_logsumexp(log_probs, -1).numpy(), 0, atol=1e-5)
    target = tf.constant(np.random.default_rng(3).integers(0, 13, (3, 7)), tf.int32)
    nll = soft(hidden, target)
    np.testing.assert_allclose(nll.numpy(), -tf.gather(log_probs, target, batch_dims=2).numpy(),
                               atol=1e-5)


@pytest.mark.parametrize("rows_known", [True, False])
def test_adaptive_nll_under_xla_has_static_shapes_and_the_same_values(rows_known, monkeypatch):
    """Compiled with XLA the tails read their rows in chunks of fixed size
    (`layers.tail_nll`), or, where the row count is unknown when traced,
    score every row (no row selection, whose shapes XLA would bound by the
    row count): the NLL and its gradients are those of the selection run
    without XLA."""
    import txl_tf.layers.adaptive_softmax as module
    chunked = []
    monkeypatch.setattr(module, "tail_nll",
                        lambda *args: chunked.append(1) or module_tail_nll(*args))
    _, soft = _softmax_pair(cutoffs=(5, 9), div_val=2)
    hidden = tf.constant(np.random.default_rng(2).normal(size=(3, 7, 6)), tf.float32)
    target = tf.constant(np.random.default_rng(3).integers(0, 13, (3, 7)), tf.int32)

    def nll_and_grads(hidden, target):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            nll = soft(hidden, target)
            loss = tf.reduce_sum(nll * tf.range(1.0, 22.0)[None, :7])  # every row its weight
        return nll, tape.gradient(loss, [hidden] + soft.trainable_weights)

    signature = None if rows_known else [tf.TensorSpec([None, 7, 6], tf.float32),
                                         tf.TensorSpec([None, 7], tf.int32)]
    compiled = tf.function(nll_and_grads, jit_compile=True, input_signature=signature)
    hlo = compiled.experimental_get_compiler_ir(hidden, target)(stage="hlo")
    assert "<=" not in hlo, "a shape bounded by the data (tf.where) reached XLA"
    assert bool(chunked) is rows_known  # two tail bins, traced once
    for mine, theirs in zip(tf.nest.flatten(compiled(hidden, target)),
                            tf.nest.flatten(tf.function(nll_and_grads)(hidden, target))):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cutoffs,div_val,tie", [((), 1, True), ((5, 9), 1, False),
                                                 ((5, 9), 1, True), ((5, 9), 2, True),
                                                 ((5, 9), 2, False)])
def test_decode_weights_give_the_same_log_probs(cutoffs, div_val, tie):
    """The decoder's pre-transposed weights (projections included) change
    nothing; nor does scoring one shared table in one matmul (`div_val` 1
    with one projection) instead of bin by bin."""
    n_bins = len(cutoffs) + 1
    _, soft = _softmax_pair(cutoffs, div_val, tie_weight=tie, tie_projs=[tie] * n_bins)
    assert soft._one_table() == (div_val == 1 and (tie or n_bins == 1))
    hidden = tf.constant(np.random.default_rng(2).normal(size=(4, 6)), tf.float32)
    np.testing.assert_allclose(soft.log_probs(hidden, soft.decode_weights()),
                               soft.log_probs(hidden), atol=1e-5)


def test_adaptive_softmax_keeps_token_order():
    _, soft = _softmax_pair()
    hidden = np.random.default_rng(4).normal(size=(1, 9, 6)).astype(np.float32)
    perm = np.random.default_rng(5).permutation(9)
    target = np.arange(9)[None] + 4  # spans all three bins
    out = soft(tf.constant(hidden), tf.constant(target)).numpy()
    out_perm = soft(tf.constant(hidden[:, perm]), tf.constant(target[:, perm])).numpy()
    np.testing.assert_allclose(out_perm, out[:, perm], atol=1e-6)


def test_tail_cluster_uses_head_column_shortlist_plus_i_minus_1():
    _, soft = _softmax_pair(cutoffs=(5, 9), div_val=2)
    # Make cluster 2 (tail bin 2) overwhelmingly likely: its head column is 5 + 2 - 1 = 6.
    soft.cluster_bias.assign([0.0, 50.0])
    log_probs = soft(tf.zeros([1, 1, 6])).numpy()[0, 0]
    assert np.exp(log_probs[9:]).sum() > 0.99


def test_weights_are_tied_to_the_embedding():
    emb, soft = _softmax_pair(cutoffs=(5, 9), div_val=2, tie_projs=[False, True, True])
    own = {id(v) for v in soft.weights}
    assert not own & {id(v) for v in emb.weights}, "tied weights must not be duplicated"
    hidden = tf.ones([1, 1, 6])
    before = soft(hidden).numpy()
    emb.tables[1].assign(np.random.default_rng(6).normal(size=emb.tables[1].shape))
    # Bin 2's logits large enough that a change of its projection shows.
    emb.tables[2].assign(np.random.default_rng(7).normal(size=emb.tables[2].shape))
    after = soft(hidden).numpy()
    assert not np.allclose(before[..., 5:9], after[..., 5:9])
    emb.projs[2].assign(np.random.default_rng(8).normal(size=emb.projs[2].shape))  # tied
    assert not np.allclose(after[..., 9:], soft(hidden).numpy()[..., 9:])
    assert soft.projs[0] is not None and soft.projs[1] is None  # own head projection


def test_untied_output_weights_are_separate():
    emb = AdaptiveEmbedding(13, 8, 8)
    soft = AdaptiveLogSoftmax(13, 8, 8, tie_weight=False, tie_projs=[False], embedding=emb)
    assert len(soft.weights) == 2 and soft.tables[0].shape == (13, 8)
    assert not {id(v) for v in soft.weights} & {id(v) for v in emb.weights}
    assert not np.allclose(soft.tables[0].numpy(), emb.tables[0].numpy())
    hidden = tf.constant(np.random.default_rng(7).normal(size=(1, 2, 8)), tf.float32)
    before = soft(hidden).numpy()
    emb.tables[0].assign(np.random.default_rng(8).normal(size=(13, 8)))
    np.testing.assert_array_equal(soft(hidden).numpy(), before)  # the embedding is not read


def test_embedding_bins_and_scale():
    emb = AdaptiveEmbedding(13, 8, 6, cutoffs=(5, 9), div_val=2)
    ids = np.array([[0, 4, 5, 8, 9, 12]])
    out = emb(tf.constant(ids)).numpy()
    for pos, tok in enumerate(ids[0]):
        b = 0 if tok < 5 else 1 if tok < 9 else 2
        low = (0, 5, 9)[b]
        ref = emb.tables[b].numpy()[tok - low] @ emb.projs[b].numpy() * 6 ** 0.5
        np.testing.assert_allclose(out[0, pos], ref, atol=1e-5)


# Every __init__ argument with a value other than its default.
NON_DEFAULT = [
    (RelativePositionalEncoding, dict(d_model=8, clamp_len=3)),
    (PositionwiseFeedForward, dict(d_model=8, d_inner=16, dropout=0.1, pre_lnorm=True,
                                   init_std=0.05, layer_norm_epsilon=1e-5)),
    (RelativeMultiHeadAttention, dict(d_model=8, n_head=2, d_head=4, dropout=0.1, dropatt=0.2,
                                      pre_lnorm=True, init_std=0.05, layer_norm_epsilon=1e-5)),
    (TransformerXLBlock, dict(d_model=8, n_head=2, d_head=4, d_inner=16, dropout=0.1,
                              dropatt=0.2, pre_lnorm=True, init_std=0.05,
                              layer_norm_epsilon=1e-5, attn_type=1)),
    (AdaptiveEmbedding, dict(n_token=13, d_embed=8, d_model=6, cutoffs=[5, 9], div_val=2,
                             proj_same_dim=False, init_std=0.05, proj_init_std=0.03)),
    (AdaptiveLogSoftmax, dict(n_token=13, d_embed=8, d_model=6, cutoffs=[5, 9], div_val=2,
                              tie_weight=False, tie_projs=[False, False, False],
                              proj_same_dim=False, init_std=0.05, proj_init_std=0.03)),
    (TransformerXL, dict(config=TransformerXLConfig.preset("tiny", n_token=50, mem_len=5))),
    (TransformerXLLM, dict(config=TransformerXLConfig.preset("tiny", n_token=50), batch_size=3,
                           mem_len=5, zero_filled=True)),
]
# Arguments that are references to other objects, not configuration.
NOT_CONFIG = {(AdaptiveLogSoftmax, "embedding")}


def _plain(value):
    if isinstance(value, TransformerXLConfig):
        return value.to_dict()
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("cls,kwargs", NON_DEFAULT, ids=lambda v: getattr(v, "__name__", ""))
def test_every_init_argument_survives_get_config(cls, kwargs):
    params = {name: p for name, p in inspect.signature(cls.__init__).parameters.items()
              if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
              and (cls, name) not in NOT_CONFIG}
    assert set(kwargs) == set(params), "give every argument a non-default value here"
    for name, value in kwargs.items():
        assert params[name].default is inspect.Parameter.empty or \
            _plain(params[name].default) != _plain(value), f"{name} is its default"
    layer = cls(**kwargs)
    config = layer.get_config()
    for name, value in kwargs.items():
        assert name in config and _plain(config[name]) == _plain(value), name
    clone = cls.from_config(config)
    assert clone.get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    assert type(keras.saving.deserialize_keras_object(serialized)) is cls


def test_padded_keys_are_hidden_and_become_invalid_memory_slots():
    valid = tf.constant([[True], [True]])
    tokens = tf.constant([[False, True], [True, True]])
    visible = attention_visibility(2, valid, token_valid=tokens).numpy()
    np.testing.assert_array_equal(visible[0, 0], [[1, 0, 0], [1, 0, 1]])
    np.testing.assert_array_equal(visible[1, 0], [[1, 1, 0], [1, 1, 1]])
    memory = Memory(tf.zeros([1, 2, 2, 4]), tf.constant([[True, False], [True, True]]))
    new = update_memory(memory, tf.ones([1, 2, 2, 4]), tokens)
    np.testing.assert_array_equal(new.mem_mask.numpy(), [[False, True], [True, True]])
    same = update_memory(memory, tf.ones([1, 2, 2, 4]))
    np.testing.assert_array_equal(same.mem_mask.numpy(), [[True, True], [True, True]])


def test_right_padded_rows_keep_the_memory_ending_at_their_last_real_position():
    """`row_lengths`: row b keeps the M slots of concat(memory, new) that end
    at its last real position (the old memory for a row of padding alone)."""
    rng = np.random.default_rng(0)
    old, new = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 3, 3, 4))  # L, B, M / T, d
    memory = Memory(tf.constant(old, tf.float32), tf.constant([[True, False]] * 3))
    lengths = np.array([3, 1, 0])
    valid = np.arange(3)[None, :] < lengths[:, None]
    out = update_memory(memory, tf.constant(new, tf.float32), tf.constant(valid),
                        row_lengths=tf.constant(lengths))
    both = np.concatenate([old, new], 2)
    both_mask = np.concatenate([[[True, False]] * 3, valid], 1)
    for b, length in enumerate(lengths):
        np.testing.assert_allclose(out.mems.numpy()[:, b], both[:, b, length:length + 2],
                                   rtol=1e-6)
        np.testing.assert_array_equal(out.mem_mask.numpy()[b], both_mask[b, length:length + 2])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_attention_probabilities_called_directly_cast_their_arguments(policy):
    """`probabilities` under a 16-bit policy failed in a float32 × half matmul
    on float32 arguments (its `pos_emb` was not cast, as Keras casts
    `call`'s); they are now read as the arguments in the compute dtype."""
    layer = RelativeMultiHeadAttention(8, 2, 4, dtype=policy)
    rng = np.random.default_rng(0)
    x, memory = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 2, 8))
    pos_emb, bias = rng.normal(size=(5, 8)), rng.normal(size=(2, 4))
    visible = np.tril(np.ones((3, 5), bool), 2)[None, None].repeat(2, 0)
    args = [np.float32(a) for a in (x, pos_emb, memory)] + [visible] + [np.float32(bias)] * 2
    probs = layer.probabilities(*args)
    cast = [tf.cast(a, layer.compute_dtype) if a.dtype != bool else a for a in args]
    assert probs.dtype == tf.float32
    np.testing.assert_array_equal(probs.numpy(), layer.probabilities(*cast).numpy())
    np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, rtol=1e-5)
    assert not probs.numpy()[..., ~visible[0, 0]].any()


def _attention_with_unit_weights(**kwargs):
    """A `RelativeMultiHeadAttention(8, ...)` with N(0, 1) weights: scores
    far from 0, so a mask or a dropout in the wrong place shows."""
    keras.utils.set_random_seed(0)
    layer = RelativeMultiHeadAttention(8, **kwargs)
    rng = np.random.default_rng(0)
    for var in layer.weights:
        var.assign(rng.normal(size=var.shape).astype(np.float32))
    return layer


def test_a_query_that_sees_no_key_weighs_every_key_equally():
    """Hidden keys get -1e30 added, which the score rounds to: a row with
    every key hidden is exactly uniform (`probabilities`' contract), not the
    softmax of its scores as a smaller mask value (-1e4) left it."""
    layer = _attention_with_unit_weights(n_head=2, d_head=4)
    rng = np.random.default_rng(1)
    x, memory = rng.normal(size=(1, 2, 8)), rng.normal(size=(1, 2, 8))
    pos_emb, bias = rng.normal(size=(4, 8)), rng.normal(size=(2, 4))
    visible = np.array([[[[False] * 4, [True, True, True, False]]]])
    probs = layer.probabilities(*(np.float32(a) for a in (x, pos_emb, memory)), visible,
                                np.float32(bias), np.float32(bias)).numpy()
    np.testing.assert_allclose(probs[0, :, 0], 0.25, rtol=1e-6)
    assert np.ptp(probs[0, :, 1, :3], -1).min() > 1e-3  # the visible row: not uniform


def test_attention_dropout_drops_probabilities_not_output_features():
    """`dropatt` acts on the attention probabilities, as the paper's
    `attn_prob = dropatt(attn_prob)`: with one head and one key a query's
    attention output is its value's projection dropped or doubled as a
    whole (rate 0.5), never feature by feature."""
    layer = _attention_with_unit_weights(n_head=1, d_head=8, dropatt=0.5, pre_lnorm=True)
    rng = np.random.default_rng(1)
    x = np.float32(rng.normal(size=(256, 1, 8)))
    args = (x, np.float32(rng.normal(size=(1, 8))), np.zeros([256, 0, 8], np.float32),
            np.ones([256, 1, 1, 1], bool), np.zeros([1, 8], np.float32),
            np.zeros([1, 8], np.float32))
    plain = layer(*args, training=False).numpy() - x  # pre_lnorm: inputs + attention
    dropped = layer(*args, training=True).numpy() - x
    zero = np.abs(dropped).max(-1) == 0
    assert 50 < zero.sum() < 206  # 128 expected
    np.testing.assert_allclose(dropped[~zero], 2 * plain[~zero], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lengths", [[4, 1, 0], [3, -1, 0]])
def test_row_lengths_outside_the_new_positions_are_one_clear_error(lengths):
    """A row length past the T new positions (or negative) named the gather's
    index (`indices[0,1] = 5 is not in [0, 5)`), and read other slots where
    the gather does not check (GPU, XLA)."""
    memory = Memory(tf.zeros([2, 3, 2, 4]), tf.ones([3, 2], tf.bool))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row_lengths must be in \[0, T\]"):
        update_memory(memory, tf.zeros([2, 3, 3, 4]), row_lengths=tf.constant(lengths))
