"""The paper's evaluation protocol, restated in numpy, against the library's totals.

kimiyoung/transformer-xl's `pytorch/eval.py` reads a split through
`data_utils.LMOrderedIterator`: the ids are cut into `batch_size` streams of
`N // batch_size` ids (the last `N mod batch_size` ids dropped), stream `k` =
`ids[k*L:(k+1)*L]`; segment `i` reads positions `[i, i + seq_len)` with
`seq_len = min(tgt_len, L - 1 - i)` (the last one shorter, kept) and scores the
next ids; the memory starts empty and is carried from segment to segment; the
loss is `sum(seq_len * mean NLL of the segment) / sum(seq_len)`. The model is
`tests/reference_pytorch_numpy.py` (the PyTorch code's semantics).
"""
import math

import numpy as np
import pytest

from pytorch_fixtures import make_state
from reference_pytorch_numpy import PytorchReference
from training import evaluate
from training.errors import TrainingError
from txl_tf.learning.evaluation import evaluate_ids
from txl_tf.errors import TxlError
from txl_tf.text import ByteTokenizer
from txl_tf.weights import import_pytorch, save_pretrained

HYPER = dict(n_token=40, cutoffs=[10, 25], div_val=2, n_head=2, d_head=8)


@pytest.fixture(scope="module")
def state():
    return make_state(d_model=32, d_inner=48, n_layer=2, seed=7, **HYPER)


def paper_protocol(state, hyper, ids, batch_size, tgt_len, mem_len, clamp_len, same_length):
    """`(loss, tokens)` of `eval.py`'s `evaluate` over `LMOrderedIterator`."""
    n_step = len(ids) // batch_size
    data = np.asarray(ids[:n_step * batch_size]).reshape(batch_size, n_step).T  # [L, B]
    ref = PytorchReference(state, mem_len=mem_len, same_length=same_length,
                           clamp_len=clamp_len, **hyper)
    total_loss, total_len = 0.0, 0
    for i in range(0, n_step - 1, tgt_len):
        seq_len = min(tgt_len, n_step - 1 - i)
        inputs, target = data[i:i + seq_len], data[i + 1:i + 1 + seq_len]
        nll = -np.take_along_axis(ref.forward(inputs), target[..., None], -1)[..., 0]
        total_loss += seq_len * nll.mean()
        total_len += seq_len
    return total_loss / total_len, batch_size * total_len


@pytest.mark.parametrize("n,batch_size,tgt_len,mem_len,clamp_len,same_length", [
    (104, 3, 8, 12, -1, False),   # 104 mod 3 = 2 ids dropped, a last segment of 1
    (100, 4, 5, 4, 3, True),      # nothing dropped; memory shorter than a segment
    (203, 5, 7, 20, 4, True),     # 3 dropped, a memory longer than a segment
])
def test_drop_remainder_is_the_papers_protocol(state, n, batch_size, tgt_len, mem_len,
                                               clamp_len, same_length):
    ids = np.random.default_rng(n).integers(0, HYPER["n_token"], n).astype(np.int32)
    core = import_pytorch(state, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    want, tokens = paper_protocol(state, HYPER, ids, batch_size, tgt_len, mem_len, clamp_len,
                                  same_length)
    got = evaluate_ids(core, ids, batch_size, tgt_len, mem_len, drop_remainder=True)
    assert got["tokens"] == tokens == batch_size * (n // batch_size - 1)
    assert got["segments"] == math.ceil((n // batch_size - 1) / tgt_len)
    assert got["loss"] == pytest.approx(want, rel=1e-5)
    # By default every id is scored (streams of ceil(N / B) ids): the same as
    # the paper's exactly when N is a multiple of the batch size.
    every = evaluate_ids(core, ids, batch_size, tgt_len, mem_len)
    assert every["tokens"] == n - batch_size
    if n % batch_size == 0:
        assert every["loss"] == pytest.approx(want, rel=1e-5)
    else:
        assert every["loss"] != pytest.approx(want, rel=1e-7)


def test_the_evaluate_job_with_paper_settings_uses_the_papers_streams(state, tmp_path):
    byte_state = make_state(n_token=256, d_model=32, n_head=2, d_head=8, d_inner=48,
                            n_layer=2, seed=8)
    core = import_pytorch(byte_state)
    save_pretrained(core, tmp_path / "model", ByteTokenizer())
    text = tmp_path / "corpus.txt"
    rng = np.random.default_rng(3)
    text.write_bytes(bytes(rng.integers(97, 123, 2000).tolist()))
    valid = np.frombuffer(text.read_bytes()[1800:], np.uint8).astype(np.int32)  # 200 ids
    common = dict(model_dir=str(tmp_path / "model"), dataset="text", data_dir=str(text),
                  cache_dir=str(tmp_path / "cache"), split="valid", batch_size=3)
    # lm1b_base: tgt_len 32, mem_len 128, clamp_len -1, same_length
    result = evaluate.run(paper_settings="lm1b_base", **common)
    want, tokens = paper_protocol(byte_state, dict(n_token=256, n_head=2, d_head=8), valid, 3,
                                  32, 128, -1, True)
    assert result["tokens"] == tokens == 3 * (200 // 3 - 1) == 195
    assert result["loss"] == pytest.approx(want, rel=1e-5)
    assert result["drop_remainder"] is True
    every = evaluate.run(paper_settings="lm1b_base", drop_remainder=False, **common)
    assert every["tokens"] == 197 and every["drop_remainder"] is False
    given = evaluate.run(tgt_len=32, mem_len=128, same_length=True, drop_remainder=True,
                         **common)
    assert (given["tokens"], given["loss"]) == (result["tokens"], result["loss"])
    with pytest.raises(TrainingError, match=r"too short for --batch_size 150 with "
                                            r"--drop_remainder: 150 ids kept"):
        evaluate.run(**{**common, "batch_size": 150}, drop_remainder=True)


def test_drop_remainder_on_too_few_ids_names_the_ids_given_and_the_need(state):
    """5 ids in 3 streams keep 3 (streams of 1 id, nothing to score): the error
    said "3 ids are too few ... (need at least 4 ids)", counts of the ids left
    after the drop, so 4 or 5 ids looked enough; 2 * batch_size are needed."""
    core = import_pytorch(state)
    with pytest.raises(TxlError, match=r"^5 ids are too few for batch_size 3 with "
                                       r"drop_remainder: .*need at least 6 ids"):
        evaluate_ids(core, np.arange(5), 3, 4, 4, drop_remainder=True)
    assert evaluate_ids(core, np.arange(6), 3, 4, 4, drop_remainder=True)["tokens"] == 3
