"""Relative effective context length (Dai et al., 2019, Appendix C): the
gain arithmetic against a hand computation and a group whose reach is
known; the Transformer-XL scorer reads exactly the c ids before a target."""
import logging
import math

import keras
import numpy as np
import pytest

from txl_tf import TransformerXL, TransformerXLConfig, TxlError
from txl_tf.learning.context_length import (context_losses, recl, relative_gain,
                                            sample_positions, transformer_xl_scorer)


def test_the_gain_is_the_papers_formula_by_hand():
    # 2 models, 2 contexts, 4 positions.
    losses = np.array([[[2.0, 1.0, 3.0, 0.5], [1.5, 1.0, 2.0, 0.5]],
                       [[2.5, 0.8, 2.8, 0.7], [2.5, 0.8, 2.9, 0.7]]])
    best = np.array([2.0, 0.8, 2.8, 0.5])  # b(c0, t): min over the models
    hard = [2, 0]  # r = 0.5: the two largest b(c0, t)
    for model in range(2):
        f_same = np.mean(np.minimum(best[hard], losses[model, 0, hard]))
        f_next = np.mean(np.minimum(best[hard], losses[model, 1, hard]))
        expected = (math.exp(f_same) - math.exp(f_next)) / math.exp(f_same)
        assert relative_gain(losses, model, 0, 1, 0.5) == pytest.approx(expected, rel=1e-12)
    assert relative_gain(losses, 0, 0, 1, 0.5) > 0.3  # model 0 gains on the hard tokens
    assert relative_gain(losses, 1, 0, 1, 0.5) == pytest.approx(0.0)  # model 1 does not


def test_recl_finds_where_each_models_gain_stops():
    rng = np.random.default_rng(0)
    contexts = [8, 16, 24, 32, 40, 48]
    base = rng.uniform(1.0, 3.0, 500)

    def curve(reach):  # the loss falls by 10% per step up to `reach`, then stays
        steps = np.minimum(np.arange(len(contexts)), contexts.index(reach))
        return base[None, :] * 0.9 ** steps[:, None]

    losses = np.stack([curve(16), curve(40)])
    for ratio in (0.1, 0.5, 1.0):
        lengths, gains = recl(losses, contexts, ratio)
        assert lengths == [16, 40]
        assert gains.shape == (2, len(contexts) - 1)
    # A model that never stops gaining on the grid reaches its end.
    lengths, _ = recl(np.stack([curve(48)]), contexts, 1.0)
    assert lengths == [48]


@pytest.fixture(scope="module")
def core():
    keras.utils.set_random_seed(0)
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=30, init_std=0.3,
                                                    tgt_len=4, mem_len=4))


def test_the_scorer_reads_exactly_the_c_ids_before_the_target(core):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 30, 60)
    positions = sample_positions(len(ids), 12, 4, seed=2)
    contexts = [3, 7, 12]
    losses = context_losses(transformer_xl_scorer(core), ids, positions, contexts,
                            batch_size=4)
    for k, c in enumerate(contexts):
        for j, t in enumerate(positions):
            # One pass over the window alone, from an empty memory.
            log_probs, _ = core(ids[None, t - c:t].astype(np.int32),
                                core.initial_memory(1, mem_len=0))
            assert losses[k, j] == pytest.approx(-log_probs.numpy()[0, -1, ids[t]], abs=1e-5)
    # Older text changes nothing: only the c ids before t are read. Scored in
    # the same batches as above, so that no kernel's round-off differs.
    scorer = transformer_xl_scorer(core)
    for j, t in enumerate(positions[:3]):
        changed = ids.copy()
        changed[:t - 12] = rng.integers(0, 30, t - 12)
        again = context_losses(scorer, changed, positions, [12], batch_size=4)
        assert again[0, j] == losses[2, j]
    # While a longer context does change the loss.
    assert np.abs(losses[0] - losses[2]).max() > 1e-3


def test_each_context_length_is_read_at_one_batch_shape(core):
    # The last, short batch is padded: one compiled graph per context length,
    # not two, and the same losses as each window read alone.
    ids = np.random.default_rng(3).integers(0, 30, 40)
    positions = sample_positions(len(ids), 7, 6, seed=1)
    scorer, shapes = transformer_xl_scorer(core), []

    def recording(windows):
        shapes.append(windows.shape)
        return scorer(windows)

    losses = context_losses(recording, ids, positions, [3, 7], batch_size=4)
    assert sorted(set(shapes)) == [(4, 3), (4, 7)] and len(shapes) == 4
    for k, c in enumerate([3, 7]):
        alone = [context_losses(scorer, ids, [t], [c], batch_size=4)[0, 0] for t in positions]
        np.testing.assert_allclose(losses[k], alone, atol=1e-5)


def test_a_graph_per_context_length_is_not_tensorflows_retracing_warning(core):
    # One graph per context length, by design: TensorFlow's "N out of the last
    # M calls ... triggered tf.function retracing" warning, which `txl-recl`
    # printed past five lengths, would tell the user that something is wrong.
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(handler)
    try:
        ids = np.random.default_rng(4).integers(0, 30, 40)
        context_losses(transformer_xl_scorer(core), ids, [30, 35], [1, 2, 3, 4, 5, 6, 7],
                       batch_size=2)
    finally:
        tf_logger.removeHandler(handler)
    assert [r.getMessage() for r in records if "retracing" in r.getMessage()] == []


def test_bad_arguments_are_clear_errors(core):
    with pytest.raises(TxlError, match="too few for a context of 50"):
        sample_positions(40, 50, 10)
    with pytest.raises(TxlError, match="must be >= 1"):
        context_losses(transformer_xl_scorer(core), np.arange(20) % 30, [10], [0, 4])
    with pytest.raises(TxlError, match="fewer than 12 ids"):
        context_losses(transformer_xl_scorer(core), np.arange(20) % 30, [10], [12])
    with pytest.raises(TxlError, match=r"ratio must be in \(0, 1\]"):
        relative_gain(np.zeros([1, 2, 3]), 0, 0, 1, 0.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_infinite_loss_is_a_clear_error(bad):
    # Before, a NaN gain compared as "not below the threshold" (the RECL grew
    # to the grid's end) and a NaN best loss was sorted out of the hard tokens.
    losses = np.ones([2, 3, 4])
    losses[0, 1, 2] = bad
    with pytest.raises(TxlError, match="context index 1, position 2 .* finite"):
        recl(losses, [4, 8, 12], 0.5)
    with pytest.raises(TxlError, match="finite"):
        relative_gain(losses, 1, 0, 1, 1.0)


def _paper_recl(losses, contexts, ratio, threshold):
    """RECL as Appendix C words it, position by position."""
    lengths = []
    for model in range(len(losses)):
        k = 0
        while k + 1 < len(contexts):
            best = [min(m[k][t] for m in losses) for t in range(len(losses[0][0]))]
            ranked = sorted(range(len(best)), key=lambda t: (-best[t], t))
            hard = ranked[:max(1, math.ceil(ratio * len(best)))]
            f_same = sum(min(best[t], losses[model][k][t]) for t in hard) / len(hard)
            f_next = sum(min(best[t], losses[model][k + 1][t]) for t in hard) / len(hard)
            if (math.exp(f_same) - math.exp(f_next)) / math.exp(f_same) < threshold:
                break
            k += 1
        lengths.append(contexts[k])
    return lengths


def test_recl_matches_the_papers_definition_on_random_tables():
    rng = np.random.default_rng(7)
    for case in range(300):
        n, k, p = rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 10)
        if case % 3 == 0:  # ties and equal models
            losses = np.repeat(rng.integers(0, 3, (1, k, p)), n, 0).astype(float)
            losses[rng.integers(n)] += rng.integers(0, 2, (k, p))
        else:  # losses that fall with the context, more or less
            losses = rng.uniform(1, 4, (n, 1, p)) * rng.choice(
                [1.0, 0.995, 0.9, 0.5], (n, k, p)).cumprod(1)
        contexts = list(range(8, 8 + 8 * k, 8))
        for ratio in (0.1, 0.5, 1.0, float(rng.uniform(0.05, 1))):
            lengths, _ = recl(losses, contexts, ratio)
            assert lengths == _paper_recl(losses.tolist(), contexts, ratio, 0.01), (case, ratio)


@pytest.mark.parametrize("ratio, count", [(0.07, 100), (0.28, 25), (0.55, 100), (0.14, 50)])
def test_the_hard_tokens_are_exactly_the_fraction_r(ratio, count):
    # r x positions is a whole number k here, but the float product is a hair
    # above it: before, ceil kept k + 1 tokens.
    keep = round(ratio * count)
    best = np.arange(count, 0, -1, dtype=float)  # position j is the (j + 1)-th hardest
    losses = np.stack([np.stack([best, best]), np.stack([best + 1, best + 1])])
    losses[0, 1, keep] = 0.0  # model 0 gains only on the (k + 1)-th hardest token
    assert relative_gain(losses, 0, 0, 1, ratio) == 0.0
    losses[0, 1, keep - 1] = 0.0  # and now on the k-th too
    assert relative_gain(losses, 0, 0, 1, ratio) > 0.0


def test_recl_refuses_a_table_or_threshold_it_cannot_read():
    # Before: a NaN threshold gave the grid's end, contexts that did not
    # match the table's context axis a RECL read off the wrong column, and a
    # table without the models axis an IndexError.
    losses = np.ones([2, 3, 4])
    losses[:, 1:] *= 0.5
    with pytest.raises(TxlError, match=r"threshold must be in \(0, 1\), got nan"):
        recl(losses, [4, 8, 12], 1.0, threshold=float("nan"))
    with pytest.raises(TxlError, match=r"threshold must be in \(0, 1\), got 0.0"):
        recl(losses, [4, 8, 12], 1.0, threshold=0.0)
    with pytest.raises(TxlError, match="2 context lengths for a table of 3"):
        recl(losses, [4, 8], 1.0)
    with pytest.raises(TxlError, match=r"\[models, contexts, positions\]"):
        recl(losses[0], [4, 8, 12], 1.0)
    with pytest.raises(TxlError, match=r"\[models, contexts, positions\]"):
        relative_gain(losses[0], 0, 0, 1, 1.0)
    assert recl(losses, [4, 8, 12], 1.0)[0] == [8, 8]


def test_a_fraction_just_above_a_whole_count_keeps_one_more_token():
    # 0.30000004 x 10 = 3.0000004: ceil keeps 4 (rounding the product away would keep 3).
    best = np.arange(10, 0, -1, dtype=float)
    losses = np.stack([np.stack([best, best]), np.stack([best + 1, best + 1])])
    losses[0, 1, 3] = 0.0  # model 0 gains only on the 4th hardest token
    assert relative_gain(losses, 0, 0, 1, 0.30000004) > 0.0
    assert relative_gain(losses, 0, 0, 1, 0.3) == 0.0
