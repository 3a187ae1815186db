"""`make demo` and the model it starts from: the shipped `pystdlib_small`
loads by name everywhere, its memory lowers its loss, and the demo's four
parts run on any byte-level model directory."""
import keras
import numpy as np
import pytest

from training import demo
from training.errors import TrainingError
from txl_tf import TransformerXL, TransformerXLCausalLM, TransformerXLConfig
from txl_tf.errors import TxlError
from txl_tf.learning.evaluation import evaluate_ids
from txl_tf.text import ByteTokenizer
from txl_tf.weights import load_pretrained, save_pretrained
from txl_tf.weights.shipped import SHIPPED, shipped_model_dir


def test_the_shipped_model_loads_by_name_and_its_memory_helps():
    from training import inputs
    core = load_pretrained("pystdlib_small")
    causal_lm = TransformerXLCausalLM.from_preset("pystdlib_small")
    for a, b in zip(core.weights, causal_lm.backbone.transformer.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert causal_lm.preprocessor is not None  # its vocabulary came with it
    valid = np.asarray(inputs.load("pystdlib", tokenizer=ByteTokenizer()).valid)[:20_000]
    cfg = core.config
    with_memory = evaluate_ids(core, valid, batch_size=4, mem_len=cfg.mem_len)["bpc"]
    without = evaluate_ids(core, valid, batch_size=4, mem_len=0)["bpc"]
    assert with_memory < without - 0.15 and with_memory < 2.3, (with_memory, without)


def test_an_existing_folder_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pystdlib_small").mkdir()
    assert shipped_model_dir("pystdlib_small") is None
    assert shipped_model_dir("nothing_shipped") is None and "pystdlib_small" in SHIPPED


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    keras.utils.set_random_seed(0)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=256))
    return save_pretrained(core, str(tmp_path_factory.mktemp("tiny")), ByteTokenizer())


FINETUNE_STEPS = 4


def test_the_demo_shows_memory_context_continuation_and_a_fine_tune(tiny_model, tmp_path,
                                                                     capsys, monkeypatch):
    from training import generate
    printed = []  # stdout, cut where each long part (a continuation, the fine-tune) starts
    continue_text, fit = generate.continue_text, TransformerXLCausalLM.fit

    def continuing(*args, **kwargs):
        printed.append(capsys.readouterr().out)
        return continue_text(*args, **kwargs)

    def fitting(self, *args, **kwargs):
        printed.append(capsys.readouterr().out)
        return fit(self, *args, **kwargs)
    monkeypatch.setattr(generate, "continue_text", continuing)
    monkeypatch.setattr(TransformerXLCausalLM, "fit", fitting)
    result = demo.run(model=tiny_model, eval_segments=2, context=32, num_tokens=8,
                      finetune_steps=FINETUNE_STEPS, finetune_learning_rate=3e-3,
                      output_dir=str(tmp_path))
    out = "".join(printed) + capsys.readouterr().out
    # Each long part is headed before it starts (it printed its heading after:
    # about a minute of silence apiece at the defaults), the continuations
    # streamed under theirs as they are generated.
    prompt = "import os\n\n\ndef "
    assert len(printed) == 3, printed
    assert printed[0].endswith(f"(sampled: temperature 0.5, top-k 5):\n{prompt}"), printed[0]
    assert printed[1].endswith(f"sampling does not):\n{prompt}"), printed[1]
    assert printed[1].startswith(result["sampled"]), printed[1]
    assert "\n4. fine-tuning for 4 steps" in printed[2], printed[2]
    # The untrained model is near uniform over 256 bytes: 8 bits per byte, give or take one.
    assert sorted(result["bpc"]) == [0, 16, 48]
    for bpc in result["bpc"].values():
        assert abs(bpc - 8) < 1, result["bpc"]
    assert [band[:2] for band in result["loss_by_context"]] == \
        [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 31)]
    assert all(abs(bits - 8) < 1 for _, _, bits in result["loss_by_context"]), \
        result["loss_by_context"]
    assert len(result["sampled"]) > 0
    # A fixed number of steps, the same on any machine, lowers the loss on
    # the same held-out text (export/'s source) measured before and after.
    finetune = result["finetune"]
    assert finetune["steps"] == FINETUNE_STEPS and abs(finetune["before"] - 8) < 1, finetune
    assert finetune["after"] < finetune["before"] - 0.2, finetune
    for heading in ("1. validation", "2. loss against", "3. continuation", "4. fine-tuning"):
        assert heading in out
    assert (tmp_path / "loss_by_context.png").stat().st_size > 1000
    assert (tmp_path / "finetuned_preset" / "model.weights.h5").is_file()


def test_bad_demo_flags_are_one_error():
    with pytest.raises(TrainingError, match="--context must be positive"):
        demo.run(context=0)
    with pytest.raises(TrainingError, match="--finetune_steps must be >= 0, got -1"):
        demo.run(finetune_steps=-1)


def test_a_model_that_does_not_read_bytes_is_refused(tmp_path):
    """Its figures would be bits per word printed as bits per byte."""
    from txl_tf.text import WordTokenizer
    words = WordTokenizer.build(["a b c"])
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=words.vocab_size))
    save_pretrained(core, str(tmp_path / "words"), words)
    with pytest.raises(TrainingError, match="reads word tokens: the demo reports bits per byte"):
        demo.run(model=str(tmp_path / "words"), finetune_steps=1)


@pytest.mark.parametrize("model", ["pystdlib_smal", ""])
def test_a_model_that_is_neither_a_folder_nor_a_shipped_name_names_the_shipped_ones(
        model, monkeypatch, tmp_path):
    """`txl-demo --model=pystdlib_smal` (a typo of the default) said only
    "model directory 'pystdlib_smal' does not exist": the flag also takes a
    shipped model's name, and the message did not say which there are."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TxlError, match=r"does not exist, nor is it a shipped model's name "
                                       r"\(shipped: pystdlib_small\)"):
        demo.run(model=model)
