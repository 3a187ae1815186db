"""Memory per row: a row's memory cleared at a document boundary while the
other rows keep theirs, in the core's `Memory`, the decode cache, the
document stream and `TransformerXLLM`'s fit / evaluate."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import TransformerXL, TransformerXLConfig, TransformerXLLM, TxlError
from txl_tf.data.documents import document_dataset, document_segments

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
        hidden, cache = core.cached_step(ids[:, t], cache)
        got = core.crit.log_probs(hidden).numpy()
        expected, alone = core(ids[:1, t:t + 1], alone)
        np.testing.assert_allclose(got[0], expected.numpy()[0, 0], atol=1e-5)
        kept, with_history = core(ids[:, t:t + 1], with_history)
        np.testing.assert_allclose(got[1], kept.numpy()[1, 0], atol=1e-5)


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
