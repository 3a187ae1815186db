"""The sampler: its counter-based RNG, its allowed sets, its ties, and the
numpy mirror the runtimes use, against the TensorFlow original."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from txl_tf.generation import counter_rng
from txl_tf.generation import sampling, sampling_numpy
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


def test_a_few_rows_draw_the_same_uniforms_through_python_ints_as_through_numpy():
    """`uniform` of up to `SMALL_BATCH` rows runs on Python ints: row by row it
    equals the numpy math over a whole batch, for any int64 keys and counters."""
    rng = np.random.default_rng(0)
    edges = np.array([0, -1, 2**63 - 1, -2**63, 2**32 - 1, 2**32, 2**16], np.int64)
    keys = np.concatenate([rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64),
                           sampling_numpy.row_key(np.arange(200)), edges])
    counters = np.concatenate([rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64),
                               rng.integers(0, 2**33, 200), edges[::-1]])
    assert len(keys) > sampling_numpy.SMALL_BATCH  # the numpy path
    whole = sampling_numpy.uniform(keys, counters)
    rows = np.concatenate([sampling_numpy.uniform(keys[i:i + 3], counters[i:i + 3])
                           for i in range(0, len(keys), 3)])
    np.testing.assert_array_equal(rows, whole)


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
    # a subnormal one: flushed to 0 (greedy) by TensorFlow and XLA, sampled by numpy
    ({"temperature": 1e-40}, r"temperature must be 0 \(greedy\) or at least float32's smallest "
                             r"normal number 1\.175e-38, got 1e-40"),
    ({"top_k": V + 1}, r"top_k must be an integer in \[0, 12\]"),
    ({"top_k": 1.5}, "top_k must be an integer"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"repetition_penalty": 0.5}, "repetition_penalty must be a finite number >= 1"),
])
def test_bad_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**settings).checked(V)


def test_top_p_1_cuts_nothing_where_the_float32_mass_reaches_1_before_the_last_token():
    # 50,000 tokens: the float32 running sum of the sorted probabilities reached
    # 1.0 with 27 tokens left, and `mass_before < 1` dropped them whenever the
    # cut ran (a row with top_k, here the last one): ~2% of the other rows' draws
    # moved (their CDF's total changed), in TF and numpy differently.
    vocab, batch = 50000, 100
    lp = np.random.default_rng(0).normal(0, 1, vocab).astype(np.float32)
    lp = (lp - np.log(np.exp(lp.astype(np.float64)).sum())).astype(np.float32)
    lps = np.tile(lp, (batch + 1, 1))
    free = make_rows(vocab, batch, 0, [], Sampling(1.0))
    full_k = make_rows(vocab, batch, 0, [], Sampling(1.0, top_k=vocab))
    mixed = Rows.concat([free, make_rows(vocab, 1, 7, [], Sampling(1.0, top_k=5))])

    def draw(r, n):
        args = (lps[:n], np.zeros([n, vocab], bool), r.keys, np.zeros(n, np.int64),
                r.temperature, r.top_k, r.top_p, r.penalty)
        tf_ids = sampling.sample_next(*(tf.constant(a) for a in args)).numpy()
        np_ids = sampling_numpy.sample_next(*args)
        np.testing.assert_array_equal(tf_ids, np_ids)
        return np_ids[:batch]

    alone = draw(free, batch)
    np.testing.assert_array_equal(draw(mixed, batch + 1), alone)
    np.testing.assert_array_equal(draw(full_k, batch), alone)


def reference(lp, temperature, top_k, top_p, penalty, seen):
    """float64 probabilities of one row as documented, its allowed ids, and
    whether a top-p boundary or the tie tolerance is too close to call."""
    lp = np.where(seen, lp.astype(np.float64) * penalty, lp.astype(np.float64))
    best = lp.max()
    if temperature == 0:
        probs = np.zeros(len(lp))
        probs[np.flatnonzero(lp >= best - 1e-4)[0]] = 1
        return probs, probs > 0, False
    ranked = np.sort(lp)[::-1][:top_k or len(lp)]
    weights = np.exp((ranked - ranked[0]) / temperature)
    mass_before = np.cumsum(weights / weights.sum()) - weights / weights.sum()
    n_kept = max(int((mass_before < top_p).sum()), 1) if top_p < 1 else len(ranked)
    cut = ranked[n_kept - 1] - 1e-4
    close = top_p < 1 and np.abs(mass_before[1:] - top_p).min(initial=1) < 1e-5
    close |= bool((np.abs(lp - cut) < 1e-6).any())
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.where(lp >= cut, np.exp((lp - best) / temperature), 0)
    return weights / weights.sum(), lp >= cut, close


def test_random_settings_draw_the_documented_distribution():
    """Seeded random logits (ties, -inf, vocabularies up to 50,000) and settings
    (top_k up to the vocabulary, top_p near 0 and 1, tiny temperatures): the
    allowed set equals the reference's in TF and numpy, and 4,000 draws pass a
    chi-square test against its probabilities (fails with probability ~1e-6)."""
    rng = np.random.default_rng(5)
    for case in range(24):
        vocab = int(rng.choice([2, 5, 12, 40, 50000] if case % 4 else [50000]))
        lp = rng.normal(0, rng.choice([0.3, 1.0, 4.0]), vocab)
        if case % 3 == 1:
            lp = np.round(lp)  # ties
        if case % 5 == 2:
            lp[rng.random(vocab) < 0.4] = -np.inf
            lp[rng.integers(vocab)] = 0
        lp = (lp - np.logaddexp.reduce(lp)).astype(np.float32)
        setting = Sampling(float(rng.choice([0, 1e-4, 0.5, 1.0, 3.0])),
                           int(rng.choice([0, 0, 1, 3, vocab - 1, vocab])),
                           float(rng.choice([1.0, 1.0, 0.9, 0.3, 1e-6])),
                           float(rng.choice([1.0, 1.5])))
        seen = rng.random(vocab) < 0.3
        probs, allowed, close = reference(lp, *dataclasses.astuple(setting), seen)
        if close:
            continue
        if setting.temperature > 0:  # the allowed set, with a row forcing the cut on
            lps = np.where(seen, lp * np.float32(setting.repetition_penalty), lp)[None]
            k = np.array([setting.top_k], np.int32)
            p = np.array([setting.top_p], np.float32)
            temp = np.array([[setting.temperature]], np.float32)
            for cut in (sampling._cut_off(tf.constant(lps), tf.constant(temp), tf.constant(k),
                                          tf.constant(p), vocab).numpy(),
                        sampling_numpy._cut_off(lps, temp, k, p, vocab)):
                np.testing.assert_array_equal(lps[0] >= cut[0] - 1e-4, allowed,
                                              err_msg=f"case {case}: {setting}")
        if vocab > 40:
            continue
        draws = 4000
        r = make_rows(vocab, 1, case, [], setting)
        args = (np.tile(lp, (draws, 1)), np.tile(seen, (draws, 1)), np.repeat(r.keys, draws),
                np.arange(draws), *(np.repeat(a, draws) for a in r[1:5]))
        ids = sampling_numpy.sample_next(*args)
        if case % 4 == 1:
            np.testing.assert_array_equal(
                sampling.sample_next(*(tf.constant(a) for a in args)).numpy(), ids)
        counts = np.bincount(ids, minlength=vocab)
        assert not counts[probs == 0].any(), f"case {case}: {setting} drew a cut token"
        expected = probs * draws
        big = expected >= 5
        observed = np.append(counts[big], counts[~big].sum())
        expected = np.append(expected[big], expected[~big].sum())
        observed, expected = observed[expected > 0], expected[expected > 0]
        if len(expected) < 2:
            continue
        chi2, df = ((observed - expected) ** 2 / expected).sum(), len(expected) - 1
        # Wilson-Hilferty: the chi-square quantile at 1 - 1e-6 (z = 4.753)
        limit = df * (1 - 2 / (9 * df) + 4.753 * np.sqrt(2 / (9 * df))) ** 3
        assert chi2 < limit, f"case {case}: {setting}: chi2 {chi2:.1f} >= {limit:.1f}"


def test_temperature_divides_the_log_probs_once():
    """Row r draws the id at which the CDF of p ** (1 / T), in id order,
    passes its uniform: computed here in float64 from that definition, in
    TF and numpy, at T = 0.5, 2 and 3 (a temperature applied twice, T², drew
    from another distribution that no other test looked at)."""
    p = np.array([0.3, 0.25, 0.2, 0.12, 0.08, 0.05])
    vocab, batch = len(p), 300
    counters = np.arange(batch, dtype=np.int64)
    for temperature in (0.5, 2.0, 3.0):
        r = make_rows(vocab, batch, 11, [], Sampling(temperature))
        u = sampling_numpy.uniform(r.keys, counters).astype(np.float64)
        cdf = np.cumsum(p ** (1 / temperature))
        cdf /= cdf[-1]
        expected = np.searchsorted(cdf, u, side="right")
        clear = np.abs(cdf[None, :] - u[:, None]).min(-1) > 1e-5
        assert clear.sum() > 250
        args = (np.tile(np.log(p).astype(np.float32), (batch, 1)), np.zeros([batch, vocab], bool),
                r.keys, counters, *r[1:5])
        for ids in (sampling.sample_next(*(tf.constant(a) for a in args)).numpy(),
                    sampling_numpy.sample_next(*args)):
            np.testing.assert_array_equal(ids[clear], expected[clear],
                                          err_msg=f"temperature {temperature}")


@pytest.mark.parametrize("top_p, kept", [(0.5, 1), (0.75, 2), (0.875, 3)])
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_it_exactly(top_p, kept):
    """Masses exact in float32 (powers of two): 1/2 reaches top_p 0.5 alone,
    1/2 + 1/4 reaches 0.75, so the next token is cut (a mass before it
    equal to top_p is enough: `<`, not `<=`)."""
    lp = np.log(np.float32([[0.0625, 0.5, 0.125, 0.25, 0.0625]]))
    rank = [1, 3, 2, 0, 4]  # ids by probability
    k, p = np.array([0], np.int32), np.array([top_p], np.float32)
    temp = np.ones([1, 1], np.float32)
    for cut in (sampling._cut_off(tf.constant(lp), tf.constant(temp), tf.constant(k),
                                  tf.constant(p), 5).numpy(),
                sampling_numpy._cut_off(lp, temp, k, p, 5)):
        np.testing.assert_array_equal(np.flatnonzero(lp[0] >= cut[0] - 1e-4),
                                      sorted(rank[:kept]))


def test_the_compiled_sampler_and_the_mirror_agree_over_lm1b_s_vocabulary():
    """793,471 ids of nearly equal weight (lm1b): a float32 running sum of the
    weights rounds differently under XLA (the `Decoder`'s loop) and in numpy
    (the runtimes'), and moved 13 of 16 draws (by up to 21 ids); the integer
    sums leave the two to the exp's last bit."""
    vocab, batch = 793471, 16
    x = np.random.default_rng(0).normal(0, 1, (batch, vocab)).astype(np.float32)
    lp = (x - np.log(np.exp(x.astype(np.float64)).sum(-1, keepdims=True))).astype(np.float32)
    compiled = tf.function(sampling.sample_next, jit_compile=True)
    for settings in (Sampling(1.0), Sampling(1.0, top_p=0.9)):
        r = make_rows(vocab, batch, 0, [], settings)
        args = (lp, np.zeros([batch, vocab], bool), r.keys, np.zeros(batch, np.int64),
                r.temperature, r.top_k, r.top_p, r.penalty)
        moved = compiled(*(tf.constant(a) for a in args)).numpy() != \
            sampling_numpy.sample_next(*args)
        assert moved.sum() <= 1, (settings, np.flatnonzero(moved))


def test_a_peaked_row_draws_its_last_ids_and_top_p_keeps_them():
    """p = (0.9998, 0.0002): the uniform's share of the CDF's total is exact
    (the total's low 24 bits, up to 2**-12 of a peaked row's mass, were
    dropped: id 1 was never drawn, and top_p 0.99995 cut it)."""
    lp = np.log(np.float32([[0.9998, 0.0002]] * 3))
    r = make_rows(2, 3, [42728, 9216, 0], [], Sampling(1.0))
    u = sampling_numpy.uniform(r.keys, np.zeros(3, np.int64))
    assert u[0] > 0.99999 and u[1] > 0.99995 and u[2] < 0.9
    args = (lp, np.zeros([3, 2], bool), r.keys, np.zeros(3, np.int64), *r[1:5])
    for ids in (sampling.sample_next(*(tf.constant(a) for a in args)).numpy(),
                sampling_numpy.sample_next(*args)):
        np.testing.assert_array_equal(ids, [1, 1, 0])
    k, p = np.zeros(3, np.int32), np.float32([0.99995, 0.9999, 0.9997])
    temp = np.ones([3, 1], np.float32)
    for cut in (sampling._cut_off(tf.constant(lp), tf.constant(temp), tf.constant(k),
                                  tf.constant(p), 2).numpy(),
                sampling_numpy._cut_off(lp, temp, k, p, 2)):
        np.testing.assert_array_equal(cut[:, 0], lp[:, [1, 1, 0]][0])


def broken_rows(rng, batch):
    """Random rows, then rows that are no distribution (all NaN, one NaN,
    one +inf, all -inf) and a row whose -inf ids are probability 0."""
    lp = np.log(rng.dirichlet(np.full(V, 0.3), batch + 5)).astype(np.float32)
    lp[batch] = np.nan
    lp[batch + 1, 4] = np.nan
    lp[batch + 2, 7] = np.inf
    lp[batch + 3] = -np.inf
    lp[batch + 4, ::2] = -np.inf
    return lp


@pytest.mark.parametrize("trial", range(6))
def test_rows_with_no_distribution_get_id_0_draw_nothing_and_agree_on_every_backend(trial):
    """NaN or +inf anywhere in a row, or nothing finite: TensorFlow's sampler
    gave id V (greedy) or -1 (sampled), numpy's 0 or 3, and a row with one NaN
    2 under XLA and 4 without. Now every backend gives id 0 from
    `sample_next` and `choose` draws nothing for the row (pad_id, its
    counter, seen ids and done flag as they were), so the loops find it;
    the other rows get what they get without it, and a -inf id is never
    drawn."""
    rng = np.random.default_rng(trial)
    batch = 6
    lp = broken_rows(rng, batch)
    n = len(lp)
    samplings = [Sampling(float(rng.choice([0, 0.7, 1.0, 2.0])), int(rng.integers(0, V)),
                          float(rng.choice([1.0, 0.9, 0.3])), float(rng.choice([1.0, 1.3])))
                 for _ in range(n)]
    r = make_rows(V, n, trial, [2], samplings)
    seen = rng.random([n, V]) < 0.2
    counters = rng.integers(0, 100, n)
    done = np.zeros(n, bool)
    done[0] = True
    args = (lp, seen, r.keys, counters, *r[1:5])
    compiled = tf.function(sampling.sample_next, jit_compile=True)
    by_backend = [sampling.sample_next(*(tf.constant(a) for a in args)).numpy(),
                  compiled(*(tf.constant(a) for a in args)).numpy(),
                  sampling_numpy.sample_next(*args)]
    for ids in by_backend:
        np.testing.assert_array_equal(ids, by_backend[0])
        np.testing.assert_array_equal(ids[batch:batch + 4], 0)
        assert ids[batch + 4] % 2 == 1  # its -inf ids (the even ones) are never drawn
    no_distribution = (np.arange(n) >= batch) & (np.arange(n) < batch + 4)
    np.testing.assert_array_equal(sampling_numpy.usable_rows(lp), ~no_distribution)
    np.testing.assert_array_equal(sampling.usable_rows(tf.constant(lp)).numpy(),
                                  ~no_distribution)
    a = tf_choose(lp, r, seen, counters, done, pad_id=1)
    b = sampling_numpy.choose(lp, r, seen, counters, done, 1)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    ids, chosen, new_seen, new_counters, new_done = b
    halted = no_distribution | done
    np.testing.assert_array_equal(ids[halted], 1)
    np.testing.assert_array_equal(chosen[halted], 0)
    np.testing.assert_array_equal(new_counters, counters + ~halted)
    np.testing.assert_array_equal(new_seen[halted], seen[halted])
    np.testing.assert_array_equal(new_done[no_distribution], False)
    kept = ~no_distribution
    alone = sampling_numpy.choose(lp[kept], r.take(np.flatnonzero(kept)), seen[kept],
                                  counters[kept], done[kept], 1)
    for x, y in zip(b, alone):
        np.testing.assert_array_equal(x[kept], y)
