"""A tail bin's NLL in chunks (`txl_tf.layers.tail_nll`), the adaptive
softmax's path under XLA: the values and gradients of scoring every row
against the bin (the path it replaced, restated here), for bins holding no
row, some rows, rows in several chunks and every row, with and without a
projection, in float32 and bfloat16, run eagerly and compiled."""
import numpy as np
import pytest
import tensorflow as tf

from txl_tf.layers.tail_nll import bin_rows_first, chunk_rows, tail_nll

N, D_MODEL, D_PROJ, LOW, HIGH = 21, 6, 4, 5, 12


def every_row(hidden, target, proj, weight, bias):
    """Every row scored against the bin, the target's logit picked by a
    one-hot product, 0 outside the bin."""
    inputs = hidden if proj is None else tf.matmul(hidden, proj, transpose_b=True)
    logits = tf.cast(tf.matmul(inputs, weight, transpose_b=True) + bias, tf.float32)
    picked = tf.reduce_sum(logits * tf.one_hot(target - LOW, HIGH - LOW), -1)
    in_bin = (target >= LOW) & (target < HIGH)
    return tf.where(in_bin, tf.reduce_logsumexp(logits, -1) - picked, 0.0)


def _case(seed, in_bin, with_proj, dtype):
    rng = np.random.default_rng(seed)
    target = rng.integers(0, LOW, N)  # below the bin
    target[:2] = [HIGH, HIGH + 3]  # above it: outside too
    target[in_bin] = rng.integers(LOW, HIGH, len(in_bin))
    d_in = D_PROJ if with_proj else D_MODEL
    tensors = [rng.normal(size=(N, D_MODEL)),
               rng.normal(size=(D_PROJ, D_MODEL)) if with_proj else None,
               rng.normal(size=(HIGH - LOW, d_in)), rng.normal(size=(HIGH - LOW,))]
    hidden, proj, weight, bias = (None if t is None else tf.constant(t, dtype) for t in tensors)
    return hidden, tf.constant(target, tf.int32), proj, weight, bias


def _nll_and_grads(fn, hidden, target, proj, weight, bias):
    inputs = [t for t in (hidden, proj, weight, bias) if t is not None]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        nll = fn(hidden, target, proj, weight, bias)
        loss = tf.reduce_sum(nll * tf.range(1.0, N + 1.0))  # every row its own weight
    return [nll] + tape.gradient(loss, inputs)


def _chunked(hidden, target, proj, weight, bias):
    return tail_nll(hidden, target, LOW, HIGH, proj, weight, bias)


ROWS = {"none": [], "one": [7], "one chunk": [3, 9, 20], "several chunks": list(range(2, 17, 2)),
        "every row": list(range(N))}


@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("with_proj", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_chunks_give_every_rows_values_and_gradients(rows, with_proj, compiled):
    case = _case(len(ROWS[rows]), ROWS[rows], with_proj, tf.float32)
    run = (tf.function(_nll_and_grads, jit_compile=True, autograph=False) if compiled
           else _nll_and_grads)
    mine = run(_chunked, *case)
    theirs = _nll_and_grads(every_row, *case)
    assert len(mine) == len(theirs) == (5 if with_proj else 4)
    for got, want in zip(mine, theirs):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    if rows == "none":
        assert not np.any(mine[0].numpy()) and not np.any(mine[1].numpy())


def test_bfloat16_inputs_get_bfloat16_gradients_near_every_rows():
    case = _case(3, ROWS["several chunks"], True, tf.bfloat16)
    mine = tf.function(_nll_and_grads, jit_compile=True, autograph=False)(_chunked, *case)
    theirs = _nll_and_grads(every_row, *case)
    for got, want in zip(mine, theirs):
        assert got.dtype == want.dtype
        scale = np.abs(want.numpy().astype(np.float32)).max()
        np.testing.assert_allclose(got.numpy().astype(np.float32),
                                   want.numpy().astype(np.float32), atol=0.02 * scale)


def test_the_bins_rows_come_first_in_order():
    in_bin = tf.constant([False, True, False, True, True, False])
    order, count = bin_rows_first(in_bin)
    assert order.numpy().tolist() == [1, 3, 4, 0, 2, 5] and int(count) == 3
    for flags in ([False] * 4, [True] * 4):
        order, count = bin_rows_first(tf.constant(flags))
        assert order.numpy().tolist() == [0, 1, 2, 3] and int(count) == sum(flags)
    assert [chunk_rows(n) for n in (1, 8, 9, 21, 9000)] == [1, 1, 2, 3, 1125]


def test_only_the_chunks_holding_the_bins_rows_are_scored(monkeypatch):
    """The loop stops after the chunk that holds the bin's last row: a bin
    of 3 rows among 21 (chunks of 3) is scored once forward and once in
    the gradient, one of 8 rows three times each."""
    import txl_tf.layers.tail_nll as module
    calls = []
    matmul = tf.matmul

    def counted(a, b, **kwargs):
        calls.append(1)
        return matmul(a, b, **kwargs)

    monkeypatch.setattr(module.tf, "matmul", counted, raising=True)
    for rows, chunks in (("one chunk", 1), ("several chunks", 3), ("none", 0)):
        calls.clear()
        _nll_and_grads(_chunked, *_case(0, ROWS[rows], False, tf.float32))
        # eager: each chunk's logits once forward; in the gradient, its logits
        # and two products (the weight's, the inputs')
        assert len(calls) == 4 * chunks, rows


@pytest.mark.parametrize("compiled", [False, True])
def test_a_row_of_another_bin_read_in_a_chunk_adds_nothing_even_if_not_finite(compiled):
    """The last chunk also reads rows outside the bin (after the bin's own,
    and row 0 as padding): they add exactly nothing, so a NaN or an infinite
    hidden state there (a float16 overflow in another bin's row) leaves the
    bin's NLL and gradients those of the same rows with that row finite, as
    the selection of the rows without XLA does."""
    case = list(_case(1, ROWS["one"], True, tf.float32))  # the bin: row 7; chunk: rows 7, 0, 1
    run = (tf.function(_nll_and_grads, jit_compile=True, autograph=False) if compiled
           else _nll_and_grads)
    want = run(_chunked, *case)
    for bad in (np.nan, np.inf):
        hidden = case[0].numpy()
        hidden[[0, 1, 2]] = bad  # rows 0 and 1 are read in the bin's chunk, row 2 is not
        got = run(_chunked, tf.constant(hidden), *case[1:])
        assert not np.any(got[1].numpy()[[0, 1, 2]])
        for mine, theirs in zip(got, want):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.parametrize("n", [17, 15, 5])
def test_the_padding_of_the_last_chunk_adds_nothing_to_row_0(n):
    """Where the row count is no multiple of the chunk (17 rows: chunks of 3,
    the last one padded with row 0), row 0, itself in the bin, gets its
    value and gradient once; and fewer rows than 8 (chunks of one row)."""
    rng = np.random.default_rng(n)
    hidden = tf.constant(rng.normal(size=(n, D_MODEL)), tf.float32)
    target = tf.constant(rng.integers(LOW, HIGH, n), tf.int32)  # every row in the bin
    weight = tf.constant(rng.normal(size=(HIGH - LOW, D_MODEL)), tf.float32)
    bias = tf.constant(rng.normal(size=(HIGH - LOW,)), tf.float32)
    assert n % chunk_rows(n) or n < 8

    def nll_and_grads(fn, hidden, weight, bias):
        with tf.GradientTape() as tape:
            tape.watch([hidden, weight, bias])
            nll = fn(hidden, target, None, weight, bias)
            loss = tf.reduce_sum(nll * tf.range(1.0, n + 1.0))
        return [nll] + tape.gradient(loss, [hidden, weight, bias])

    mine = tf.function(nll_and_grads, jit_compile=True, autograph=False)(_chunked, hidden,
                                                                         weight, bias)
    for got, want in zip(mine, nll_and_grads(every_row, hidden, weight, bias)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def test_the_benchmark_times_each_path_as_named(monkeypatch):
    """`benchmarks.throughput --part=tails`: its `chunks` runner runs the
    chunked tails (the row count known), its `every row` runner the old
    path (unknown), and each row's ratio is to every row's time."""
    import txl_tf.layers.adaptive_softmax as module
    from benchmarks import throughput
    chunked = []
    monkeypatch.setattr(module, "tail_nll", lambda *args: chunked.append(1) or
                        tail_nll(*args))
    cfg = throughput.config_for("tiny")
    for path, calls in (("every row", 0), ("chunks", 2)):  # two tail bins, traced once
        chunked.clear()
        run = throughput.tails_runner(cfg, 16, path)
        assert len(run(2)) == 2 and len(chunked) == calls, path
    peak = {"float32": 1.0}
    rows, _, _ = throughput.tails_part(dict(shapes=["tiny"], rows=16, iters=2, warmup=1,
                                            block=1, interleave=True), peak)
    assert [r["variant"] for r in rows] == list(throughput.TAIL_PATHS)
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] > 0 and rows[0]["rows"] == 16
