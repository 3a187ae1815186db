"""Flags wrong on their own, named by the jobs' `run` before anything loads
(the command lines run the same checks; these run them in process)."""
import pytest

from training import attention_picture, demo, evaluate, train_lstm
from training.errors import TrainingError


@pytest.mark.parametrize("job, options, message", [
    (evaluate, dict(tgt_len=0), r"--tgt_len must be positive, got 0"),
    (evaluate, dict(batch_size=0), r"--batch_size must be positive, got 0"),
    (attention_picture, dict(), r"--output \(a \.png file\) is required"),
    (attention_picture, dict(output="a.png", text=""), r"--text must not be empty"),
    (attention_picture, dict(output="a.png", text="ab", max_labels=-1),
     r"--max_labels must be >= 0, got -1"),
    (train_lstm, dict(dropout=1.0), r"--dropout must be in \[0, 1\), got 1.0"),
    (train_lstm, dict(warmup_steps=-1), r"--warmup_steps must be >= 0, got -1"),
    (demo, dict(num_tokens=2**31), r"--num_tokens must be in \[0, 1073741824\], got 2147483648"),
])
def test_a_flag_wrong_on_its_own_is_named(tmp_path, job, options, message):
    where = {"model" if job is demo else "model_dir": str(tmp_path / "nowhere")}
    with pytest.raises(TrainingError, match=f"^{message}$"):
        job.run(**where, **options)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    (None, r"--text_file '.*text.txt' does not exist"),
    (b"\xff\xfe", r"--text_file '.*text.txt' is not valid UTF-8: .*"),
    (b"", r"--text_file '.*text.txt' is empty"),
])
def test_an_attention_text_file_that_cannot_be_read_is_named(tmp_path, content, message):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TrainingError, match=f"^{message}$"):
        attention_picture.run(model_dir=str(tmp_path / "nowhere"),
                              output=str(tmp_path / "a.png"), text_file=str(path))
    assert not (tmp_path / "a.png").exists()
