"""Memory per row: a row's memory cleared at a document boundary while the
other rows keep theirs, in the core's `Memory`, the decode cache, the
document stream and `TransformerXLLM`'s fit / evaluate."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import Memory, TransformerXL, TransformerXLConfig, TransformerXLLM, TxlError
from txl_tf.data.documents import (distribute_documents, document_dataset, document_segments,
                                   split_documents)
from training.strategy import mirrored_strategy

N_TOKEN, T, M = 40, 4, 8


@pytest.fixture(scope="module")
def core():
    keras.utils.set_random_seed(2)
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3,
                                                    tgt_len=T, mem_len=M))


def read(core, ids, memory):
    """Reads `ids [B, L]` segment by segment; log-probs `[B, L, V]`, memory."""
    out = []
    for start in range(0, ids.shape[1], T):
        lp, memory = core(ids[:, start:start + T], memory)
        out.append(lp.numpy())
    return np.concatenate(out, 1), memory


def test_a_reset_row_reads_its_next_document_as_if_alone_and_the_others_go_on(core):
    rng = np.random.default_rng(0)
    first, second = (rng.integers(0, N_TOKEN, [2, 3 * T]).astype(np.int32) for _ in range(2))
    _, memory = read(core, first, core.initial_memory(2))
    kept, _ = read(core, second, memory)
    reset, _ = read(core, second, memory.reset_rows([True, False]))
    fresh = core.initial_memory(2)
    row_0_fresh = type(memory)(tf.concat([fresh.mems[:, :1], memory.mems[:, 1:]], 1),
                               tf.concat([fresh.mem_mask[:1], memory.mem_mask[1:]], 0))
    restarted, _ = read(core, second, row_0_fresh)
    np.testing.assert_array_equal(reset, restarted)  # a reset row is a fresh start, bit for bit
    np.testing.assert_array_equal(reset[1], kept[1])
    alone, _ = read(core, second[:1], core.initial_memory(1))  # batch 1: other summation order
    np.testing.assert_allclose(reset[0], alone[0], rtol=1e-6, atol=1e-6)
    assert np.abs(kept[0] - alone[0]).max() > 1e-3  # without the reset, A leaks into B


def test_reset_rows_of_a_zero_filled_memory_is_a_fresh_zero_filled_start(core):
    memory = core.initial_memory(2, zero_filled=True)
    _, memory = core(np.ones([2, T], np.int32), memory)
    reset = memory.reset_rows(tf.constant([False, True]), zero_filled=True)
    fresh = core.initial_memory(1, zero_filled=True)
    np.testing.assert_array_equal(reset.mems[:, 1], fresh.mems[:, 0])
    np.testing.assert_array_equal(reset.mem_mask[1], fresh.mem_mask[0])
    np.testing.assert_array_equal(reset.mems[:, 0], memory.mems[:, 0])


def test_a_decode_cache_row_reset_decodes_from_an_empty_memory(core):
    rng = np.random.default_rng(1)
    history = rng.integers(0, N_TOKEN, [2, 2 * T]).astype(np.int32)
    _, memory = read(core, history, core.initial_memory(2))
    cache = core.decode_cache(memory).reset_rows(tf.constant([True, False]))
    ids = rng.integers(0, N_TOKEN, [2, 5]).astype(np.int32)
    alone, with_history = core.initial_memory(1), memory
    for t in range(ids.shape[1]):
        hidden, cache = core.call_with_cache(ids[:, t], cache)
        got = core.crit.log_probs(hidden).numpy()
        expected, alone = core(ids[:1, t:t + 1], alone)
        np.testing.assert_allclose(got[0], expected.numpy()[0, 0], atol=1e-5)
        kept, with_history = core(ids[:, t:t + 1], with_history)
        np.testing.assert_allclose(got[1], kept.numpy()[1, 0], atol=1e-5)


def test_a_decode_cache_row_reset_decodes_again_after_its_states_went_nan(core):
    """A reset only marked the row's slots empty: a NaN state stayed in its
    rings, where the hidden slots' weight 0 times the NaN value is NaN, so
    the row never decoded again (`Memory.reset_rows` zeroes its states)."""
    rng = np.random.default_rng(2)
    mems = rng.normal(size=(core.config.n_layer, 2, 3, core.config.d_model)).astype(np.float32)
    mems[0, 0, 1] = np.nan
    cache = core.decode_cache(Memory(mems, np.ones((2, 3), bool)))
    ids = rng.integers(0, N_TOKEN, [2, 3]).astype(np.int32)
    hidden, cache = core.call_with_cache(ids[:, 0], cache)
    assert not np.isfinite(hidden.numpy()[0]).all() and np.isfinite(hidden.numpy()[1]).all()
    cache = cache.reset_rows(tf.constant([True, False]))
    alone = core.initial_memory(1)
    for t in (1, 2):
        hidden, cache = core.call_with_cache(ids[:, t], cache)
        expected, alone = core(ids[:1, t:t + 1], alone)
        np.testing.assert_allclose(core.crit.log_probs(hidden).numpy()[0],
                                   expected.numpy()[0, 0], atol=1e-5)


def test_documents_are_laid_out_as_streams_of_whole_segments():
    docs = [np.arange(1, 7), np.arange(10, 13), np.arange(20, 30)]
    token_ids, labels, weights, start = document_segments(docs, batch_size=2, tgt_len=T)
    # doc 0 (5 predictions: 2 segments) to row 0, doc 1 (2: 1) to row 1, doc 2 (9: 3) to row 1
    assert token_ids.shape == (4, 2, T)
    np.testing.assert_array_equal(start[:, 0], [True, False, True, True])
    np.testing.assert_array_equal(start[:, 1], [True, True, False, False])
    np.testing.assert_array_equal(token_ids[1, 0], [5, 0, 0, 0])
    np.testing.assert_array_equal(labels[1, 0], [6, 0, 0, 0])
    np.testing.assert_array_equal(weights[1, 0], [1, 0, 0, 0])
    np.testing.assert_array_equal(token_ids[0, 1], [10, 11, 0, 0])
    np.testing.assert_array_equal(token_ids[1, 1], [20, 21, 22, 23])
    assert weights[2:, 0].sum() == 0  # row 0 ends early: empty segments
    assert weights.sum() == 5 + 2 + 9


@pytest.mark.parametrize("docs, message", [([], "no documents"), ([[1]], "at least 2"),
                                           ([[1, -2]], "negative id")])
def test_bad_documents_are_one_clear_error(docs, message):
    with pytest.raises(TxlError, match=message):
        document_segments(docs, 2, T)


def test_the_first_bad_document_is_named_whatever_block_it_is_checked_in(monkeypatch):
    """The ids are checked a block of documents at a time: the error names
    the first bad document, an id out of range before a later bad shape."""
    from txl_tf.data import documents
    monkeypatch.setattr(documents, "_SEGMENT_BLOCK", 5)
    good = [[1, 2]] * 7
    for docs, message in [(good + [[3, -4, 5]] + good + [[-9, 2]],
                           "document 7 holds a negative id"),
                          (good + [[2**40, -1], [1]], r"document 7 holds a negative id \(-1\)"),
                          (good + [np.array([3, 2**33])], "document 7 holds id 8589934592"),
                          (good + [[1], [2**33, 1]], "document 7 must be a 1-D"),
                          ([np.arange(12)] + good + [[1.0, 2.0]], "document 8 must be a 1-D")]:
        with pytest.raises(TxlError, match=message):
            document_segments(docs, 2, T)


def test_fit_and_evaluate_over_documents_give_each_documents_own_loss(core):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, N_TOKEN, n) for n in (9, 14, 5, 11, 7)]
    total, count = 0.0, 0
    for doc in docs:  # each document alone, from an empty memory
        ids = np.asarray(doc, np.int32)[None]
        lp, _ = read(core, ids[:, :-1], core.initial_memory(1))
        total -= np.take_along_axis(lp[0], ids[0, 1:, None], -1).sum()
        count += ids.shape[1] - 1
    model = TransformerXLLM(core.config, batch_size=2)
    model.core.set_weights(core.get_weights())
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0))
    dataset = document_dataset(docs, batch_size=2, tgt_len=T)
    logs = model.evaluate(dataset, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["loss"], total / count, rtol=1e-5)
    history = model.fit(dataset, epochs=1, verbose=0)  # learning rate 0: the same loss
    np.testing.assert_allclose(history.history["loss"][0], total / count, rtol=1e-5)


def test_a_corpus_is_cut_into_documents_after_each_separator():
    docs = split_documents([5, 6, 1, 7, 1, 1, 8, 9], separator=1)
    assert [d.tolist() for d in docs] == [[5, 6, 1], [7, 1], [8, 9]]  # [1] alone: dropped


@pytest.mark.parametrize("ids", [np.array(5), None, [[5, 6, 1], [7, 8, 9]]])
def test_a_corpus_not_1d_is_one_clear_error(ids):
    with pytest.raises(TxlError, match="ids must be 1-D"):
        split_documents(ids, separator=1)


def test_distributed_documents_keep_each_row_on_its_replica_at_every_step():
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    docs = [np.arange(1, 9), np.arange(10, 14), np.arange(20, 31), np.arange(40, 46)]
    token_ids, _, weights, start = document_segments(docs, batch_size=4, tgt_len=T)
    steps = token_ids.shape[0]
    dataset = distribute_documents(strategy, docs, global_batch_size=4, tgt_len=T,
                                   start_step=steps - 1)
    batches = iter(dataset)
    for step in (steps - 1, steps, steps + 1):  # the last segment, then the layout again
        inputs, _, got_weights = next(batches)
        for r, part in enumerate(strategy.experimental_local_results(inputs["token_ids"])):
            np.testing.assert_array_equal(part, token_ids[step % steps, 2 * r:2 * r + 2])
        starts = strategy.experimental_local_results(inputs["document_start"])
        np.testing.assert_array_equal(np.concatenate(starts), start[step % steps])
        np.testing.assert_array_equal(
            np.concatenate(strategy.experimental_local_results(got_weights)),
            weights[step % steps])



class _SecondWorker:
    """A strategy of 4 replicas over 2 input pipelines (2 replicas each) that
    builds worker 1's dataset (no cluster needed)."""
    num_replicas_in_sync = 4

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        return dataset_fn(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                                     num_replicas_in_sync=4))


def test_the_second_worker_serves_its_own_block_of_rows():
    """Global batch 8 over 4 replicas: worker 1 holds replicas 2 and 3, so it
    serves rows [4, 6) then [6, 8) of each step's layout."""
    docs = [np.arange(100 * k + 1, 100 * k + 4 + 3 * k) for k in range(10)]
    layout = document_segments(docs, batch_size=8, tgt_len=T)
    got = list(distribute_documents(_SecondWorker(), docs, global_batch_size=8, tgt_len=T)
               .take(4))
    for i, (inputs, labels, weights) in enumerate(got):
        step, rows = i // 2, slice(4 + 2 * (i % 2), 6 + 2 * (i % 2))
        for part, want in zip((inputs["token_ids"], labels, weights, inputs["document_start"]),
                              layout):
            np.testing.assert_array_equal(part.numpy(), want[step, rows], err_msg=f"element {i}")


def _train(tmp_path, **options):
    from job_helpers import write_text_corpus
    from training import train
    tmp_path.mkdir(exist_ok=True)
    corpus = write_text_corpus(tmp_path / "corpus.txt", 5_000)
    base = dict(model_dir=str(tmp_path / "run"), dataset="text", data_dir=str(corpus),
                preset="tiny", cache_dir=str(tmp_path / "cache"), strategy="one_device",
                train_steps=3, batch_size=2, verbose=0, final_eval=False)
    return train.run(**{**base, **options})


def test_the_training_job_reads_one_document_per_line_and_resumes_only_so(tmp_path):
    from training.errors import TrainingError
    result = _train(tmp_path, document_separator=10)  # the byte of a line end
    assert result["step"] == 3 and np.isfinite(result["train"]["loss"])
    with pytest.raises(TrainingError, match=r"--document_separator"):
        _train(tmp_path, train_steps=4)  # the same run as one stream: refused
    with pytest.raises(TrainingError, match=r"--document_separator must be an id >= 0"):
        _train(tmp_path / "other", document_separator=-1)
    with pytest.raises(TrainingError, match=r"holds no such id"):
        _train(tmp_path / "third", document_separator=0)


def test_distributed_documents_hold_the_ids_not_the_padded_batches():
    """The training job's documents (`--document_separator`) were laid out
    as every batch at once, 12 bytes a position, a short document's segment
    mostly padding: 20 MB of text, one document a line, took 1.7 GB at
    tgt_len 512. Now the ids once and each segment's start and length."""
    import tracemalloc
    docs = [np.arange(k % 50, k % 50 + 4) for k in range(4000)]  # 16,000 ids
    layout = document_segments(docs, batch_size=4, tgt_len=512)  # 1,000 steps: 24 MB
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    tracemalloc.start()
    dataset = distribute_documents(strategy, docs, global_batch_size=4, tgt_len=512,
                                   start_step=998)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak
    for step, (inputs, labels, weights) in zip((998, 999, 1000), dataset):
        for got, want in zip((inputs["token_ids"], labels, weights, inputs["document_start"]),
                             layout):
            np.testing.assert_array_equal(got.numpy(), want[step % 1000])


def test_distributed_documents_keep_no_numpy_copy_of_the_ids():
    """The dataset's function kept the joined ids as numpy beside the
    TensorFlow tensor it made of them: the ids twice for the run's life."""
    import tracemalloc
    docs = [np.arange(k, k + 1000) for k in range(1000)]  # 1,000,000 ids: 4 MB as int32
    layout = document_segments(docs, batch_size=4, tgt_len=512)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    tracemalloc.start(30)
    dataset = distribute_documents(strategy, docs, global_batch_size=4, tgt_len=512,
                                   start_step=7)
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # The one copy that must be held, TensorFlow's tensor of the ids, is at times
    # allocated where tracemalloc sees it (made in constant_op.py): not counted.
    held = sum(stat.size for stat in snapshot.statistics("traceback")
               if not any(frame.filename.endswith("constant_op.py") for frame in stat.traceback))
    assert held < 1 << 20, held
    inputs, labels, weights = next(iter(dataset))
    for got, want in zip((inputs["token_ids"], labels, weights, inputs["document_start"]),
                         layout):
        np.testing.assert_array_equal(got.numpy(), want[7])


def test_distributed_documents_name_a_batch_or_start_step_they_cannot_take():
    docs = [np.arange(1, 9), np.arange(10, 14)]
    with pytest.raises(TxlError, match=r"^global_batch_size 3 is not divisible by the 2 "
                                       r"replicas of MirroredStrategy$"):
        distribute_documents(mirrored_strategy(["/cpu:0", "/cpu:1"]), docs,
                             global_batch_size=3, tgt_len=T)
    for bad in (-1, 1.5):
        with pytest.raises(TxlError, match=rf"^start_step must be an int >= 0, got {bad}$"):
            distribute_documents(tf.distribute.OneDeviceStrategy("/cpu:0"), docs,
                                 global_batch_size=2, tgt_len=T, start_step=bad)
