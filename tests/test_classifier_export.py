"""Export of the classifier: SavedModel and ONNX probabilities match Keras on
padded batches of multi-segment documents; metadata and input checks."""
import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from export import classifier, export_classifier, open_classifier, open_runtime
from export.classifier import float32_twin, read_metadata
from export.runtime import RuntimeInputError
from txl_tf import TransformerXLClassifier, TransformerXLConfig
from txl_tf.errors import TxlError
from bfloat16_cpu import needs_bfloat16_matmuls

N_TOKEN = 40


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(7)
    config = TransformerXLConfig(n_token=N_TOKEN, n_layer=2, d_model=32, n_head=2, d_head=16,
                                 d_inner=64, dropout=0.1, tgt_len=6, mem_len=10,
                                 cutoffs=[20], div_val=2, d_embed=32, untie_r=True)
    model = TransformerXLClassifier(config, 3, segment_len=6, mem_len=9,
                                    label_names=["poem", "news", "wiki"])
    for w in model.head.weights:  # a head that is far from uniform
        w.assign(np.random.default_rng(0).normal(0, 1.0, w.shape).astype(np.float32))
    vocab = tmp_path_factory.mktemp("vocab")
    (vocab / "vocab.txt").write_text("a\nb\n")
    out = str(tmp_path_factory.mktemp("export") / "cls")
    written = export_classifier(model, out, vocab_dir=str(vocab))
    return model, out, written


def batch(lengths, width=None, seed=11):
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), width or max(lengths)), 3, np.int32)  # right padding
    for b, n in enumerate(lengths):
        ids[b, :n] = rng.integers(0, N_TOKEN, n)
    return ids, np.asarray(lengths, np.int32)


@pytest.mark.parametrize("backend", ["onnx", "saved_model"])
def test_probabilities_match_keras_on_a_padded_batch(exported, backend):
    model, out, _ = exported
    runtime = open_classifier(out, backend=backend)
    for lengths in ([23, 1, 6, 14, 30], [7, 2]):  # up to 5 segments of 6; a second shape
        ids, lengths = batch(lengths, width=max(lengths) + 3)
        want = model.predict_probabilities({"token_ids": ids, "lengths": lengths}).numpy()
        got = runtime.probabilities(ids, lengths)
        assert got.shape == (len(lengths), 3) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert np.abs(want - 1 / 3).max() > 0.05  # not trivially uniform
    assert runtime.predict(ids, lengths) == [["poem", "news", "wiki"][i]
                                             for i in want.argmax(-1)]


def test_artefacts_and_metadata(exported):
    model, out, written = exported
    assert sorted(written) == ["metadata", "onnx", "saved_model", "vocab"]
    assert os.path.isfile(os.path.join(out, "model.onnx"))
    assert os.path.isfile(os.path.join(out, "vocab", "vocab.txt"))
    for info in (read_metadata(out), open_classifier(out, backend="onnx").info,
                 open_classifier(out, backend="saved_model").info):
        assert (info.num_classes, info.label_names, info.segment_len, info.mem_len) == (
            3, ["poem", "news", "wiki"], 6, 9)
        assert info.config == model.config and info.vocab_files == ["vocab.txt"]
        assert info.values["weights_quantization"] == "none"
    loaded = tf.saved_model.load(os.path.join(out, "saved_model"))
    assert set(loaded.signatures) == {"classify", "serving_default"}
    spec = loaded.signatures["serving_default"].structured_outputs["probabilities"]
    assert spec.dtype == tf.float32 and spec.shape.as_list() == [None, 3]
    with open(os.path.join(out, "classifier.json"), encoding="utf-8") as f:
        assert json.load(f)["task"] == "classification"
    with pytest.raises(ValueError, match="open_classifier"):
        open_runtime(out)


@pytest.mark.parametrize("backend", ["onnx", "saved_model"])
def test_bad_inputs_are_named_before_and_inside_the_graph(exported, backend):
    _, out, _ = exported
    runtime = open_classifier(out, backend=backend)
    ids, lengths = batch([5, 3])
    with pytest.raises(RuntimeInputError, match=r"lengths\[1\] = 0"):
        runtime.probabilities(ids, [5, 0])
    with pytest.raises(RuntimeInputError, match=r"lengths\[0\] = 6"):
        runtime.probabilities(ids, [6, 3])
    with pytest.raises(RuntimeInputError, match="out of range"):
        runtime.probabilities(np.where(ids == ids[0, 0], N_TOKEN, ids), lengths)
    with pytest.raises(RuntimeInputError, match="shape"):
        runtime.probabilities(ids, [5])
    # The graphs check too, for callers that skip the runtime.
    error = Exception
    if backend == "onnx":
        with pytest.raises(error, match="lengths empty or out of range"):
            runtime._run(ids, np.int32([6, 3]))
        with pytest.raises(error, match="token_ids empty or out of range"):
            runtime._run(np.where(ids == ids[0, 0], -1, ids), lengths)
        with pytest.raises(error, match="empty or out of range"):  # no rows
            runtime._run(ids[:0], lengths[:0])
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="lengths"):
            runtime._run(ids, np.int32([0, 3]))


def test_masked_or_duration_lengths_are_named(exported):
    """The mask was dropped: the masked length was read (a silent wrong answer)."""
    runtime = open_classifier(exported[1], backend="onnx")
    ids, lengths = batch([5, 3])
    with pytest.raises(RuntimeInputError, match="lengths is a masked array with masked entries"):
        runtime.probabilities(ids, np.ma.array(lengths, mask=[0, 1]))
    with pytest.raises(RuntimeInputError, match=r"lengths must be integers .*timedelta64"):
        runtime.probabilities(ids, lengths.astype("m8[s]"))
    np.testing.assert_array_equal(runtime.probabilities(ids, np.ma.array(lengths)),
                                  runtime.probabilities(ids, lengths))


def test_the_lengths_check_reads_no_shape(exported):
    """The graph's lengths check reads no `Shape(token_ids)` (a value ONNX
    Runtime's CUDA provider keeps on the host: a copy each call) and still
    fails on every length outside [1, L], a batch of no rows and ids of no
    columns."""
    import onnx
    import onnxruntime as ort
    _, out, _ = exported
    path = os.path.join(out, "model.onnx")
    check = [n for n in onnx.load(path, load_external_data=False).graph.node
             if n.name.startswith("txl_lengths_check/")
             or n.name.startswith(classifier.lengths_check_node_name())]
    assert check and not [n for n in check if n.op_type == "Shape"]
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ids, _ = batch([5, 3])
    for lengths in ([6, 3], [5, 0], [5, -1], [5, -5], [5, -40], [99, 1]):
        with pytest.raises(Exception, match="lengths empty or out of range"):
            session.run(None, {"token_ids": ids, "lengths": np.int32(lengths)})
    for empty, lengths in ((ids[:0], np.int32([])), (ids[:, :0], np.int32([1, 1]))):
        with pytest.raises(Exception, match="empty or out of range"):
            session.run(None, {"token_ids": empty, "lengths": lengths})
    for lengths in ([5, 1], [1, 5], [5, 5]):
        probabilities, = session.run(None, {"token_ids": ids, "lengths": np.int32(lengths)})
        assert probabilities.shape == (2, 3)


def test_lengths_not_one_per_row_fail_in_the_graph(exported):
    """The graph refuses fewer or more lengths than rows (it answered fewer or
    more rows than it was given)."""
    import onnxruntime as ort
    _, out, _ = exported
    session = ort.InferenceSession(os.path.join(out, "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    ids, _ = batch([5, 3, 4])
    for lengths in ([5], [5, 3], [5, 3, 4, 4]):
        with pytest.raises(Exception, match="one per row"):
            session.run(None, {"token_ids": ids, "lengths": np.int32(lengths)})


def test_a_length_past_l_fails_in_the_specs_evaluator(exported):
    """`onnx.reference` (whose GatherElements wraps an index out of range)
    refuses a length past L too, instead of answering."""
    import onnx
    from onnx.reference import ReferenceEvaluator
    _, out, _ = exported
    evaluator = ReferenceEvaluator(onnx.load(os.path.join(out, "model.onnx")))
    ids, _ = batch([5, 3])
    for lengths in ([6, 3], [5, 2**31 - 1]):
        with pytest.raises(IndexError):
            evaluator.run(None, {"token_ids": ids, "lengths": np.int32(lengths)})


@needs_bfloat16_matmuls
def test_a_mixed_precision_classifier_exports_onnx_computing_in_float32(tmp_path):
    keras.utils.set_random_seed(8)
    config = TransformerXLConfig(n_token=N_TOKEN, n_layer=2, d_model=32, n_head=2, d_head=16,
                                 d_inner=64, dropout=0.0, tgt_len=6, mem_len=10)
    model = TransformerXLClassifier(config, 3, segment_len=6, mem_len=9, dtype="mixed_bfloat16")
    for w in model.head.weights:
        w.assign(np.random.default_rng(1).normal(0, 1.0, w.shape).astype(np.float32))
    out = str(tmp_path / "cls")
    written = export_classifier(model, out)  # the default formats, ONNX included
    assert sorted(written) == ["metadata", "onnx", "saved_model"]
    twin = float32_twin(model)
    assert twin.compute_dtype == "float32" and twin.core.compute_dtype == "float32"
    for a, b in zip(twin.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    ids, lengths = batch([23, 1, 6, 14, 30], width=33)
    inputs = {"token_ids": ids, "lengths": lengths}
    want32 = twin.predict_probabilities(inputs).numpy()
    want16 = model.predict_probabilities(inputs).numpy()
    onnx = open_classifier(out, backend="onnx")
    np.testing.assert_allclose(onnx.probabilities(ids, lengths), want32, atol=1e-4)
    # The SavedModel keeps the model's bfloat16 compute (it matches the model's
    # graph; eager bfloat16 already differs from it by rounding, ~7e-3 here);
    # ONNX differs from the bfloat16 model by bfloat16 rounding only.
    graph16 = tf.function(lambda i, n: model.predict_probabilities(
        {"token_ids": i, "lengths": n}))(ids, lengths).numpy()
    saved = open_classifier(out, backend="saved_model").probabilities(ids, lengths)
    np.testing.assert_allclose(saved, graph16, atol=1e-4)
    assert np.abs(saved - want32).max() > 1e-4  # computed in bfloat16, not float32
    for bf16 in (want16, graph16):
        assert 1e-4 < np.abs(onnx.probabilities(ids, lengths) - bf16).max() < 0.03
    for info in (onnx.info, read_metadata(out)):
        assert (info.values["dtype_policy"], info.values["saved_model_compute_dtype"],
                info.values["onnx_compute_dtype"]) == ("mixed_bfloat16", "bfloat16", "float32")


@pytest.mark.parametrize("adapt", ["lora", "int8"])
@needs_bfloat16_matmuls
def test_a_mixed_precision_classifier_with_lora_or_int8_is_refused_for_onnx(tmp_path, adapt):
    """Its float32 copy (the ONNX graph's) is built from the config, without
    the adapters or int8 layers: the export failed with a RuntimeError
    naming neither. Refused at once, by name; the SavedModel still exports
    (checked once)."""
    config = TransformerXLConfig(n_token=N_TOKEN, n_layer=1, d_model=16, n_head=2, d_head=8,
                                 d_inner=32, dropout=0.0, tgt_len=4, mem_len=4)
    model = TransformerXLClassifier(config, 2, dtype="mixed_bfloat16")
    if adapt == "lora":
        next(layer for layer in model.core._flatten_layers()
             if layer.name == "query").enable_lora(2)
    else:
        model.quantize("int8")
    out = tmp_path / "cls"
    with pytest.raises(TxlError, match=f"^cannot export a mixed_bfloat16 classifier with "
                       f"{'LoRA' if adapt == 'lora' else 'int8'} layers .*"
                       "formats=\\('saved_model',\\)"):
        export_classifier(model, str(out))
    assert not out.exists()
    if adapt == "lora":
        return
    export_classifier(model, str(out), formats=("saved_model",))
    ids, lengths = batch([5, 2], width=5)
    want = tf.function(lambda i, n: model.predict_probabilities(
        {"token_ids": i, "lengths": n}))(ids, lengths).numpy()
    np.testing.assert_allclose(open_classifier(str(out)).probabilities(ids, lengths), want,
                               atol=1e-4)


def test_an_int8_classifiers_export_says_its_weights_are_int8(tmp_path):
    """A float32 classifier quantized to int8 exports both formats, its ONNX
    graph holding int8 kernels; the metadata said `onnx_compute_dtype:
    float32` and nothing of the quantization."""
    import onnx
    config = TransformerXLConfig(n_token=N_TOKEN, n_layer=1, d_model=16, n_head=2, d_head=8,
                                 d_inner=32, dropout=0.0, tgt_len=4, mem_len=4)
    model = TransformerXLClassifier(config, 2)
    model.quantize("int8")
    out = str(tmp_path / "cls")
    export_classifier(model, out)
    graph = onnx.load(os.path.join(out, "model.onnx"), load_external_data=False).graph
    assert onnx.TensorProto.INT8 in {i.data_type for i in graph.initializer}
    for info in (read_metadata(out), open_classifier(out, backend="onnx").info,
                 open_classifier(out, backend="saved_model").info):
        assert info.values["weights_quantization"] == "int8"


def test_a_failed_export_leaves_the_folder_as_it_was(exported, tmp_path, monkeypatch):
    model = exported[0]
    out = tmp_path / "cls"

    def fail(*args, **kwargs):
        raise RuntimeError("conversion failed")

    def files(folder):
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))

    monkeypatch.setattr(classifier, "export_classifier_onnx", fail)
    with pytest.raises(RuntimeError, match="conversion failed"):
        export_classifier(model, str(out))
    assert os.listdir(tmp_path) == []  # no partial folder, no staging folder
    monkeypatch.undo()
    export_classifier(model, str(out), formats=("saved_model",))
    before = files(out)
    monkeypatch.setattr(classifier, "export_classifier_onnx", fail)
    with pytest.raises(RuntimeError, match="conversion failed"):
        export_classifier(model, str(out), formats=("onnx",))
    assert files(out) == before and os.listdir(tmp_path) == ["cls"]
    monkeypatch.undo()
    written = export_classifier(model, str(out), formats=("onnx",))  # replaces it whole
    assert sorted(os.listdir(out)) == ["classifier.json", "model.onnx"]
    assert written["onnx"] == [str(out / "model.onnx")]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds no classifier export"):
        export_classifier(model, str(other), formats=("onnx",))
    assert os.listdir(other) == ["todo.txt"]
    export_classifier(model, str(other), formats=("onnx",), overwrite=True)
    assert sorted(os.listdir(other)) == ["classifier.json", "model.onnx"]


def test_a_file_at_or_above_the_output_folder_is_named(exported, tmp_path):
    # A file above output_dir gave the raw "[Errno 17] File exists" (or, two
    # folders down, "[Errno 20] Not a directory") of the staging folder's makedirs.
    (tmp_path / "notes.txt").write_text("keep me")
    for out, in_the_way in (("notes.txt", r"notes\.txt exists and is not a folder"),
                            ("notes.txt/cls", r"notes\.txt is not a folder, so it cannot hold "
                                              r".*notes\.txt/cls"),
                            ("notes.txt/a/cls", r"notes\.txt is not a folder, so it cannot "
                                                r"hold .*notes\.txt/a/cls")):
        with pytest.raises(TxlError, match=rf"^output_dir: .*{in_the_way}; choose another "
                                           r"output_dir$"):
            export_classifier(exported[0], str(tmp_path / out), formats=("onnx",),
                              overwrite=True)
    assert os.listdir(tmp_path) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_onnx_on_a_cuda_that_does_not_load_says_so(exported, cuda_that_does_not_load, caplog):
    """onnxruntime-gpu whose CUDA provider does not load (`cuda_loads`):
    the classifier runs on the CPU and says why in one warning, as the
    language model's runtime does (it once ran there without a word)."""
    runtime = open_classifier(exported[1], backend="onnx", device="cuda")
    assert runtime.session.get_providers() == ["CPUExecutionProvider"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("CUDAExecutionProvider failed to load"), said
    caplog.clear()
    open_classifier(exported[1], backend="onnx", device="cpu")
    assert not caplog.records


@pytest.mark.parametrize("formats", [(), ("onnx", "tflite")])
def test_unknown_or_no_formats_are_refused_before_anything_is_written(tmp_path, formats):
    with pytest.raises(TxlError, match=r"^formats must be some of \('saved_model', 'onnx'\), "
                                       rf"got {re.escape(str(tuple(formats)))}$"):
        export_classifier(None, str(tmp_path / "out"), formats)
    assert not (tmp_path / "out").exists()
