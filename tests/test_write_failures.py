"""The file system saying no under a job (a full disk, a file size limit): the
error names the path being written, what was there before is intact, and no
temporary is left behind. No root and no mount: a full disk is /dev/full or
an `OSError` raised at the write, a file size limit `RLIMIT_FSIZE` in a
subprocess."""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from export import onnx_export
from export.staging import staged_folder, staged_folders
from txl_tf.app import files
from txl_tf.app.exits import one_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write or a close raises it

# Under a 4 kB file size limit (SIGXFSZ ignored: a write past it fails with
# EFBIG), each of the jobs' writers writes more than that over a file of the
# previous run; prints one JSON line per writer: its error and the folder after.
FILE_SIZE_LIMIT = r"""
import json, os, resource, signal, sys
from training.files import log_record, save_vocab, write_atomically
folder = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

class Tokenizer:
    def save(self, directory):
        os.makedirs(directory)
        with open(os.path.join(directory, "tokenizer.json"), "w") as f:
            f.write("x" * 10_000)

writers = {
    "write_atomically": lambda: write_atomically(os.path.join(folder, "config.json"),
                                                 "y" * 10_000),
    "save_vocab": lambda: save_vocab(Tokenizer(), os.path.join(folder, "vocab")),
    "log_record": lambda: log_record(os.path.join(folder, "eval_log.jsonl"),
                                     {"step": 2, "pad": "z" * 10_000}),
}
for name, write in writers.items():
    try:
        write()
        error = None
    except OSError as err:
        error = str(err)
    print(json.dumps({"writer": name, "error": error, "files": sorted(
        os.path.relpath(os.path.join(d, f), folder)
        for d, _, names in os.walk(folder) for f in names)}), flush=True)
"""


def test_the_jobs_writers_name_the_path_and_leave_no_temporary(tmp_path):
    folder = tmp_path / "run"
    (folder / "vocab").mkdir(parents=True)
    (folder / "config.json").write_text("old config")
    (folder / "vocab" / "tokenizer.json").write_text("old vocab")
    (folder / "eval_log.jsonl").write_text('{"step": 1}\n')
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_BACKEND": "tensorflow"}
    proc = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(folder)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["writer"]: row for row in map(json.loads, proc.stdout.splitlines())}
    before = ["config.json", "eval_log.jsonl", os.path.join("vocab", "tokenizer.json")]
    too_large = os.strerror(errno.EFBIG)
    for writer, name in [("write_atomically", "config.json"), ("save_vocab", "vocab"),
                         ("log_record", "eval_log.jsonl")]:
        row = rows[writer]
        assert row["error"] == f"cannot write {str(folder / name)!r}: {too_large}", row
        assert row["files"] == before, f"{writer} left {row['files']}"
    assert (folder / "config.json").read_text() == "old config"
    assert (folder / "vocab" / "tokenizer.json").read_text() == "old vocab"
    assert json.loads((folder / "eval_log.jsonl").read_text().splitlines()[0]) == {"step": 1}


def test_save_vocab_names_the_final_path_not_its_staging_folder(tmp_path):
    from training.files import save_vocab

    class Tokenizer:  # a file it cannot create: no inode left
        def save(self, directory):
            os.makedirs(directory)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          os.path.join(directory, "vocab.txt"))

    with pytest.raises(files.WriteError) as caught:
        save_vocab(Tokenizer(), str(tmp_path / "vocab"))
    assert str(caught.value) == \
        f"cannot write {str(tmp_path / 'vocab' / 'vocab.txt')!r}: No space left on device"
    assert os.listdir(tmp_path) == []


def test_a_full_disk_in_a_staged_save_names_its_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("old")
    with pytest.raises(files.WriteError) as caught:
        with files.stage(str(folder / "config.json")) as staged:
            with open(staged.path(str(folder / "weights.npz")), "w") as f:
                f.write("half")
            raise ENOSPC
    assert str(caught.value) == f"cannot write {str(folder)!r}: No space left on device"
    assert caught.value.errno == errno.ENOSPC
    assert os.listdir(folder) == ["config.json"] and (folder / "config.json").read_text() == "old"

    with pytest.raises(files.WriteError, match=r"^cannot write '.*picture\.png': No space"):
        with files.replacing(str(tmp_path / "picture.png")) as temporary:
            open(temporary, "w").close()
            raise ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_a_short_write_names_the_output_folder(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "previous").write_text("good")
    with pytest.raises(files.WriteError) as caught:  # numpy's tofile at a full disk
        with staged_folder(str(out)):
            raise OSError("1024 requested and 596 written")
    assert one_line(caught.value) == f"cannot write {str(out)!r}: 1024 requested and 596 written"
    assert sorted(os.listdir(tmp_path)) == ["export"] and os.listdir(out) == ["previous"]


def test_a_short_write_of_a_staged_save_in_an_export_names_the_output_folder(tmp_path):
    """A `stage` save inside `staged_folder` (a model folder in an export):
    the inner save makes numpy's short write (no errno) a `WriteError` naming
    its folder in the staging folder; the export names it by its final path,
    not the hidden staging folder (`is_write_error` said a `WriteError`
    without an errno was no write's)."""
    out = tmp_path / "export"
    with pytest.raises(files.WriteError) as caught:
        with staged_folder(str(out)) as staging:
            with files.stage(os.path.join(staging, "model", "config.json")):
                raise OSError("1024 requested and 596 written")
    assert one_line(caught.value) == (f"cannot write {str(out / 'model')!r}: 1024 requested "
                                      "and 596 written")
    assert files.is_write_error(caught.value) and os.listdir(tmp_path) == []


def test_a_file_of_the_staging_folder_is_named_by_its_final_path(tmp_path):
    out = tmp_path / "export"
    with pytest.raises(files.WriteError) as caught:
        with staged_folder(str(out)) as staging:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG),
                          os.path.join(staging, "model.onnx"))
    assert str(caught.value) == f"cannot write {str(out / 'model.onnx')!r}: File too large"
    assert os.listdir(tmp_path) == []

    with pytest.raises(FileNotFoundError, match="elsewhere"):  # not a write into the export
        with staged_folder(str(out)):
            raise FileNotFoundError(errno.ENOENT, "no such file", str(tmp_path / "elsewhere"))


def test_a_tensorflow_write_error_names_the_output_folder(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "previous").write_text("good")
    with pytest.raises(files.WriteError) as caught:  # how tf.saved_model.save fails
        with staged_folder(str(out)) as staging:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{staging}/saved_model/saved_model.pb.tmp1f2e; "
                "No space left on device [Op:SaveV2]")
    assert str(caught.value) == f"cannot write {str(out)!r}: No space left on device"
    assert os.listdir(out) == ["previous"] and sorted(os.listdir(tmp_path)) == ["export"]

    repo = tmp_path / "triton"
    with pytest.raises(files.WriteError, match=r"^cannot write '.*triton/txl/1': No space"):
        with staged_folders(str(repo), ["txl"]) as folders:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          os.path.join(folders["txl"], "1"))
    assert os.listdir(repo) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_onnx_weights_at_a_full_disk_say_so():
    array = np.arange(5000, dtype=np.float32)
    with open("/dev/full", "wb", buffering=0) as f:
        with pytest.raises(OSError) as caught:
            onnx_export._write_array(f, array)
    assert caught.value.errno == errno.ENOSPC  # numpy's tofile: "... requested and 0 written"


def test_onnx_weights_are_written_as_tofile_wrote_them(tmp_path):
    for array in [np.arange(7, dtype=np.float16).reshape(7, 1), np.ones([3], np.bool_),
                  np.float32(2.5) * np.ones([2, 3], np.float32).T, np.array(3, np.int64)]:
        with open(tmp_path / "a", "wb") as f:
            onnx_export._write_array(f, array)
        array.tofile(str(tmp_path / "b"))
        assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


# The LSTM baseline's HDF5 weights under a 16 kB file size limit.
HDF5_LIMIT = r"""
import os, resource, signal, sys
import numpy as np
from txl_tf.baselines import lstm
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
try:
    lstm._write_weights(sys.argv[1], {"lstm/kernel": np.ones(20_000, np.float32)})
except OSError as err:
    print(f"OSError {err.errno}")
"""


def test_hdf5_weights_past_a_file_size_limit_are_an_os_error(tmp_path):
    # HDF5 writing to the file itself raised a RuntimeError at the limit and
    # crashed the process (a segmentation fault) at a full disk.
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_BACKEND": "tensorflow"}
    path = tmp_path / ".tmp-1-model.weights.h5"
    proc = subprocess.run([sys.executable, "-c", HDF5_LIMIT, str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"OSError {errno.EFBIG}", \
        proc.stderr[-3000:]
    assert os.listdir(tmp_path) == [path.name]  # the temporary `stage` deletes


def test_a_read_only_parent_names_the_output_folder(tmp_path, monkeypatch):
    out = tmp_path / "export"

    def read_only(prefix, dir):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix + "x"))

    monkeypatch.setattr("export.staging.tempfile.mkdtemp", read_only)
    with pytest.raises(files.WriteError) as caught:
        with staged_folder(str(out)):
            pass
    assert str(caught.value) == f"cannot write {str(out)!r}: Read-only file system"
    repo = tmp_path / "triton"  # a Triton repository's model folders: not the hidden one
    with pytest.raises(files.WriteError) as caught:
        with staged_folders(str(repo), ["txl"]):
            pass
    assert str(caught.value) == f"cannot write {str(repo)!r}: Read-only file system"


def test_a_full_disk_while_the_corpus_cache_builds_names_the_cache(tmp_path, monkeypatch):
    from txl_tf.data import cache as cache_lib, load_corpus

    (tmp_path / "corpus.txt").write_text("the river and the city .\n" * 400)

    def full(self, ids):
        raise ENOSPC

    monkeypatch.setattr(cache_lib.NpyWriter, "append", full)
    cache = tmp_path / "cache"
    with pytest.raises(files.WriteError) as caught:
        load_corpus("text", str(tmp_path / "corpus.txt"), cache_dir=str(cache))
    assert str(caught.value) == f"cannot write {str(cache)!r}: No space left on device"
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # the build folder went
    monkeypatch.undo()
    assert len(load_corpus("text", str(tmp_path / "corpus.txt"), cache_dir=str(cache)).train)


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc/self/mem")
def test_a_read_error_while_the_corpus_cache_builds_names_the_file_read(tmp_path):
    """A read() that fails (EIO, as /proc/self/mem's first page gives) names
    no file: the cache build named it `cannot write '<cache_dir>'`."""
    from txl_tf.data import load_corpus
    from txl_tf.data.corpora import iter_text_chunks

    for cache in (str(tmp_path / "cache"), None):
        with pytest.raises(OSError) as caught:
            load_corpus("text", "/proc/self/mem", cache_dir=cache, use_cache=cache is not None)
        assert not isinstance(caught.value, files.WriteError), caught.value
        assert (caught.value.errno, caught.value.filename) == (errno.EIO, "/proc/self/mem")
    with pytest.raises(OSError) as caught:
        list(iter_text_chunks(Path("/proc/self/mem")))
    assert (caught.value.errno, caught.value.filename) == (errno.EIO, "/proc/self/mem")


def test_a_staged_save_names_the_final_path_not_its_temporary(tmp_path):
    folder = tmp_path / "classifier"
    with pytest.raises(files.WriteError) as caught:
        with files.stage(str(folder / "classifier.keras")) as staged:
            temporary = staged.path(str(folder / "vocab"))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          os.path.join(temporary, "tokenizer.json"))
    assert str(caught.value) == \
        f"cannot write {str(folder / 'vocab' / 'tokenizer.json')!r}: No space left on device"
    with pytest.raises(files.WriteError, match=r"^cannot write '.*/classifier/flags\.json': No"):
        with files.stage(str(folder / "classifier.keras")) as staged:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          staged.path(str(folder / "flags.json")) + ".tmp")
    assert os.listdir(folder) == []


def test_a_staged_file_is_not_named_by_a_staged_folder_its_name_starts_with(tmp_path):
    folder = tmp_path / "model"
    for first, failed in [("vocab", "vocab.json"), ("vocab.json", "vocab")]:
        with pytest.raises(files.WriteError) as caught:
            with files.stage(str(folder / "config.json")) as staged:
                staged.path(str(folder / first))
                temporary = staged.path(str(folder / failed))
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), temporary)
        assert caught.value.filename == str(folder / failed), (first, failed)


# keras-hub's save_to_preset of a backbone under a 64 kB file size limit.
PRESET_LIMIT = r"""
import resource, signal, sys
from txl_tf import TransformerXLConfig
from txl_tf.models.transformer_xl import TransformerXLBackbone
backbone = TransformerXLBackbone(**TransformerXLConfig.preset("tiny").to_dict())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
try:
    backbone.save_to_preset(sys.argv[1])
except OSError as err:
    print(err)
"""


def test_save_to_preset_past_a_file_size_limit_is_one_error(tmp_path):
    # Keras's HDF5 store writing to the file itself raised a RuntimeError at
    # the limit and crashed the process (a segmentation fault) at a full disk.
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2",
           "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": ""}
    preset = tmp_path / "preset"
    proc = subprocess.run([sys.executable, "-c", PRESET_LIMIT, str(preset)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == \
        f"cannot write {str(preset)!r}: {os.strerror(errno.EFBIG)}", proc.stderr[-3000:]
    assert os.listdir(preset) == []


def test_a_full_disk_at_the_lock_file_names_it(tmp_path, monkeypatch):
    from training import lock
    from training.errors import TrainingError

    def full_open(path, *args, **kwargs):
        f = open(path, *args, **kwargs)

        def flush():
            raise ENOSPC
        f.flush = flush
        return f

    monkeypatch.setattr(lock, "open", full_open, raising=False)
    path = lock.lock_path(tmp_path)
    with pytest.raises(TrainingError, match=rf"^cannot write the lock file {path} of --model_dir "
                                            r"x: No space left on device$"):
        lock.DirectoryLock(path, "--model_dir x")
    monkeypatch.undo()
    lock.DirectoryLock(path, "--model_dir x").release()  # not held


def test_errors_that_are_no_writes_keep_their_type_and_message(tmp_path):
    """Any `OSError` naming no file (a broken pipe, a read's error,
    `shutil.Error` of a copy) and any of TensorFlow's errors naming the
    staging folder became `cannot write '<path>'`."""
    folder = tmp_path / "model"
    stale = OSError(errno.ESTALE, os.strerror(errno.ESTALE))  # a read of a network file
    copy = shutil.Error([("a", "b", "[Errno 5] Input/output error")])
    for err in [BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)), stale, copy]:
        assert files.naming(err, str(folder)) is err
        with pytest.raises(type(err)) as caught:
            with files.stage(str(folder / "config.json")):
                raise err
        assert caught.value is err
        with pytest.raises(type(err)) as caught:
            with staged_folder(str(tmp_path / "export")):
                raise err
        assert caught.value is err
    with pytest.raises(FileNotFoundError) as caught:  # reading back a staged file
        with files.stage(str(folder / "config.json")) as staged:
            missing = staged.path(str(folder / "weights.npz"))
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), missing)
    assert caught.value.filename == missing
    with pytest.raises(tf.errors.NotFoundError):
        with staged_folder(str(tmp_path / "export")) as staging:
            raise tf.errors.NotFoundError(None, None, f"{staging}/vocab.txt; No such file or "
                                          "directory [Op:ReadFile]")
    for err in [ENOSPC, OSError("1024 requested and 596 written")]:  # still writes
        assert isinstance(files.naming(err, str(folder)), files.WriteError)
    assert sorted(os.listdir(tmp_path)) == ["model"] and os.listdir(folder) == []


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc/self/mem")
def test_a_read_error_of_a_vocabulary_file_names_it(tmp_path):
    """A vocabulary file whose read() failed (EIO) named no file: under the
    corpus cache's build (lm1b's `vocab_file`) the error read `cannot write
    '<cache_dir>': Input/output error`."""
    from txl_tf.data import load_corpus
    from txl_tf.text.word import WordTokenizer

    with pytest.raises(OSError) as caught:
        WordTokenizer.from_vocab_file("/proc/self/mem")
    assert (caught.value.errno, caught.value.filename) == (errno.EIO, "/proc/self/mem")
    root = tmp_path / "lm1b"
    for folder, name in [("training-monolingual.tokenized.shuffled", "news.en-00001-of-00100"),
                         ("heldout-monolingual.tokenized.shuffled",
                          "news.en.heldout-00000-of-00050"),
                         ("heldout-monolingual.tokenized.shuffled",
                          "news.en.heldout-00001-of-00050")]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text("the cat sat .\n")
    with pytest.raises(OSError) as caught:
        load_corpus("lm1b", str(root), cache_dir=str(tmp_path / "cache"),
                    vocab_file="/proc/self/mem")
    assert not isinstance(caught.value, files.WriteError), caught.value
    assert (caught.value.errno, caught.value.filename) == (errno.EIO, "/proc/self/mem")
