"""A restart resumes only the run its checkpoints come from: another batch size,
corpus option or training data is refused by name; flags that change neither
the data nor the batches may change."""
import pytest

from training import train
from training.errors import TrainingError
from training.run_record import describe, differences
from job_helpers import write_text_corpus
from bfloat16_cpu import needs_bfloat16_matmuls


def _train(tmp_path, **options):
    base = dict(model_dir=str(tmp_path / "run"), dataset="text", preset="tiny",
                cache_dir=str(tmp_path / "cache"), strategy="one_device", train_steps=2,
                checkpoint_every=2, batch_size=2, verbose=0, final_eval=False)
    base.update(options)
    return train.run(**base)


def test_another_batch_size_is_refused(tmp_path):
    corpus = str(write_text_corpus(tmp_path / "corpus.txt", 5_000))
    _train(tmp_path, data_dir=corpus)
    with pytest.raises(TrainingError, match=r"cannot resume the checkpoints in .*run/checkpoints"
                                            r".*--batch_size was 2, now 4"):
        _train(tmp_path, data_dir=corpus, batch_size=4, train_steps=4)
    # Flags that change neither the data nor the batches may change on resume.
    result = _train(tmp_path, data_dir=corpus, train_steps=4, log_every=1, verbose=2,
                    eval_every=3, eval_max_segments=1, eval_batch_size=2, max_time_s=600,
                    keep_checkpoints=2)
    assert result["step"] == 4 and result["evaluations"][0]["step"] == 3


@needs_bfloat16_matmuls
def test_switching_float16_loss_scaling_is_refused(tmp_path):
    """Its optimizer state has another layout: the restore failed with a
    TensorFlow traceback (a dtype mismatch) instead of naming the flag."""
    corpus = str(write_text_corpus(tmp_path / "corpus.txt", 5_000))
    _train(tmp_path, data_dir=corpus, mixed_precision="none")
    with pytest.raises(TrainingError, match=r"float16 loss scaling \(--mixed_precision="
                                            r"mixed_float16\) was False, now True"):
        _train(tmp_path, data_dir=corpus, mixed_precision="mixed_float16", train_steps=4)
    assert _train(tmp_path, data_dir=corpus, mixed_precision="mixed_bfloat16",
                  train_steps=4)["step"] == 4


def test_another_corpus_option_is_refused(tmp_path):
    _train(tmp_path, dataset="pystdlib", corpus_option=["max_bytes=30000"])
    with pytest.raises(TrainingError, match=r"--corpus_option was \{'max_bytes': 30000\}, now "
                                            r"\{'max_bytes': 40000\}"):
        _train(tmp_path, dataset="pystdlib", corpus_option=["max_bytes=40000"])


def test_changed_or_moved_data():
    ids = list(range(100))
    record = describe("text", "/data/a.txt", {}, 4, 16, 1, 256, ids)
    moved = describe("text", "/elsewhere/a.txt", {}, 4, 16, 1, 256, ids)
    assert differences(record, moved) == []  # the same data in another place resumes
    edited = describe("text", "/data/a.txt", {}, 4, 16, 1, 256, ids[:-1] + [7])
    assert differences(record, edited)[0][0] == "the training data (the corpus files changed)"
    other = describe("text", "/data/b.txt", {}, 4, 16, 1, 256, ids[:-1] + [7])
    assert differences(record, other) == [("--data_dir", "/data/a.txt", "/data/b.txt")]
    assert differences(record, describe("wt2", "/data/a.txt", {}, 4, 16, 2, 256, ids)) == [
        ("--dataset", "text", "wt2"), ("the number of replicas (--strategy)", 1, 2)]
