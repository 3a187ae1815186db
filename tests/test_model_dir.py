"""One loader for model directories and training run directories."""
import gc
import io
import re
import warnings
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from export import ModelDirError
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.text import ByteTokenizer
from txl_tf.weights import save_pretrained
from txl_tf.weights.checkpoints import weight_dict
from txl_tf.weights.model_dir import load, load_core, resolve


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A training run directory: config.json and checkpoints/ckpt-3, no export yet."""
    run = tmp_path_factory.mktemp("run")
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    core.config.to_json(str(run / "config.json"))
    tf.train.CheckpointManager(tf.train.Checkpoint(weights=weight_dict(core)),
                               str(run / "checkpoints"), 2).save(checkpoint_number=3)
    return run, core


def same_weights(a, b):
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.weights, b.weights))


def test_run_directory_forms(run, tmp_path):
    path, core = run
    source = resolve(str(path))
    assert source.weights_kind == "checkpoint" and source.weights_path.endswith("ckpt-3")
    assert same_weights(load(str(path))[0], core)
    assert resolve(str(path), checkpoint="ckpt-3").weights_path.endswith("ckpt-3")
    with pytest.raises(ModelDirError,
                       match=r"checkpoint 'ckpt-9' not found .*checkpoints holds ckpt-3$"):
        resolve(str(path), checkpoint="ckpt-9")
    exported = tmp_path / "run"
    exported.mkdir()
    save_pretrained(core, exported / "export")
    ByteTokenizer().save(str(exported / "export" / "vocab"))
    loaded, source = load(str(exported))  # the export job takes the run directory
    assert source.config_path.endswith("export/config.json") and source.vocab_dir
    assert same_weights(loaded, core)


def test_an_export_older_than_the_newest_checkpoint_is_named_on_stderr(run, tmp_path, capsys):
    """A run resumed with a higher --train_steps and stopped before its end
    keeps the export/ of its first end: the run directory still gives it
    (the documented order), with a warning naming the newer checkpoint."""
    import os
    import shutil
    path, core = run
    resumed = shutil.copytree(path, tmp_path / "run")
    save_pretrained(core, resumed / "export")
    index = resumed / "checkpoints" / "ckpt-3.index"
    exported = os.stat(resumed / "export" / "weights.npz").st_mtime_ns
    os.utime(index, ns=(exported + 10 ** 9, exported + 10 ** 9))
    assert resolve(str(resumed)).weights_path == str(resumed / "export" / "weights.npz")
    assert capsys.readouterr().err == (
        f"warning: {resumed / 'export'} is older than the run's newest checkpoint ckpt-3: it "
        "holds the weights of an earlier end of the run (a resumed run stopped before its "
        f"end?); reading {resumed / 'export'} (training.evaluate and training.generate read "
        "the checkpoint with --checkpoint=ckpt-3)\n")
    os.utime(index, ns=(exported - 10 ** 9, exported - 10 ** 9))  # the run's end: export/ last
    resolve(str(resumed))
    assert capsys.readouterr().err == ""


def test_unreadable_weights_name_the_path(run, tmp_path):
    _, core = run
    save_pretrained(core, tmp_path / "model")
    weights = tmp_path / "model" / "weights.npz"
    data = weights.read_bytes()
    npy = io.BytesIO()
    np.save(npy, np.zeros(3, np.float32))
    for content, problem in ((data[:len(data) // 3], "not a complete .npz archive"),
                             (b"", "the file is empty"),
                             (npy.getvalue(), "one .npy array, not an .npz archive"),
                             # a header whose brackets do not close: numpy's tokenize.TokenError
                             (npy.getvalue().replace(b"'shape': (", b"'shape': ((", 1),
                              r"not an \.npz archive \(it does not start with a zip file's"),
                             # numpy's "pickled (object) data. If you trust the file ..."
                             (b"weights\n", r"not an \.npz archive \(it does not start with a "
                                            r"zip file's signature\)$")):
        weights.write_bytes(content)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(ModelDirError, match=f"{weights}.*{problem}"):
                load(str(tmp_path / "model"))
            gc.collect()
        # numpy's `np.load(path)` left the file open, for the collector to close.
        assert not [w for w in seen if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("dtype", ["int32", "bool", "complex64"])
def test_weights_that_are_not_floating_point_are_named(run, tmp_path, dtype):
    # They were cast into the weights without a word (integers truncated to 0).
    from txl_tf.errors import TxlError
    from txl_tf.weights import import_tf_checkpoint
    _, core = run
    save_pretrained(core, tmp_path / "model")
    with np.load(tmp_path / "model" / "weights.npz") as archive:
        weights = dict(archive)
    name = "transformer/layer_0/ff/layer_1/kernel"
    weights[name] = weights[name].astype(dtype)
    np.savez(tmp_path / "model" / "weights.npz", **weights)
    with pytest.raises(ModelDirError, match=f"{name} holds {dtype} values"):
        load(str(tmp_path / "model"))
    variables = {k: tf.Variable(v) for k, v in weights.items()}  # the paper's TF names
    prefix = tf.compat.v1.train.Saver(var_list=variables).save(None, str(tmp_path / "ckpt"))
    with pytest.raises(TxlError, match=f"{name} holds {dtype} values"):
        import_tf_checkpoint(prefix, core.config)


def test_an_interrupted_save_leaves_the_previous_weights(run, tmp_path, monkeypatch):
    """The weights were written in place: a kill during the save (training's
    final export) left a truncated weights.npz where a good one had been."""
    _, core = run
    save_pretrained(core, tmp_path / "model")

    def interrupted(member, array, **kwargs):
        member.write(b"\x93NUMPY half an array")
        raise KeyboardInterrupt
    monkeypatch.setattr(np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(core, tmp_path / "model")
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json",
                                                                     "weights.npz"]
    assert same_weights(load(str(tmp_path / "model"))[0], core)


def test_load_core_builds_under_a_dtype_policy(run, tmp_path):
    path, core = run
    save_pretrained(core, tmp_path / "model")
    for folder in (str(path), str(tmp_path / "model")):  # checkpoint and npz weights
        mixed = load_core(resolve(folder), dtype="mixed_bfloat16", dropout=0.0)
        assert mixed.compute_dtype == "bfloat16" and mixed.config.dropout == 0.0
        assert same_weights(mixed, core)  # variables stay float32
        assert load(folder)[0].compute_dtype == "float32"


def test_neither_form(tmp_path):
    with pytest.raises(ModelDirError, match="neither a model directory"):
        resolve(str(tmp_path))


def test_weights_assigned_in_blocks_of_rows(run, tmp_path, monkeypatch):
    """Large weights are written into the variables a few rows at a time."""
    from txl_tf.weights import checkpoints
    _, core = run
    save_pretrained(core, tmp_path / "model")
    monkeypatch.setattr(checkpoints, "_BLOCK_BYTES", 100)  # every weight past 100 bytes
    loaded, _ = load(str(tmp_path / "model"))
    assert same_weights(loaded, core)
    assert any(len(w.shape) and w.shape[0] > 1 and np.prod(w.shape) * 4 > 100
               for w in core.weights)  # some weights were split


def _kill_at(monkeypatch, k):
    """Makes the k-th rename or removal of a file raise, as a SIGKILL there
    would stop the save (no clean-up runs: `Staged.discard` is off)."""
    import os
    from txl_tf.app import files
    monkeypatch.setattr(files.Staged, "discard", lambda self: None)
    calls = {"n": 0}
    for name in ("replace", "rename", "remove"):
        real = getattr(os, name)

        def counted(*args, _real=real, **kwargs):
            calls["n"] += 1
            if calls["n"] == k:
                raise KeyboardInterrupt("killed")
            return _real(*args, **kwargs)
        monkeypatch.setattr(os, name, counted)


def test_a_save_killed_anywhere_leaves_one_whole_save_or_an_error(run, tmp_path, monkeypatch):
    """save_pretrained wrote config.json (and vocab/) in place before the
    weights: a kill during the weights' write left the new config beside the
    old weights, loaded without a word (another clamp_len and same_length)."""
    _, old = run
    new = TransformerXL(TransformerXLConfig.preset("tiny", clamp_len=3, same_length=True))
    outcomes = set()
    for k in range(1, 20):
        folder = tmp_path / f"k{k}"
        save_pretrained(old, folder, ByteTokenizer())
        _kill_at(monkeypatch, k)
        try:
            save_pretrained(new, folder, ByteTokenizer())
            finished = True
        except KeyboardInterrupt:
            finished = False
        monkeypatch.undo()
        try:
            core = load(str(folder))[0]
        except ModelDirError as err:
            assert str(err) == f"config file '{folder / 'config.json'}' does not exist"
            outcomes.add("refused")
        else:
            expected = new if core.config.clamp_len == 3 else old
            assert core.config.same_length == expected.config.same_length
            assert same_weights(core, expected), f"killed at step {k}: a mixed save"
            outcomes.add("new" if expected is new else "old")
        if finished:
            break
    assert finished and outcomes == {"old", "refused", "new"}


def test_a_save_clears_what_a_killed_save_left(run, tmp_path):
    import subprocess
    import sys
    _, core = run
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / f".tmp-{gone}-weights.npz").write_bytes(b"PK half")
    (tmp_path / "model" / f".tmp-{gone}-vocab").mkdir()
    save_pretrained(core, tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json",
                                                                     "weights.npz"]


def test_a_run_whose_export_lost_its_config_reads_its_checkpoint(run, tmp_path):
    """A re-export killed between its renames leaves export/ without its
    config.json (written last): the run directory was refused ("config file
    .../export/config.json does not exist") though its checkpoint reads."""
    import shutil
    path, core = run
    copy = tmp_path / "run"
    shutil.copytree(path, copy)
    save_pretrained(core, copy / "export")
    (copy / "export" / "config.json").unlink()
    source = resolve(str(copy))
    assert source.weights_kind == "checkpoint" and source.weights_path.endswith("ckpt-3")
    assert same_weights(load(str(copy))[0], core)
    with pytest.raises(ModelDirError, match=r"config file .*export/config.json' does not exist"):
        resolve(str(copy / "export"))  # a model directory alone still says what it lacks


def test_save_weights_clears_what_a_killed_save_weights_left(run, tmp_path):
    """save_weights's temporary (`weights.npz.tmp-<pid>.npz`, the model's size)
    stayed for good where a kill had left it."""
    import subprocess
    import sys
    from txl_tf.weights.checkpoints import save_weights
    _, core = run
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".tmp-{gone}-weights.npz").write_bytes(b"PK half")
    # Another file's temporary (on a shared folder, maybe another host's save
    # under way, its pid unknown here) is not this save's to delete.
    (tmp_path / f".tmp-{gone}-other.npz").write_bytes(b"PK half")
    save_weights(core, str(tmp_path / "weights.npz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".tmp-{gone}-other.npz",
                                                          "weights.npz"]


def test_a_save_without_a_tokenizer_deletes_the_previous_saves_vocabulary(run, tmp_path):
    """Its config records no fingerprint: a `vocab/` left by a save with a
    tokenizer would be read, unchecked, as the new model's vocabulary."""
    _, core = run
    folder = tmp_path / "model"
    save_pretrained(core, folder, ByteTokenizer())
    assert resolve(str(folder)).vocab_dir is not None
    save_pretrained(core, folder)
    assert resolve(str(folder)).vocab_dir is None and not (folder / "vocab").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "weights.npz"]
    save_pretrained(core, folder, ByteTokenizer())  # and back
    assert resolve(str(folder)).vocab_dir == str(folder / "vocab")


def test_a_save_without_a_tokenizer_keeps_a_vocabulary_put_there_by_hand(run, tmp_path, capsys):
    """Not written by a save (the config records no fingerprint): the
    user's files, kept, with a warning that they are read unchecked."""
    _, core = run
    folder = tmp_path / "model"
    save_pretrained(core, folder)
    ByteTokenizer().save(str(folder / "vocab"))
    capsys.readouterr()
    save_pretrained(core, folder)
    assert resolve(str(folder)).vocab_dir == str(folder / "vocab")
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and str(folder / "vocab") in err and "unchecked" in err


def _npz_with_header(path, arrays, name, shape):
    """`arrays` as an .npz whose member `name` declares `shape` in its header
    (its data are the real array's few bytes)."""
    import zipfile
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, value)
            data = buffer.getvalue()
            if key == name:
                header = {"descr": value.dtype.str, "fortran_order": False, "shape": shape}
                buffer = io.BytesIO()
                np.lib.format.write_array_header_1_0(buffer, header)
                data = buffer.getvalue() + value.tobytes()
            archive.writestr(key + ".npy", data)


def test_a_weight_whose_header_declares_a_huge_shape_is_refused_before_it_is_read(run, tmp_path):
    """numpy allocates the shape an .npy header declares before reading its
    data: a weights.npz of a few KB declaring (2**33, 32) asked for 1 TiB
    (a MemoryError) before the shape was compared with the model's."""
    _, core = run
    save_pretrained(core, tmp_path / "model")
    with np.load(tmp_path / "model" / "weights.npz") as archive:
        weights = dict(archive)
    name = "transformer/adaptive_embed/lookup_table"
    _npz_with_header(tmp_path / "model" / "weights.npz", weights, name, (2**33, 32))
    with pytest.raises(ModelDirError, match=rf"{name} has shape \(8589934592, 32\), the model "
                                            r"expects \(256, 32\)"):
        load(str(tmp_path / "model"))


def test_a_config_far_larger_than_its_weights_is_refused_before_the_model_is_built(
        run, tmp_path, monkeypatch):
    """config.json edited to n_token=10**7 (weights.npz unchanged) built a
    core of 320 million floats, then found its first weight's shape wrong."""
    import json

    import txl_tf.core
    _, core = run
    save_pretrained(core, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["n_token"] = 10**7
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    built = []
    monkeypatch.setattr(txl_tf.core.TransformerXL, "__init__",
                        lambda self, *a, **k: built.append(a))
    with pytest.raises(ModelDirError, match=r"weights\.npz' into a core built from .*config\.json"
                                            r"': the config's model has at least 320,[\d,]+ "
                                            r"weights, more than twice the [\d,]+ the file "
                                            r"holds \("):
        load(str(tmp_path / "model"))
    assert not built


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_weight_holding_nan_or_inf_is_refused_at_load(run, tmp_path, bad):
    """A weights.npz with one NaN (or inf) loaded without a word: every job
    then computed NaN, and an exported model held it."""
    _, core = run
    save_pretrained(core, tmp_path / "model")
    with np.load(tmp_path / "model" / "weights.npz") as archive:
        weights = dict(archive)
    name = "transformer/layer_1/ff/layer_2/kernel"
    weights[name][5, 3] = bad
    np.savez(tmp_path / "model" / "weights.npz", **weights)
    with pytest.raises(ModelDirError, match=rf"weights\.npz.*{name} holds NaN or inf values"):
        load(str(tmp_path / "model"))


def test_a_weight_beyond_the_models_dtype_is_refused_at_load():
    """The NaN/inf check ran before the cast to the model's dtype: a float32
    weight of 1e5 loaded into a float16 core became inf without a word (every
    output NaN); in float32, bfloat16 or mixed precision it is a number."""
    from txl_tf.core import TransformerXL
    from txl_tf.errors import TxlError
    from txl_tf.weights import checkpoints

    config = TransformerXLConfig(n_token=20, n_layer=1, d_model=8, n_head=2, d_head=4,
                                 d_inner=16, mem_len=2, tgt_len=2)
    weights = checkpoints.get_weights(TransformerXL(config))
    name = "transformer/layer_0/ff/layer_1/bias"
    weights[name][0] = 1e5
    with pytest.raises(TxlError, match=rf"^weight {name} holds values beyond float16's range"):
        checkpoints.set_weights(TransformerXL(config, dtype="float16"), weights)
    for dtype in ("float32", "bfloat16", "mixed_float16"):
        core = TransformerXL(config, dtype=dtype)
        checkpoints.set_weights(core, weights)
        assert np.isfinite(np.asarray(core.blocks[0].ff.layer_1.bias.numpy(), np.float32)).all()


def test_a_damaged_run_checkpoint_and_a_damaged_weight_name_their_file(run, tmp_path):
    import shutil
    path, core = run
    cut = tmp_path / "cut"
    shutil.copytree(path, cut)
    data = next((cut / "checkpoints").glob("ckpt-3.data-*"))
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
    with pytest.raises(ModelDirError, match=r"checkpoint .*cut/checkpoints/ckpt-3 cannot be "
                                            r"read \(.*\): is it truncated\?"):
        load(str(cut))
    save_pretrained(core, tmp_path / "model")
    weights = tmp_path / "model" / "weights.npz"
    members = {}
    with zipfile.ZipFile(weights) as archive:
        for name in archive.namelist():
            members[name] = archive.read(name)
    first = next(iter(members))
    # A header whose brackets do not close: numpy's parser raised tokenize.TokenError,
    # a traceback instead of the file's name.
    members[first] = re.sub(rb"'shape': \(", b"'shape': ((", members[first], count=1)
    with zipfile.ZipFile(weights, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ModelDirError, match=f"{weights}: not a complete .npz archive"):
        load(str(tmp_path / "model"))


def test_weights_of_another_model_are_named_by_name():
    from txl_tf.errors import TxlError
    from txl_tf.weights import get_weights, set_weights
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=20))
    arrays = get_weights(core)
    first = next(iter(arrays))
    arrays["extra"] = arrays.pop(first)
    with pytest.raises(TxlError, match=rf"^weights do not fit this model: missing \['{first}'\], "
                                       r"unexpected \['extra'\]$"):
        set_weights(core, arrays)


def test_paths_given_one_by_one_name_what_is_missing_or_wrong(run, tmp_path):
    import keras
    _, core = run
    model = save_pretrained(core, tmp_path / "model")
    weights = str(tmp_path / "model" / "weights.npz")
    for kwargs in ({}, {"weights_path": weights}):
        with pytest.raises(ModelDirError, match="^no config file: pass a model directory or a "
                                                "config path$"):
            resolve(**kwargs)
    source = resolve(str(model), weights_path=weights)
    assert (source.config_path, source.weights_kind) == (str(tmp_path / "model" / "config.json"),
                                                         "npz")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ModelDirError, match=r"^cannot read the config .*broken\.json"):
        load(config_path=str(tmp_path / "broken.json"), weights_path=weights)
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save(tmp_path / "other.keras")
    with pytest.raises(ModelDirError, match=r"other\.keras holds no model with a `\.core` "
                                            r"Transformer-XL"):
        load(config_path=source.config_path, weights_path=str(tmp_path / "other.keras"))
    assert load_core(source, config=core.config, dropout=0.5).config.dropout == 0.5


def test_a_save_holds_one_weight_at_a_time(run, tmp_path, monkeypatch):
    """`save_pretrained` copies one weight out of the model at a time (a dict
    of every weight's copy was the weights' size again: 3.4 GB at lm1b_large),
    and the file reads back the same."""
    import weakref
    from txl_tf.weights import checkpoints
    _, core = run
    real = checkpoints.reference_names(core)
    live, most = set(), [0]

    class Counted:
        def __init__(self, variable):
            self.variable = variable

        def numpy(self):
            value = np.array(self.variable.numpy())
            key = id(value)
            live.add(key)
            weakref.finalize(value, live.discard, key)
            most[0] = max(most[0], len(live))
            return value

    monkeypatch.setattr(checkpoints, "reference_names",
                        lambda _: {k: Counted(v) for k, v in real.items()})
    save_pretrained(core, tmp_path / "model")
    monkeypatch.undo()
    assert len(real) > 10 and most[0] == 1
    assert same_weights(load(str(tmp_path / "model"))[0], core)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_core_of_a_16_bit_policy_saves_weights_its_loader_reads_back_exactly(tmp_path, dtype):
    """A bfloat16 core's weights went into weights.npz as raw 2-byte voids
    (`|V2`: numpy has no bfloat16), which `load_pretrained` refused as not
    floating point; they are stored as float32 (exact), so the save loads
    back, into a core of the same policy bit for bit, and into float32."""
    from txl_tf.weights import load_pretrained
    config = TransformerXLConfig(n_token=20, n_layer=1, d_model=8, n_head=2, d_head=4,
                                 d_inner=16, mem_len=2, tgt_len=2, cutoffs=[10], div_val=2,
                                 pre_lnorm=True)
    core = TransformerXL(config, dtype=dtype)
    save_pretrained(core, tmp_path / "model")
    with np.load(tmp_path / "model" / "weights.npz") as stored:
        assert {stored[k].dtype.kind for k in stored.files} == {"f"}
    back = load_core(resolve(str(tmp_path / "model")), dtype=dtype)
    assert back.variable_dtype == dtype and same_weights(core, back)
    widened = load_pretrained(tmp_path / "model")
    assert widened.variable_dtype == "float32"
    for a, b in zip(core.weights, widened.weights):
        np.testing.assert_array_equal(np.asarray(a.numpy(), np.float32), b.numpy())


def test_a_bfloat16_save_of_0_4_0_loads_back_bit_for_bit(tmp_path):
    """0.4.0 wrote a bfloat16 core's weights as numpy's raw 2-byte voids
    (`|V2`), which every later load refused as "not floating point"; those
    bytes are the bfloat16 values, read as such."""
    from txl_tf.weights.checkpoints import get_weights
    config = TransformerXLConfig(n_token=20, n_layer=1, d_model=8, n_head=2, d_head=4,
                                 d_inner=16, mem_len=2, tgt_len=2, init_std=0.3)
    core = TransformerXL(config, dtype="bfloat16")
    save_pretrained(core, tmp_path / "model")
    with open(tmp_path / "model" / "weights.npz", "wb") as f:
        np.savez(f, **get_weights(core))  # as 0.4.0 wrote it
    with np.load(tmp_path / "model" / "weights.npz") as stored:
        assert {stored[k].dtype.str for k in stored.files} == {"|V2"}
    back = load_core(resolve(str(tmp_path / "model")), dtype="bfloat16")
    assert back.variable_dtype == "bfloat16" and same_weights(core, back)
    widened = load_core(resolve(str(tmp_path / "model")))
    for a, b in zip(core.weights, widened.weights):
        np.testing.assert_array_equal(np.asarray(a.numpy(), np.float32), b.numpy())
