"""`python -m training.recl`: RECL of a group of models and one model's loss
by context on a real text file, its JSON and PNG; bad flags are one error."""
import json

import keras
import numpy as np
import pytest

from training.errors import TrainingError
from training.recl import describe, run
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.learning.context_length import recl
from txl_tf.text import ByteTokenizer, CharTokenizer
from txl_tf.weights import save_pretrained


def model(path, seed, tokenizer=None):
    keras.utils.set_random_seed(seed)
    tokenizer = tokenizer or ByteTokenizer()
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=tokenizer.vocab_size,
                                                    tgt_len=4, mem_len=4))
    save_pretrained(core, str(path), tokenizer=tokenizer)
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("recl")
    text = root / "text.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 120)
    return root, str(text), model(root / "a", 0), model(root / "b", 1)


def options(setup, **overrides):
    root, text, _, _ = setup
    return dict(dataset="text", data_dir=text, cache_dir=str(root / "cache"), first_context=4,
                context_step=4, max_context=12, positions=12, batch_size=8,
                progress=False, **overrides)


def test_a_group_gets_a_recl_per_ratio_and_a_picture(setup):
    root, _, a, b = setup
    out = root / "group"
    result = run(model_dir=[f"xl={a}", b], output_dir=str(out), **options(setup))
    assert result["models"] == ["xl", "b"] and result["contexts"] == [4, 8, 12]
    assert set(result["recl"]) == {"0.1", "0.5", "1.0"}
    for lengths in result["recl"].values():
        assert set(lengths) == {"xl", "b"} and set(lengths.values()) <= {4, 8, 12}
    saved = json.loads((out / "recl.json").read_text())
    assert saved["recl"] == result["recl"] and len(saved["gains"]["0.5"]["b"]) == 2
    assert (out / "recl.png").stat().st_size > 1000
    # The file holds the whole table: the RECL and the gains are recomputed from it.
    table = np.array([saved["losses"][name] for name in saved["models"]])
    assert table.shape == (2, 3, saved["positions"]) == (2, 3, len(saved["target_positions"]))
    np.testing.assert_allclose(table.mean(2), [saved["mean_loss"][m] for m in saved["models"]])
    for r in ("0.1", "0.5", "1.0"):
        lengths, gains = recl(table, saved["contexts"], float(r), saved["threshold"])
        assert dict(zip(saved["models"], lengths)) == saved["recl"][r]
        np.testing.assert_allclose(gains[1], saved["gains"][r]["b"], rtol=1e-12)
    assert "RECL r=0.1" in describe(result)


def test_one_model_gets_its_loss_by_context(setup):
    _, _, a, _ = setup
    result = run(model_dir=[a], **options(setup))
    assert result["recl"] == {} and len(result["mean_loss"]["a"]) == 3
    assert "mean loss by context 4:" in describe(result)


@pytest.mark.parametrize("overrides, message", [
    (dict(model_dir=[]), "--model_dir is required"),
    (dict(ratios="0.5,2"), r"--ratios must be fractions in \(0, 1\]"),
    (dict(max_context=2), "--max_context .2. is below --first_context"),
    (dict(threshold=0.0), r"--threshold must be in \(0, 1\)"),
])
def test_bad_flags_are_one_error(setup, overrides, message):
    _, _, a, _ = setup
    given = {**options(setup), "model_dir": [a], **overrides}
    with pytest.raises(TrainingError, match=message):
        run(**given)


def test_models_must_share_a_vocabulary(setup, tmp_path):
    _, _, a, _ = setup
    chars = CharTokenizer.build("def f(x):\n return+1")
    other = model(tmp_path / "chars", 2, tokenizer=chars)
    with pytest.raises(TrainingError, match="vocabulary is not the first model's"):
        run(model_dir=[a, other], **options(setup))


@pytest.mark.parametrize("options, message", [
    (dict(model_dir=["a/run", "b/run"]), r"--model_dir: two models have the same name \(.*\); "
                                         r"name them with name=DIR"),
    (dict(ratios="0.5,half"), r"--ratios must be comma-separated numbers, got '0.5,half'"),
    (dict(ratios="0.5,1.5"), r"--ratios must be fractions in \(0, 1\], got '0.5,1.5'"),
    (dict(positions=0), r"--positions must be positive, got 0"),
])
def test_recl_flags_wrong_on_their_own_are_named_before_a_model_loads(options, message):
    with pytest.raises(TrainingError, match=f"^{message}$"):
        run(**{"model_dir": ["nowhere"], **options})
