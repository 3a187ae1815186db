"""What txl_tf 0.3.0 wrote is read by this version: a training run stopped
at a checkpoint resumes at its step and place in the data, and a model
directory, its tokenizer, an ONNX export with decode graphs and a keras-hub
preset give 0.3.0's numbers (`tests/fixtures/v0_3_0/README.md` says how the
files were made). Log-probs are compared at 1e-5: this version writes the
layer norms in another form (float32 round-off, ~1e-6); the ONNX files run
the same graphs, so those agree to round-off of ONNX Runtime alone."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "v0_3_0"
REF = dict(np.load(FIXTURES / "reference.npz"))
SETTINGS = json.loads((FIXTURES / "reference.json").read_text())
IDS = np.array(SETTINGS["ids"], np.int32)


def _every_eighth(log_probs):
    return np.asarray(log_probs)[..., ::8]


def test_the_model_directory_and_its_tokenizer_read_as_0_3_0_did():
    from txl_tf.text import load_tokenizer
    from txl_tf.weights import model_dir
    core, _ = model_dir.load(str(FIXTURES / "model_dir"))
    memory, parts = core.initial_memory(2), []
    for start in (0, 4):
        log_probs, memory = core(IDS[:, start:start + 4], memory)
        parts.append(_every_eighth(log_probs))
    np.testing.assert_allclose(np.concatenate(parts, 1), REF["core_log_probs"], atol=1e-5)
    tokenizer = load_tokenizer(FIXTURES / "model_dir" / "vocab")
    np.testing.assert_array_equal(tokenizer.encode(SETTINGS["text"]), REF["tokenizer_ids"])


def test_the_onnx_export_steps_decodes_and_generates_as_0_3_0_did():
    from export import open_runtime
    runtime = open_runtime(str(FIXTURES / "export" / "model.onnx"))
    log_probs, memory = runtime.step(IDS[:, :4], runtime.initial_memory(2))
    log_probs2, _ = runtime.step(IDS[:, 4:8], memory)
    np.testing.assert_allclose(_every_eighth(np.concatenate([log_probs, log_probs2], 1)),
                               REF["onnx_log_probs"], atol=1e-6)
    assert runtime.has_decode_cache
    cache, parts = runtime.decode_init(runtime.initial_memory(2)), []
    for t in range(REF["onnx_decode_log_probs"].shape[1]):
        log_probs, cache = runtime.decode_step(IDS[:, t], cache)
        parts.append(_every_eighth(log_probs).reshape(2, 1, -1))
    np.testing.assert_allclose(np.concatenate(parts, 1), REF["onnx_decode_log_probs"], atol=1e-6)
    np.testing.assert_array_equal(runtime.generate([[5, 6, 7], [8]], 6).ids,
                                  REF["onnx_greedy_ids"])


def test_the_keras_hub_preset_reads_as_0_3_0_did():
    from txl_tf.models.transformer_xl import TransformerXLCausalLM
    causal_lm = TransformerXLCausalLM.from_preset(str(FIXTURES / "preset"))
    log_probs = causal_lm({"token_ids": IDS[:, :4], "padding_mask": np.ones([2, 4], bool)})
    np.testing.assert_allclose(_every_eighth(log_probs), REF["preset_log_probs"], atol=1e-5)


def _flag_options(flags):
    """`train.run` options of 0.3.0's command line (`--name=value` strings)."""
    options = {"config_override": []}
    for flag in flags:
        name, _, value = flag[2:].partition("=")
        if name == "config_override":
            options[name].append(value)
        elif name.startswith("no") and not value:
            options[name[2:]] = False
        elif name == "log_batches":
            options[name] = True
        else:
            options[name] = int(value) if value.isdigit() else value
    return options


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_0_3_0_run_resumes_at_its_step_and_place_in_the_data(tmp_path):
    """The run stopped after its checkpoint at step 3 (its corpus moved since:
    the record allows a moved folder of the same data) goes on to step 6
    reading the batches of 0.3.0's uninterrupted run, and ends with its
    weights."""
    from training import train
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run", run)
    shutil.copy(FIXTURES / "corpus.txt", tmp_path / "corpus.txt")
    result = train.run(**_flag_options(SETTINGS["train_flags"]), model_dir=str(run),
                       data_dir=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"),
                       strategy="one_device", verbose=0)
    assert result["step"] == 6, result
    read = [json.loads(line) for line in open(run / "batches.jsonl")]
    full = [json.loads(line) for line in open(FIXTURES / "batches_full.jsonl")]
    assert [(r["step"], r["first_ids"]) for r in read] == \
        [(r["step"], r["first_ids"]) for r in full if r["step"] >= 3]
    with np.load(run / "export" / "weights.npz") as mine, \
            np.load(FIXTURES / "model_dir" / "weights.npz") as theirs:
        assert sorted(mine.files) == sorted(theirs.files)
        for name in theirs.files:
            np.testing.assert_allclose(mine[name], theirs[name], atol=1e-6, err_msg=name)


FLOAT16 = FIXTURES / "float16"


def _resume_float16(tmp_path, name):
    """`train.run` of 0.3.0's float16 run `FLOAT16 / name` (stopped after its
    checkpoint at step 3) with its flags; the run folder."""
    from training import train
    run = tmp_path / name
    shutil.copytree(FLOAT16 / name, run)
    shutil.copy(FIXTURES / "corpus.txt", tmp_path / "corpus.txt")
    flags = json.loads((FLOAT16 / "flags.json").read_text())[name]
    result = train.run(**_flag_options(flags), model_dir=str(run),
                       data_dir=str(tmp_path / "corpus.txt"), cache_dir=str(tmp_path / "cache"),
                       strategy="one_device", verbose=0)
    assert result["step"] == 6, result
    return run


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_0_3_0_float16_run_that_skipped_no_step_resumes_exactly(tmp_path):
    """Its checkpoint has no `skipped_steps` (0.3.0 did not count them) and
    was refused; its loss scale (2**15, a counter of 3 at step 3) shows no
    skip, so it resumes with none and ends with 0.3.0's uninterrupted run's
    weights."""
    run = _resume_float16(tmp_path, "run")
    with np.load(run / "export" / "weights.npz") as mine, \
            np.load(FLOAT16 / "weights_step_6.npz") as theirs:
        assert sorted(mine.files) == sorted(theirs.files)
        for name in theirs.files:
            np.testing.assert_allclose(mine[name], theirs[name], atol=1e-6, err_msg=name)


def test_a_0_3_0_float16_run_that_skipped_steps_is_refused_naming_0_3_0(tmp_path):
    """Its loss scale (2**13, a counter of 1 at step 3) shows two skipped
    steps, which Adam's bias correction would need counted."""
    from training.errors import TrainingError
    with pytest.raises(TrainingError, match=r"txl_tf 0\.3\.0.*skipped") as refused:
        _resume_float16(tmp_path, "skipped")
    assert "ckpt-3" in str(refused.value)


# Files from before 0.3.0: the keras-hub family's first commit (19601b1, where
# that round of work began, `__version__` still 0.1.0) and the subclassed
# TransformerXLLM of then (see also tests/fixtures/before_projection_layers).

def test_a_preset_of_the_first_keras_hub_version_loads_without_its_jit_generate(tmp_path):
    """Its task config held `jit_generate` (refused as an unknown argument);
    `generate` is always compiled now, so the preset reads as saved."""
    import keras_hub

    from txl_tf.models.transformer_xl import TransformerXLCausalLM
    saved = TransformerXLCausalLM.from_preset(str(FIXTURES / "model_dir"))
    saved.save_to_preset(str(tmp_path / "preset"))
    task = json.loads((tmp_path / "preset" / "task.json").read_text())
    task["config"]["jit_generate"] = True
    (tmp_path / "preset" / "task.json").write_text(json.dumps(task))
    x = {"token_ids": IDS[:, :4], "padding_mask": np.ones([2, 4], bool)}
    for loaded in (TransformerXLCausalLM.from_preset(str(tmp_path / "preset")),
                   keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))):
        np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(saved(x)))


def test_the_weights_file_of_the_old_transformer_xllm_is_refused_by_name_and_reads(tmp_path):
    """`save_weights` of the TransformerXLLM before it became a causal LM kept
    its variables under `core/`: `load_weights` names the reader (Keras listed
    every layer it could not load), which gives the weights."""
    from txl_tf import TransformerXLLM
    from txl_tf.errors import TxlError
    from txl_tf.weights import model_dir
    from txl_tf.weights.legacy_keras import _LegacyLM, load_legacy_core
    core, _ = model_dir.load(str(FIXTURES / "model_dir"))
    old = _LegacyLM(core.config, batch_size=2)  # that model's variable layout
    old.core.set_weights(core.get_weights())
    old.save_weights(str(tmp_path / "old.weights.h5"))
    with pytest.raises(TxlError, match="before it became a TransformerXLCausalLM.*"
                                       "load_legacy_core"):
        TransformerXLLM(core.config, batch_size=2).load_weights(str(tmp_path / "old.weights.h5"))
    with pytest.raises(TxlError, match="config and batch_size"):
        load_legacy_core(tmp_path / "old.weights.h5")
    read = load_legacy_core(tmp_path / "old.weights.h5", core.config, batch_size=2)
    # A file of today's TransformerXLLM: Keras's "A total of N objects could not be loaded".
    TransformerXLLM(core.config, batch_size=2).save_weights(str(tmp_path / "new.weights.h5"))
    with pytest.raises(TxlError, match=r"new\.weights\.h5 is not a weights file of the "
                                       r"TransformerXLLM before 0\.3\.0"):
        load_legacy_core(tmp_path / "new.weights.h5", core.config, batch_size=2)
    for mine, theirs in zip(read.get_weights(), core.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
