"""The sampler: its counter-based RNG, its allowed sets, its ties, and the
numpy mirror the runtimes use, against the TensorFlow original."""
import numpy as np
import pytest
import tensorflow as tf

from txl_tf.generation import counter_rng
from txl_tf.generation import sampling_numpy
from txl_tf.generation.request import Rows, make_rows
from txl_tf.generation.sampling import Sampling, choose

V = 12


def rows(batch, seed=0, stop=(), **settings):
    return make_rows(V, batch, seed, list(stop), Sampling(**settings))


def tf_choose(lp, r, seen=None, counters=None, done=None, pad_id=0):
    batch = len(lp)
    seen = np.zeros([batch, V], bool) if seen is None else seen
    counters = np.zeros(batch, np.int64) if counters is None else counters
    done = np.zeros(batch, bool) if done is None else done
    out = choose(tf.constant(lp, tf.float32), Rows(*(tf.constant(a) for a in r)),
                 tf.constant(seen), tf.constant(counters), tf.constant(done), pad_id)
    return tuple(o.numpy() for o in out)


def test_rng_is_exact_integer_math_in_tf_and_numpy():
    seeds = np.array([0, 1, 7, 2**32 + 5, 2**62 + 123], np.int64)
    np.testing.assert_array_equal(counter_rng.row_key(seeds).numpy(),
                                  sampling_numpy.row_key(seeds))
    keys = sampling_numpy.row_key(np.repeat(seeds, 1000))
    counters = np.tile(np.arange(1000), len(seeds))
    u_tf = counter_rng.uniform(tf.constant(keys), tf.constant(counters)).numpy()
    np.testing.assert_array_equal(u_tf, sampling_numpy.uniform(keys, counters))
    assert 0 <= u_tf.min() and u_tf.max() < 1
    assert abs(u_tf.mean() - 0.5) < 0.01 and abs(np.var(u_tf) - 1 / 12) < 0.005
    # neighbouring seeds and counters are not correlated
    assert abs(np.corrcoef(u_tf[:999], u_tf[1:1000])[0, 1]) < 0.1


def crafted(batch=400):
    """Log-probs whose order is known: token j has weight 2**-(j % V) shuffled per row."""
    rng = np.random.default_rng(0)
    base = np.log(np.exp2(-np.arange(V, dtype=np.float64)) / np.exp2(-np.arange(V)).sum())
    perm = np.stack([rng.permutation(V) for _ in range(batch)])
    lp = np.take_along_axis(np.tile(base, (batch, 1)), np.argsort(perm, -1), -1)
    return lp.astype(np.float32), perm  # perm[i, r] = the id of rank r in row i


@pytest.mark.parametrize("settings, allowed_ranks", [
    ({"top_k": 3}, 3),
    ({"top_p": 0.5}, 1),     # the best has mass 0.5002 >= 0.5
    ({"top_p": 0.8}, 3),     # 0.5 + 0.25 < 0.8 <= 0.875
    ({"top_k": 5, "top_p": 0.95}, 4),  # top-p over the renormalised top 5
])
def test_top_k_and_top_p_never_leave_the_allowed_set(settings, allowed_ranks):
    lp, perm = crafted()
    r = rows(len(lp), seed=3, temperature=1.0, **settings)
    ids_tf = tf_choose(lp, r)[0]
    ids_np = sampling_numpy.choose(lp, r, np.zeros(lp.shape, bool), np.zeros(len(lp), np.int64),
                                   np.zeros(len(lp), bool), 0)[0]
    np.testing.assert_array_equal(ids_tf, ids_np)
    ranks = np.argmax(perm == ids_tf[:, None], -1)
    assert ranks.max() == allowed_ranks - 1  # every allowed rank drawn, none beyond
    assert len(set(ranks)) == allowed_ranks


def test_greedy_breaks_ties_towards_the_lowest_id_within_tolerance():
    lp = np.log(np.full([2, V], 1 / V, np.float32))
    lp[0, [4, 9]] += 0.5
    lp[1, [9]] += 0.5
    lp[1, [4]] += 0.5 - 5e-5  # within TIE_TOLERANCE of the best: a tie
    for ids in (tf_choose(lp, rows(2, temperature=0))[0],
                sampling_numpy.choose(lp, rows(2, temperature=0), np.zeros([2, V], bool),
                                      np.zeros(2, np.int64), np.zeros(2, bool), 0)[0]):
        np.testing.assert_array_equal(ids, [4, 4])


def test_numpy_mirror_picks_the_same_ids_for_every_setting():
    rng = np.random.default_rng(1)
    for trial in range(30):
        batch = 8
        lp = np.log(rng.dirichlet(np.full(V, 0.3), batch)).astype(np.float32)
        lp[:, 3] = lp[:, 5]  # exact ties
        samplings = [Sampling(float(rng.choice([0, 0.7, 1.0, 2.0])), int(rng.integers(0, V)),
                              float(rng.choice([1.0, 0.9, 0.3])),
                              float(rng.choice([1.0, 1.3]))) for _ in range(batch)]
        r = make_rows(V, batch, trial, [2], samplings)
        seen = rng.random([batch, V]) < 0.2
        counters = rng.integers(0, 100, batch)
        done = rng.random(batch) < 0.2
        a = tf_choose(lp, r, seen, counters, done, pad_id=1)
        b = sampling_numpy.choose(lp, r, seen, counters, done, 1)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_seed_and_counter_decide_the_draw_not_the_batch():
    lp = np.log(np.full([1, V], 1 / V, np.float32))
    alone = [tf_choose(lp, rows(1, seed=s, temperature=1.0))[0][0] for s in range(5)]
    batched = tf_choose(np.repeat(lp, 5, 0), rows(5, seed=0, temperature=1.0))[0]
    np.testing.assert_array_equal(alone, batched)  # row i uses seed + i
    assert len(set(batched)) > 1


def test_repetition_penalty_and_stop_and_done_rows():
    lp = np.log(np.array([[0.4, 0.35, 0.25] + [0.0] * (V - 3)], np.float32) + 1e-30)
    seen = np.zeros([1, V], bool)
    seen[0, 0] = True
    ids, chosen, new_seen, counters, done = tf_choose(
        lp, rows(1, temperature=0, repetition_penalty=1.5, stop=[1]), seen)
    assert ids[0] == 1 and new_seen[0, 1] and done[0] and counters[0] == 1
    assert chosen[0] == pytest.approx(np.log(0.35))  # the model's log-prob, not the penalised one
    ids, chosen, _, counters, done = tf_choose(lp, rows(1, temperature=0), done=np.array([True]),
                                               pad_id=7)
    assert ids[0] == 7 and chosen[0] == 0 and counters[0] == 0 and done[0]


@pytest.mark.parametrize("settings, message", [
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": V + 1}, r"top_k must be an integer in \[0, 12\]"),
    ({"top_k": 1.5}, "top_k must be an integer"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"repetition_penalty": 0.5}, "repetition_penalty must be a finite number >= 1"),
])
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**settings).checked(V)
