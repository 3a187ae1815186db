"""Files from someone else (a downloaded model, a shared vocabulary): a
hostile one ends in one error naming it, never a traceback or a crash."""
import pytest

from txl_tf.errors import TxlError

DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB: deeper than Python's JSON parser recurses


def test_deeply_nested_json_is_one_error_naming_the_file(tmp_path):
    """Every JSON file a loader reads (tokenizer.json, config.json, a labels
    file, the port's config) raised RecursionError, past every handler."""
    from txl_tf.classification.labels import LabelSet
    from txl_tf.config import TransformerXLConfig
    from txl_tf.text import ByteTokenizer, load_tokenizer
    from txl_tf.weights.convert import read_config_file
    from txl_tf.weights.model_dir import ModelDirError, load_config, resolve

    ByteTokenizer().save(tmp_path / "vocab")
    (tmp_path / "vocab" / "tokenizer.json").write_text(DEEP)
    with pytest.raises(TxlError, match="tokenizer.json: .*nested too deeply"):
        load_tokenizer(tmp_path / "vocab")
    (tmp_path / "config.json").write_text('{"n_token": ' + DEEP + "}")
    (tmp_path / "weights.npz").write_bytes(b"")
    with pytest.raises(ModelDirError, match="config.json.*nested too deeply"):
        load_config(resolve(str(tmp_path)))
    with pytest.raises(ValueError, match="nested too deeply"):
        TransformerXLConfig.from_json('{"n_token": ' + DEEP + "}")
    with pytest.raises(TxlError, match=r"config\.json.*nested too deeply"):
        read_config_file(str(tmp_path / "config.json"))
    (tmp_path / "labels.json").write_text(DEEP)
    with pytest.raises(TxlError, match=r"labels\.json: not a labels file.*nested too deeply"):
        LabelSet.load(tmp_path / "labels.json")
