"""LoRA and int8 through Keras: the attention projections are `Dense` layers,
so keras-hub's `enable_lora` trains only adapters on `query` and `value`,
and `quantize("int8")` turns the projections and feed-forward layers int8;
files written before the projections were layers still load."""
import os

import keras
import numpy as np
import pytest

from txl_tf import (TransformerXLBackbone, TransformerXLCausalLM, TransformerXLConfig,
                    TransformerXLLM, TxlError)
from txl_tf.weights import get_weights, load_pretrained, model_dir, save_pretrained
from txl_tf.weights.legacy_keras import load_legacy_core

N_TOKEN, RANK = 50, 2
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "before_projection_layers")


def causal_lm(seed=0):
    keras.utils.set_random_seed(seed)
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=8, tgt_len=4, dropout=0.0)
    return TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))


def batch(seed, rows=4, width=12):
    ids = np.random.default_rng(seed).integers(1, N_TOKEN, (rows, width)).astype(np.int32)
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    return x, ids[:, 1:]


def count(variables):
    return int(sum(np.prod(v.shape) for v in variables))


def test_enable_lora_trains_only_adapters_on_query_and_value(tmp_path):
    model = causal_lm()
    before = count(model.trainable_weights)
    assert before == count(model.weights)
    model.backbone.enable_lora(RANK)
    trainable = model.trainable_weights
    n_layer = model.backbone.transformer.config.n_layer
    assert len(trainable) == 2 * 2 * n_layer  # lora_kernel_a and _b of query and value
    assert {v.path.split("/")[-2] for v in trainable} == {"query", "value"}
    assert count(trainable) < before / 10
    frozen = {v.path: v.numpy().copy() for v in model.weights if not v.trainable}
    model.compile(optimizer=keras.optimizers.Adam(1e-2), sampler="greedy")
    x, y = batch(0)
    first = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, verbose=0)
    assert model.evaluate(x, y, verbose=0) < first  # the adapters learn
    for v in model.weights:
        if not v.trainable:
            np.testing.assert_array_equal(v.numpy(), frozen[v.path], err_msg=v.path)
    adapted = model.predict(x, verbose=0)
    path = str(tmp_path / "adapters.lora.h5")
    model.backbone.save_lora_weights(path)
    fresh = causal_lm()
    fresh.backbone.load_lora_weights(path)
    np.testing.assert_allclose(fresh.predict(x, verbose=0), adapted, atol=1e-5)
    prompts = {"token_ids": np.pad(x["token_ids"][:, :6], [[0, 0], [0, 8]]),
               "padding_mask": np.pad(x["padding_mask"][:, :6], [[0, 0], [0, 8]])}
    fresh.compile(sampler="greedy")
    np.testing.assert_array_equal(fresh.generate(prompts)["token_ids"],
                                  model.generate(prompts)["token_ids"])


def test_adapted_weights_are_refused_by_the_plain_weight_layout(tmp_path):
    model = causal_lm()
    model.backbone.enable_lora(RANK)
    with pytest.raises(TxlError, match="LoRA-adapted.*save_to_preset"):
        get_weights(model.backbone.transformer)
    with pytest.raises(TxlError, match="LoRA-adapted"):
        save_pretrained(model.backbone.transformer, str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()  # no config.json without its weights


def test_the_kept_scorer_and_decoder_graphs_follow_a_quantized_core():
    """`evaluate_ids` and `Decoder` keep their graphs on the core; once
    `quantize` replaced its kernels, new ones read the int8 model."""
    import tensorflow as tf
    from txl_tf import Decoder
    from txl_tf.learning.evaluation import evaluate_ids
    model = causal_lm()
    core = model.backbone.transformer
    ids = np.random.default_rng(2).integers(1, N_TOKEN, 41)
    before = evaluate_ids(core, ids, batch_size=2)["loss"]
    greedy = Decoder(core).generate([[1, 2, 3]], 3, temperature=0).log_probs
    model.quantize("int8")

    @tf.function
    def fresh(inputs, labels, memory):
        return core(inputs, memory, targets=labels, training=False)
    after = evaluate_ids(core, ids, batch_size=2)["loss"]
    assert after == evaluate_ids(core, ids, batch_size=2, scorer=fresh)["loss"] != before
    again = Decoder(core).generate([[1, 2, 3]], 3, temperature=0).log_probs
    assert not np.array_equal(again, greedy)
    np.testing.assert_allclose(again, greedy, atol=0.05)


def test_int8_quantizes_projections_and_feed_forward_and_stays_close(tmp_path):
    model = causal_lm()
    x, _ = batch(1)
    float_out = model.predict(x, verbose=0)
    model.quantize("int8")
    dense = [layer for layer in model.backbone._flatten_layers()
             if isinstance(layer, keras.layers.Dense)]
    assert {layer.name for layer in dense} == {
        "query", "key", "value", "attention_output", "layer_1", "layer_2"}
    assert all(layer.quantization_mode == "int8" for layer in dense)
    assert all(str(layer._kernel.dtype) == "int8" for layer in dense)
    out = model.predict(x, verbose=0)
    assert not np.allclose(out, float_out, atol=1e-6)  # the int8 path runs
    np.testing.assert_allclose(out, float_out, atol=0.05)
    ids = model.generate(x)["token_ids"]
    np.testing.assert_array_equal(ids[:, :6], x["token_ids"][:, :6])
    with pytest.raises(TxlError, match="quantized"):
        get_weights(model.backbone.transformer)


def test_an_int8_transformer_xl_lm_saved_as_keras_loads_quantized(tmp_path):
    """`TransformerXLLM.get_config` named the model's own policy (float32),
    so `load_model` rebuilt float layers and refused the int8 weights ("12
    objects could not be loaded"); the backbone's policy map is kept now."""
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=8, tgt_len=4, dropout=0.0)
    model = TransformerXLLM(cfg, batch_size=2)
    model.quantize("int8")
    x = np.random.default_rng(0).integers(0, N_TOKEN, (2, 4)).astype(np.int32)
    model.save(str(tmp_path / "int8.keras"))  # with its memory, empty here
    loaded = keras.models.load_model(str(tmp_path / "int8.keras"))
    modes = {layer.quantization_mode for layer in loaded._flatten_layers()
             if isinstance(layer, keras.layers.Dense)}
    assert modes == {"int8"}
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_files_written_before_the_projections_were_layers_still_load():
    """A `.keras` file, a keras-hub preset, a model directory and a training
    checkpoint written by the code whose attention held one fused `qkv`
    kernel (see fixtures/before_projection_layers/README.md) all give the
    same model."""
    reference = load_pretrained(os.path.join(FIXTURES, "model_dir"))
    ids = (np.arange(12, dtype=np.int32).reshape(2, 6) * 7) % reference.config.n_token

    def log_probs(core):
        return core(ids, core.initial_memory(2))[0].numpy()

    expected = log_probs(reference)
    old_keras = os.path.join(FIXTURES, "lm.keras")
    # The subclassed TransformerXLLM of then is a TransformerXLCausalLM now: its
    # file says how its weights load, and they do.
    with pytest.raises(TxlError, match="load_legacy_core"):
        keras.saving.load_model(old_keras, compile=False)
    lm_core = load_legacy_core(old_keras)
    preset = TransformerXLCausalLM.from_preset(os.path.join(FIXTURES, "preset"))
    run = load_pretrained(os.path.join(FIXTURES, "run"))
    exported, _ = model_dir.load(  # what `txl-export --weights lm.keras` reads
        config_path=os.path.join(FIXTURES, "model_dir", "config.json"), weights_path=old_keras)
    for name, core in [("keras", lm_core), ("keras, loader", exported),
                       ("preset", preset.backbone.transformer), ("checkpoint", run)]:
        np.testing.assert_allclose(log_probs(core), expected, atol=1e-6, err_msg=name)


def test_a_training_run_from_before_cannot_resume_and_says_its_weights_load(tmp_path):
    import shutil

    import tensorflow as tf

    from training.checkpointing import TrainingCheckpoint
    from training.errors import TrainingError
    from txl_tf import TransformerXLLM

    run = load_pretrained(os.path.join(FIXTURES, "run"))
    model = TransformerXLLM(run.config, batch_size=1)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    folder = shutil.copytree(os.path.join(FIXTURES, "run", "checkpoints"), tmp_path / "ckpt")
    state = TrainingCheckpoint(model, optimizer, str(folder),
                               tf.distribute.OneDeviceStrategy("/cpu:0"))
    with pytest.raises(TrainingError, match="before the attention's projections.*weights load"):
        state.restore_latest()


def test_the_export_of_an_int8_keras_file_is_refused_saying_why(tmp_path):
    """`python -m export --weights=<int8 model>.keras` said "save this model
    with save_to_preset (keras-hub) or model.save(...keras) instead": a
    .keras file is what it was given. A LoRA model's file exports (Keras
    saves its adapters merged into the kernels): the export's log-probs are
    the adapted model's."""
    from export import ModelDirError, open_runtime, run_export
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=8, tgt_len=4, dropout=0.0)
    cfg.to_json(str(tmp_path / "config.json"))
    model = causal_lm()
    model.quantize("int8")
    model.save(str(tmp_path / "int8.keras"))
    with pytest.raises(ModelDirError, match=r"int8\.keras.* an int8-quantized model "
                       r"\(transformer/layer_\d/\S+\)[^;]*; .*before quantize\(\)$") as refused:
        run_export(str(tmp_path / "out"), config=str(tmp_path / "config.json"),
                   weights=str(tmp_path / "int8.keras"), formats=["onnx"], verify=False)
    assert "model.save" not in str(refused.value) and "\n" not in str(refused.value)
    model = causal_lm()
    model.backbone.enable_lora(RANK)
    rng = np.random.default_rng(0)
    for w in model.trainable_weights:  # the adapters, B zero at first
        w.assign(rng.normal(0, 0.5, w.shape).astype(np.float32))
    model.save(str(tmp_path / "lora.keras"))
    run_export(str(tmp_path / "out"), config=str(tmp_path / "config.json"),
               weights=str(tmp_path / "lora.keras"), formats=["onnx"], decode_cache=False,
               mem_len=8, verify=False)
    ids = np.arange(10, dtype=np.int32).reshape(2, 5) % N_TOKEN
    core = model.backbone.transformer
    adapted = core(ids, core.initial_memory(2, 8))[0].numpy()
    runtime = open_runtime(str(tmp_path / "out"), backend="onnx", device="cpu")
    np.testing.assert_allclose(runtime.step(ids, runtime.initial_memory(2))[0], adapted,
                               atol=1e-5)


@pytest.mark.parametrize("adapt", ["lora", "int8"])
def test_float16_decode_graphs_of_an_adapted_core_are_refused_by_name(tmp_path, adapt):
    """They are converted from a float16 copy of the core built from its
    config, without adapters or int8 layers: a RuntimeError said only that
    the copy's weights were not the core's. (float32 decode graphs of such a
    core export as it computes.)"""
    from export.onnx_export import export_decode_onnx
    core = causal_lm().backbone.transformer
    if adapt == "lora":
        next(layer for layer in core._flatten_layers()
             if layer.name == "query").enable_lora(RANK)
    else:
        for layer in core._flatten_layers():
            if isinstance(layer, keras.layers.Dense):
                layer.quantize("int8")
    kind = "LoRA" if adapt == "lora" else "int8"
    with pytest.raises(TxlError, match=f"^float16 decode graphs .* {kind} layers .*"
                                       "decode_dtype='float32'"):
        export_decode_onnx(core, str(tmp_path), 8, None, decode_dtype="float16",
                           cache_dtype="float16")
    assert not os.listdir(tmp_path)


def test_the_exports_of_an_int8_core_record_its_quantization(tmp_path):
    """They hold its int8 kernels (ONNX initializers, MatMulInteger) and said
    nothing of it (a float core's say "none": tests/test_export_job.py; one
    rule with the classifier's)."""
    import onnx

    from export import export_onnx, export_saved_model, open_runtime
    core = causal_lm().backbone.transformer
    for layer in core._flatten_layers():
        if isinstance(layer, keras.layers.Dense):
            layer.quantize("int8")
    export_onnx(core, str(tmp_path / "int8.onnx"), 8)
    export_saved_model(core, str(tmp_path / "int8_saved_model"), 8)
    graph = onnx.load(str(tmp_path / "int8.onnx"), load_external_data=False).graph
    assert onnx.TensorProto.INT8 in {i.data_type for i in graph.initializer}
    for path, backend in [("int8.onnx", "onnx"), ("int8_saved_model", "saved_model")]:
        info = open_runtime(str(tmp_path / path), backend=backend, device="cpu").info
        assert info.values["weights_quantization"] == "int8", path
