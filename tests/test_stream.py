"""Stream layout: continuity, shifted labels, resumption, evaluation coverage,
streams pinned to replicas under a 2-replica MirroredStrategy, and the ids
held exactly as long as a dataset or iterator reads them."""
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

# Two logical CPUs for the MirroredStrategy test. tests/conftest.py normally
# does this first; repeating it is harmless before TF initialises its devices,
# and raises RuntimeError (ignored) after.
try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
except RuntimeError:
    pass

from txl_tf.data import (batchify, distribute_segments, eval_segment_dataset,  # noqa: E402
                         num_segments, segment_dataset, stream)
from txl_tf.errors import TxlError  # noqa: E402
from training.strategy import mirrored_strategy  # noqa: E402


def collect(ds, n=None):
    items = ds if n is None else ds.take(n)
    return [tuple(t.numpy() for t in item) for item in items]


@pytest.mark.parametrize("n,b,t", [(103, 4, 5), (1000, 3, 7), (64, 1, 8)])
def test_batches_continue_streams(n, b, t):
    ids = np.arange(n, dtype=np.int32)
    ds = segment_dataset(ids, b, t, repeat=False)
    assert ds.element_spec[0].shape == (b, t) and ds.element_spec[0].dtype == tf.int32
    batches = collect(ds)
    L = n // b
    assert len(batches) == num_segments(n, b, t) == (L - 1) // t
    for s, (x, y) in enumerate(batches):
        np.testing.assert_array_equal(y, x + 1)  # next-token labels
        # stream k is ids[k*L:(k+1)*L]; step s is its window [s*t, s*t+t)
        expected = np.arange(b)[:, None] * L + s * t + np.arange(t)[None, :]
        np.testing.assert_array_equal(x, expected)
        if s:
            np.testing.assert_array_equal(x[:, 0], batches[s - 1][0][:, -1] + 1)
            np.testing.assert_array_equal(x[:, 0], batches[s - 1][1][:, -1])
    np.testing.assert_array_equal(batchify(ids, b), ids[:b * L].reshape(b, L))


def test_start_step_resumes_exactly_including_wraparound():
    ids = np.random.default_rng(0).integers(0, 50, 257).astype(np.int32)
    n = num_segments(ids, 4, 6)
    assert n == 10
    full = collect(segment_dataset(ids, 4, 6), 3 * n)
    for start in (0, 1, 7, n, n + 3, 2 * n - 1):
        resumed = collect(segment_dataset(ids, 4, 6, start_step=start), 5)
        for a, b in zip(resumed, full[start:start + 5]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    # a new epoch starts the streams again
    np.testing.assert_array_equal(full[n][0], full[0][0])
    assert collect(segment_dataset(ids, 4, 6, start_step=n, repeat=False)) == []


@pytest.mark.parametrize("n,b,t", [(103, 4, 5), (100, 4, 5), (97, 3, 10), (10, 4, 3), (7, 1, 20)])
def test_eval_covers_every_token_once(n, b, t):
    ids = np.arange(n, dtype=np.int32) + 1000
    ds = eval_segment_dataset(ids, b, t)
    assert [s.shape for s in ds.element_spec] == [(b, t)] * 3
    assert ds.element_spec[2].dtype == tf.float32
    batches = collect(ds)
    assert len(batches) == num_segments(n, b, t, drop_remainder=False)
    labels = np.concatenate([y[w > 0] for _, y, w in batches])
    L = -(-n // b)
    stream_starts = {1000 + k * L for k in range(b) if k * L < n}
    assert sorted(labels.tolist()) == sorted(set(ids.tolist()) - stream_starts)
    assert len(labels) == len(set(labels.tolist()))  # exactly once
    for x, y, w in batches:  # weighted labels are the next token of their input
        np.testing.assert_array_equal(y[w > 0], x[w > 0] + 1)
    assert sum(w.sum() for _, _, w in batches) == n - len(stream_starts)


def test_eval_start_step():
    ids = np.arange(500, dtype=np.int32)
    full = collect(eval_segment_dataset(ids, 3, 7))
    part = collect(eval_segment_dataset(ids, 3, 7, start_step=5))
    assert len(part) == len(full) - 5
    for a, b in zip(part, full[5:]):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


def test_errors():
    with pytest.raises(ValueError,
                       match=r"10 ids are too few for batch_size 4 and tgt_len 3.*at least 16"):
        segment_dataset(np.arange(10), 4, 3)
    # Evaluation: 6 ids over 8 streams leave each stream 1 id, no label; 9 are enough.
    with pytest.raises(ValueError, match=r"6 ids are too few .* \(need at least 9 ids\)"):
        eval_segment_dataset(np.arange(6), 8, 4)
    assert len(list(eval_segment_dataset(np.arange(9), 8, 4))) == 1
    with pytest.raises(ValueError, match="tgt_len must be a positive int"):
        segment_dataset(np.arange(100), 4, 0)
    with pytest.raises(ValueError, match="start_step"):
        segment_dataset(np.arange(100), 4, 3, start_step=-1)
    with pytest.raises(ValueError, match="1-D"):
        segment_dataset(np.zeros([10, 10], np.int32), 2, 3)


def test_memmap_source(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(300, dtype=np.int32))
    ids = np.load(path, mmap_mode="r")
    (x, y), = collect(segment_dataset(ids, 2, 4, start_step=3), 1)
    np.testing.assert_array_equal(x, [[12, 13, 14, 15], [162, 163, 164, 165]])


@pytest.fixture(scope="module")
def two_replicas():
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < 2:
        pytest.skip("needs 2 logical CPU devices; TensorFlow was initialised before "
                    "this module (or conftest) could split the CPU")
    return mirrored_strategy([c.name for c in cpus[:2]])


@pytest.mark.parametrize("evaluation", [False, True])
def test_streams_stay_on_their_replica(two_replicas, evaluation):
    strategy = two_replicas
    assert strategy.num_replicas_in_sync == 2
    ids = np.arange(4001, dtype=np.int32)
    B, T, start = 6, 5, 3
    dist = distribute_segments(strategy, ids, B, T, start_step=start, evaluation=evaluation)
    reference = (eval_segment_dataset(ids, B, T, start_step=start) if evaluation
                 else segment_dataset(ids, B, T, start_step=start))

    @tf.function
    def step(batch):
        def replica_fn(batch):
            ctx = tf.distribute.get_replica_context()
            return ctx.replica_id_in_sync_group, batch[0], batch[1]
        return strategy.run(replica_fn, args=(batch,))

    L = len(ids) // B if not evaluation else -(-len(ids) // B)
    for s, (batch, ref) in enumerate(zip(dist, reference.take(4))):
        rid, x, y = (strategy.experimental_local_results(v) for v in step(batch))
        for r in range(2):
            assert int(rid[r]) == r
            rows = slice(3 * r, 3 * r + 3)  # replica r owns streams [3r, 3r+3)
            np.testing.assert_array_equal(x[r].numpy(), ref[0].numpy()[rows])
            np.testing.assert_array_equal(y[r].numpy(), ref[1].numpy()[rows])
            first = x[r].numpy()[:, 0]
            np.testing.assert_array_equal(first, np.arange(3 * r, 3 * r + 3) * L + (start + s) * T)


def test_global_batch_must_divide_replicas(two_replicas):
    with pytest.raises(ValueError, match="global_batch_size 5 is not divisible by the 2 replicas"):
        distribute_segments(two_replicas, np.arange(1000), 5, 4)


def _paper_batches(ids, b, t, evaluation):
    """The paper's LMOrderedIterator in numpy: `b` contiguous rows (N // b ids
    each; ceil(N / b) at evaluation, the last rows shorter), segments of `t`
    read left to right, labels one later; training keeps full segments only,
    evaluation pads past a row's end with id 0 (labels with weight 0)."""
    n = len(ids)
    length = -(-n // b) if evaluation else n // b
    rows = [ids[k * length:(k + 1) * length] for k in range(b)]
    batches = []
    for i in range(0, length - 1, t):
        if not evaluation and i + t > length - 1:
            break
        x, y = np.zeros([b, t], np.int32), np.zeros([b, t], np.int32)
        w = np.zeros([b, t], np.float32)
        for k, row in enumerate(rows):
            inputs, labels = row[i:i + t], row[i + 1:i + 1 + t]
            x[k, :len(inputs)], y[k, :len(labels)], w[k, :len(labels)] = inputs, labels, 1
        batches.append((x, y, w) if evaluation else (x, y))
    return batches


def test_random_layouts_match_the_papers_iterator():
    """Seeded random corpus lengths, batch sizes, segment lengths and resume
    steps: every training batch (an epoch and the next one's first, and from
    the resume step on)
    and every evaluation batch equals the numpy reference."""
    rng = np.random.default_rng(2024)
    for _ in range(12):
        b, t = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        n = int(rng.integers(b * (t + 1), b * (t + 1) * 3 + 20))
        ids = rng.integers(0, 1 << 30, n).astype(np.int32)
        case = f"n={n} b={b} t={t}"
        train = _paper_batches(ids, b, t, evaluation=False)
        assert num_segments(n, b, t) == len(train), case
        for s, got in enumerate(collect(segment_dataset(ids, b, t), len(train) + 1)):
            for u, v in zip(got, train[s % len(train)]):
                np.testing.assert_array_equal(u, v, err_msg=f"{case} step {s}")
        start = int(rng.integers(0, 2 * len(train)))
        for j, got in enumerate(collect(segment_dataset(ids, b, t, start_step=start), 2)):
            for u, v in zip(got, train[(start + j) % len(train)]):
                np.testing.assert_array_equal(u, v, err_msg=f"{case} resumed at {start}")
        evaluation = _paper_batches(ids, b, t, evaluation=True)
        got = collect(eval_segment_dataset(ids, b, t))
        assert len(got) == len(evaluation), case
        for s, (batch, expected) in enumerate(zip(got, evaluation)):
            for u, v in zip(batch, expected):
                np.testing.assert_array_equal(u, v, err_msg=f"{case} evaluation segment {s}")


def _freed_with_the_last_user(make, read, evaluation=False):
    """`make(ids)` builds a dataset (or distributed dataset) over fresh ids
    (6 streams of 5, from step 2); the ids must outlive the dataset while an
    iterator of it is left, serve it the batches of `segment_dataset` (or
    `eval_segment_dataset`) over a copy, and be freed once the iterator is
    gone too (TensorFlow keeps every `numpy_function`'s callable for the life
    of the process: it must not hold the ids)."""
    ids = np.arange(4003, dtype=np.int32)
    reference = (eval_segment_dataset if evaluation else segment_dataset)(
        ids.copy(), 6, 5, start_step=2)
    expected = [batch[0] for batch in collect(reference, 3)]
    freed = weakref.ref(ids)
    iterator = iter(make(ids))
    del ids
    gc.collect()
    assert freed() is not None, "the ids were freed while an iterator still reads them"
    for want in expected:
        np.testing.assert_array_equal(read(next(iterator)), want)
    del iterator
    gc.collect()
    assert freed() is None, "the ids outlived the dataset and its iterators"


def _first(batch):
    return batch[0].numpy()


def test_a_dataset_holds_its_ids_as_long_as_it_is_read():
    """Regression: every dataset kept its ids (and callable) for the life of the process."""
    _freed_with_the_last_user(lambda ids: segment_dataset(ids, 6, 5, start_step=2), _first)
    _freed_with_the_last_user(lambda ids: eval_segment_dataset(ids, 6, 5, start_step=2), _first,
                              evaluation=True)
    # Nested in another dataset, which holds its variant tensor only.
    _freed_with_the_last_user(
        lambda ids: tf.data.Dataset.from_tensors(segment_dataset(ids, 6, 5, start_step=2))
        .flat_map(lambda d: d), _first)


def test_a_distributed_dataset_is_read_after_the_callers_references_are_gone(two_replicas):
    """The iterator alone keeps the ids of `distribute_segments` (a dataset per
    input pipeline) and of `experimental_distribute_dataset`, which rebatches
    and auto-shards a dataset (new datasets over it) before iterating."""
    strategy = two_replicas

    def read(batch):
        return np.concatenate([v.numpy() for v in strategy.experimental_local_results(batch[0])])

    for evaluation in (False, True):
        _freed_with_the_last_user(lambda ids: distribute_segments(
            strategy, ids, 6, 5, start_step=2, evaluation=evaluation), read, evaluation)
    _freed_with_the_last_user(lambda ids: strategy.experimental_distribute_dataset(
        segment_dataset(ids, 6, 5, start_step=2)), read)


def test_a_dataset_built_in_a_tf_function_keeps_its_ids():
    """Its Python dataset lives only while the function is traced; the graph
    runs at every call."""
    ids = np.arange(4003, dtype=np.int32)
    first = collect(segment_dataset(ids, 6, 5), 3)

    @tf.function
    def total():
        return segment_dataset(ids, 6, 5).take(3).reduce(
            tf.zeros([6, 5], tf.int32), lambda acc, batch: acc + batch[0])

    for _ in range(2):
        np.testing.assert_array_equal(total().numpy(), sum(x for x, _ in first))


def test_a_freed_reader_says_so():
    streams = stream._Streams(np.arange(100), 4, 3, drop_remainder=True)
    reader = stream._Reader(streams, evaluation=False)
    np.testing.assert_array_equal(reader(1, 0, 4)[0], streams.train_pair(1, 0, 4)[0])
    del streams
    gc.collect()
    with pytest.raises(TxlError, match="ids of this segment dataset are freed"):
        reader(1, 0, 4)


def test_a_dataset_built_off_the_first_cpu_keeps_its_ids(two_replicas):
    """`experimental_distribute_dataset` rebuilds a dataset that is not on the
    input worker's device from its serialized graph, where no Python object
    of it is left: such a dataset keeps its ids for the life of the process."""
    ids = np.arange(4003, dtype=np.int32)
    freed = weakref.ref(ids)
    with tf.device("/cpu:1"):
        dataset = segment_dataset(ids, 6, 5)
    del dataset, ids
    gc.collect()
    assert freed() is not None


def test_a_segment_whose_window_cannot_fit_is_refused_before_it_is_made(monkeypatch):
    """`eval_segment_dataset(100 ids, 2, 10**9)` made a 7.5 GiB array of
    positions (a MemoryError, or 30 GiB once read) for streams of 50 ids; here
    the memory available is made 1 MiB."""
    from txl_tf.checks import memory_budget
    from txl_tf.checks.memory_budget import MemoryBudgetError
    from txl_tf.data.stream import eval_segment_dataset, segment_dataset
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 2 ** 20)
    ids = np.arange(100) % 7
    eval_segment_dataset(ids, 2, 10_000)
    with pytest.raises(MemoryBudgetError, match=r"^a segment of the streams \(batch 2, tgt_len "
                                                r"100,000\) needs at least 3\.2 MiB \(windows "
                                                r"2\.5 MiB\) .* lower tgt_len or the batch size$"):
        eval_segment_dataset(ids, 2, 100_000)
    with pytest.raises(MemoryBudgetError, match=r"^a segment of the streams \(batch 1, tgt_len "):
        segment_dataset(np.arange(200_000) % 7, 1, 100_000)


class _WorkerStub:
    """A strategy of 4 replicas over 2 input pipelines (workers), 2 replicas
    each, whose `distribute_datasets_from_function` builds worker 1's dataset
    (the rows a second worker reads; no cluster needed)."""
    num_replicas_in_sync = 4

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        return dataset_fn(tf.distribute.InputContext(num_input_pipelines=2,
                                                     input_pipeline_id=1,
                                                     num_replicas_in_sync=4))


@pytest.mark.parametrize("evaluation", [False, True])
def test_second_worker_reads_its_own_block_of_streams(evaluation):
    """Global batch 8 over 4 replicas: worker 1 holds replicas 2 and 3, so it
    serves streams [4, 6) then [6, 8) of every step, in that order."""
    ids = np.arange(4001, dtype=np.int32)
    B, T, start = 8, 5, 3
    worker = distribute_segments(_WorkerStub(), ids, B, T, start_step=start,
                                 evaluation=evaluation)
    reference = (eval_segment_dataset(ids, B, T, start_step=start) if evaluation
                 else segment_dataset(ids, B, T, start_step=start))
    got = collect(worker, 4)
    for s, ref in enumerate(collect(reference, 2)):
        for replica, rows in enumerate([slice(4, 6), slice(6, 8)]):
            for u, v in zip(got[2 * s + replica], ref):
                np.testing.assert_array_equal(u, v[rows], err_msg=f"step {s} replica {replica}")


def test_ids_of_rows_of_other_lengths_are_named():
    """Nested lists of other lengths were numpy's ValueError about an
    "inhomogeneous shape", which named neither the argument nor the fix."""
    for call in (lambda: batchify([[1, 2], [3]], 1),
                 lambda: segment_dataset([[1, 2, 3], [4]], 1, 1)):
        with pytest.raises(TxlError, match=r"^ids holds rows of other lengths: ids are one "
                                           r"1-D sequence"):
            call()
