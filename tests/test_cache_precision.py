"""`benchmarks.long_memory --part=cache_precision` (what the 16-bit decode
options cost a trained model): its export rows read the same text as the
Keras rows, exports made once are read again in place (the GPU check's
`serving_precision` part reads those made on another machine), a reused
export that is not the one asked for (its options or its model) is one
clear error, and
`--nokeras_rows` builds no model (TensorFlow must not start on a GPU that
ONNX Runtime uses in the same process)."""
import platform

import keras
import pytest

from benchmarks import long_memory as lm
from job_helpers import write_text_corpus
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.errors import TxlError
from txl_tf.text import ByteTokenizer
from txl_tf.weights import model_dir, save_pretrained

MEM_LEN = 6


def _options(root, **changes):
    o = {spec[1]: spec[2] for spec in lm.CACHE_PRECISION_SPEC}
    o.update(model_dir=str(root / "model"), dataset="text", data_dir=str(root / "text.txt"),
             cache_dir=str(root / "cache"), split="valid", mem_len=MEM_LEN, tokens=7,
             streams=2, work_dir=str(root / "exports"), output=str(root / "precision.json"))
    o.update(changes)
    return o


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A random tiny byte model's first run (exports made), its JSON and output."""
    import json
    root = tmp_path_factory.mktemp("cache_precision")
    keras.utils.set_random_seed(0)
    config = TransformerXLConfig.preset("tiny", n_layer=1, d_model=16, d_head=8,
                                        mem_len=MEM_LEN)
    save_pretrained(TransformerXL(config), root / "model", tokenizer=ByteTokenizer())
    write_text_corpus(root / "text.txt", num_bytes=4_000)
    lm.run_cache_precision(_options(root))
    return root, json.loads((root / "precision.json").read_text())


def _rows(result):
    return {r["precision"]: r for r in result["rows"]}


def test_the_exports_read_the_text_the_keras_model_reads(measured):
    _, result = measured
    rows = _rows(result)
    assert list(rows) == [*lm.PRECISIONS, *lm.EXPORT_PRECISIONS]
    assert result["tokens"] == 2 * 7
    # the float32 export and the Keras float32 cache: one model, one text
    assert rows["export, float32 cache"]["ppl"] == pytest.approx(rows["float32"]["ppl"],
                                                                 rel=1e-5)
    assert rows["export, float32 cache"]["max_abs_log_prob_change"] == 0.0
    for name in ("export, float16 cache", "export, float16 decode"):  # near: a random model
        assert rows[name]["max_abs_log_prob_change"] < 5e-2, name


def test_exports_made_once_are_read_again_without_a_model(measured, monkeypatch, capsys):
    import json
    root, first = measured

    def no_model(*args, **kwargs):
        raise AssertionError("--nokeras_rows built the model")

    monkeypatch.setattr(model_dir, "load_core", no_model)
    output = root / "again.json"
    lm.run_cache_precision(_options(root, reuse_exports=True, keras_rows=False,
                                    output=str(output)))
    again = json.loads(output.read_text())
    assert again["rows"] == first["rows"][len(lm.PRECISIONS):]
    assert again["text"] == first["text"]  # the same ids, this Python
    assert first["text"]["python"] == platform.python_version()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    rows = _rows(again)
    shorter = root / "shorter.json"
    lm.run_cache_precision(_options(root, reuse_exports=True, keras_rows=False, tokens=6,
                                    output=str(shorter)))
    assert json.loads(shorter.read_text())["text"]["ids_sha256"] != first["text"]["ids_sha256"]
    assert line == (
        f"the exports' decode on cpu, 14 tokens: ppl float32 cache "
        f"{rows['export, float32 cache']['ppl']:.4f}, float16 cache "
        f"{rows['export, float16 cache']['ppl']:.4f}, float16 decode "
        f"{rows['export, float16 decode']['ppl']:.4f}; float16 cache: largest log-prob change "
        f"{rows['export, float16 cache']['max_abs_log_prob_change']:.1e}, most likely token "
        f"changed {round(rows['export, float16 cache']['argmax_changed'] * 14)} of 14; "
        f"float16 decode: largest log-prob change "
        f"{rows['export, float16 decode']['max_abs_log_prob_change']:.1e}, most likely token "
        f"changed {round(rows['export, float16 decode']['argmax_changed'] * 14)} of 14")


def test_a_reused_export_that_is_not_the_one_asked_for_is_one_error(measured, tmp_path):
    import shutil
    root, _ = measured
    wrong = tmp_path / "exports"
    shutil.copytree(root / "exports", wrong)
    shutil.rmtree(wrong / "float16_cache")
    shutil.copytree(root / "exports" / "float32", wrong / "float16_cache")
    reuse = dict(reuse_exports=True, keras_rows=False, output=str(tmp_path / "x.json"))
    with pytest.raises(TxlError, match=f"^the export in {wrong}/float16_cache keeps its "
                                       f"decode cache in float32, not float16$"):
        lm.run_cache_precision(_options(root, work_dir=str(wrong), **reuse))
    with pytest.raises(TxlError, match=f"holds {MEM_LEN} memory slots, not 9 \\(--mem_len\\)"):
        lm.run_cache_precision(_options(root, mem_len=9, **reuse))
    with pytest.raises(TxlError, match="--reuse_exports needs --work_dir"):
        lm.run_cache_precision(_options(root, work_dir=None, **reuse))
    with pytest.raises(TxlError, match="--nokeras_rows --nothrough_exports leaves nothing"):
        lm.run_cache_precision(_options(root, keras_rows=False, through_exports=False))
    assert not (tmp_path / "x.json").exists()


def test_exports_holding_another_memory_than_the_models_are_read(measured, tmp_path):
    """An export keeps its model's config, mem_len and all, beside the memory it holds."""
    import json
    root, _ = measured
    output = tmp_path / "longer.json"
    lm.run_cache_precision(_options(root, mem_len=MEM_LEN + 2, keras_rows=False,
                                    work_dir=str(tmp_path / "exports"), output=str(output)))
    result = json.loads(output.read_text())
    assert [r["precision"] for r in result["rows"]] == list(lm.EXPORT_PRECISIONS)
    assert result["settings"]["mem_len"] == MEM_LEN + 2


def test_exports_of_another_model_are_one_error(measured, tmp_path):
    """The same vocabulary and memory, another model: its exports kept from an earlier run
    would be read as this model's and their perplexities reported as its."""
    root, _ = measured
    config = TransformerXLConfig.preset("tiny", n_layer=1, d_model=24, d_head=8,
                                        mem_len=MEM_LEN)
    save_pretrained(TransformerXL(config), tmp_path / "model", tokenizer=ByteTokenizer())
    with pytest.raises(TxlError, match=f"^the export in {root}/exports/float32 is not of the "
                                       f"model asked for: its d_model, d_embed differ"):
        lm.run_cache_precision(_options(root, model_dir=str(tmp_path / "model"),
                                        reuse_exports=True, keras_rows=False,
                                        output=str(tmp_path / "x.json")))
    assert not (tmp_path / "x.json").exists()
