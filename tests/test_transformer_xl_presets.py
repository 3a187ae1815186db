"""The keras-hub family's presets, backbone and tokenizer: `from_preset` of
a model directory, of a keras-hub preset folder (`save_to_preset`, also
through `keras_hub.models.CausalLM`), of the paper's named configurations;
clear errors; the backbone's config round-trip; text in, text out."""
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import keras_hub
import numpy as np
import pytest

from txl_tf import (TransformerXL, TransformerXLBackbone, TransformerXLCausalLM,
                    TransformerXLConfig, TransformerXLLM, TransformerXLTokenizer)
from txl_tf.errors import TxlError
from txl_tf.models.transformer_xl.presets import PresetError
from txl_tf.text.byte import ByteTokenizer
from txl_tf.text.word import WordTokenizer
from txl_tf.weights.model_dir import load_pretrained, save_pretrained
from bfloat16_cpu import needs_bfloat16_matmuls

REPO = Path(__file__).resolve().parents[1]

IDS = np.array([[5, 6, 7, 8, 9, 10], [1, 2, 3, 0, 0, 0]], np.int32)
MASK = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], np.int32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    keras.utils.set_random_seed(1)
    core = TransformerXL(TransformerXLConfig.preset("tiny", init_std=0.3, mem_len=16, tgt_len=8))
    return save_pretrained(core, str(tmp_path_factory.mktemp("txl") / "model"), ByteTokenizer())


def scores(causal_lm):
    """Log-probs of IDS (padding masked) with no preprocessor in the way."""
    return causal_lm.backbone.transformer.crit(
        causal_lm.backbone({"token_ids": IDS, "padding_mask": MASK})).numpy()


def test_a_model_directory_loads_with_its_weights_and_vocabulary(model_dir):
    causal_lm = TransformerXLCausalLM.from_preset(model_dir)
    core = load_pretrained(model_dir)
    expected, _ = core(IDS[:1], core.initial_memory(1, mem_len=0))
    np.testing.assert_allclose(scores(causal_lm)[:1], expected.numpy(), atol=1e-5)
    tokenizer = causal_lm.preprocessor.tokenizer
    assert isinstance(tokenizer, TransformerXLTokenizer) and tokenizer.vocabulary_size() == 256
    assert causal_lm.preprocessor.sequence_length == core.config.tgt_len


def test_save_to_preset_round_trips_through_keras_hubs_own_loader(model_dir, tmp_path):
    causal_lm = TransformerXLCausalLM.from_preset(model_dir, sequence_length=24)
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    for loader in (keras_hub.models.CausalLM, TransformerXLCausalLM):
        again = loader.from_preset(str(tmp_path / "preset"))
        assert type(again) is TransformerXLCausalLM
        np.testing.assert_allclose(scores(again), scores(causal_lm), atol=1e-6)
        assert again.preprocessor.sequence_length == 24
        assert again.preprocessor.tokenizer.inner.fingerprint() == ByteTokenizer().fingerprint()
    backbone = keras_hub.models.Backbone.from_preset(str(tmp_path / "preset"))
    assert backbone.config == causal_lm.backbone.config


def test_generate_takes_and_returns_text(model_dir):
    causal_lm = TransformerXLCausalLM.from_preset(model_dir)
    causal_lm.compile(sampler="greedy")
    one = causal_lm.generate("import os", max_length=16)
    both = causal_lm.generate(["import os", "def f"], max_length=16)
    assert isinstance(one, str) and one.startswith("import os") and one == both[0]
    assert both[1].startswith("def f")
    assert causal_lm.generate("import os", max_length=16, strip_prompt=True) == one[9:]


@pytest.mark.parametrize("max_length, refusal", [
    (0, r"^generate: max_length must be an integer >= 1, got 0$"),  # was the preprocessor's 1024
    (-5, r"^generate: max_length must be an integer >= 1, got -5$"),  # cut 5 ids off the prompt
    (2 ** 31, r"^generate: max_length must be an integer in \[1, 2147483647\], got 2147483648$"),
    (65, r"^generate: max_length 65 for 2 rows needs at least 1,040 bytes \(the ids and "
         r"their padding mask, 8 bytes each\) and this machine has 1,024 bytes available; "
         r"ask for a shorter max_length or fewer prompts$")])
def test_a_max_length_that_is_no_length_or_cannot_fit_is_refused(model_dir, monkeypatch,
                                                                 max_length, refusal):
    """10**9 (15 GiB for two prompts) was a MemoryError in keras-hub's packer, or
    an OOM kill; here the memory available is made 1 KiB (65 ids: 1,040 bytes)."""
    from txl_tf.checks import memory_budget
    from txl_tf.errors import TxlError
    causal_lm = TransformerXLCausalLM.from_preset(model_dir)
    causal_lm.compile(sampler="greedy")
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 1024)
    with pytest.raises(TxlError, match=refusal):
        causal_lm.generate(["import os", "def f"], max_length=max_length)


def test_a_preprocessor_sequence_length_that_cannot_fit_is_refused(model_dir, monkeypatch):
    """`generate` without `max_length` pads to the preprocessor's
    `sequence_length`: `from_preset(..., sequence_length=10**9)` was a
    MemoryError in keras-hub's packer."""
    from txl_tf.checks import memory_budget
    from txl_tf.errors import TxlError
    causal_lm = TransformerXLCausalLM.from_preset(model_dir, sequence_length=65)
    causal_lm.compile(sampler="greedy")
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 1024)
    with pytest.raises(TxlError, match=r"^generate: the preprocessor's sequence_length 65 for 2 "
                                       r"rows needs at least"):
        causal_lm.generate(["import os", "def f"])
    causal_lm.generate("import os", max_length=16)  # 128 bytes


def test_named_presets_build_the_papers_configurations_without_weights():
    causal_lm = TransformerXLCausalLM.from_preset("tiny", load_weights=False)
    assert causal_lm.backbone.config == TransformerXLConfig.preset("tiny")
    assert causal_lm.preprocessor is None
    with pytest.raises(PresetError, match="txl-convert"):
        TransformerXLCausalLM.from_preset("enwik8_base")
    with pytest.raises(PresetError, match="unknown preset 'enwik9_base'"):
        TransformerXLCausalLM.from_preset("enwik9_base")


def test_a_file_given_for_a_preset_is_named(model_dir):
    # keras-hub said "Preset .../config.json has no config.json".
    for loader in (TransformerXLCausalLM, TransformerXLBackbone):
        with pytest.raises(PresetError, match=r"config.json' is a file: pass its folder"):
            loader.from_preset(f"{model_dir}/config.json")


def test_a_broken_keras_hub_preset_folder_is_named(model_dir, tmp_path):
    """A weights file cut short was h5py's OSError "Unable to synchronously
    open file (truncated file: ...)" naming no file; a config.json that is
    not JSON made the folder "neither a model directory ... nor a training
    run directory"."""
    TransformerXLCausalLM.from_preset(model_dir).save_to_preset(str(tmp_path / "whole"))
    broken = {"cut_weights": ("model.weights.h5", lambda data: data[:1000]),
              "config_not_json": ("config.json", lambda data: data[:20]),
              "config_a_number": ("config.json", lambda data: b"3")}
    for name, (file, cut) in broken.items():
        folder = tmp_path / name
        shutil.copytree(tmp_path / "whole", folder)
        (folder / file).write_bytes(cut((folder / file).read_bytes()))
        pattern = (rf"^cannot load the keras-hub preset '.*{name}': Unable to synchronously open "
                   r"file \(truncated file" if file.endswith(".h5") else
                   rf"^cannot read the keras-hub preset's .*{name}/config\.json: ")
        for loader in (TransformerXLCausalLM, TransformerXLBackbone):
            with pytest.raises(PresetError, match=pattern):
                loader.from_preset(str(folder))


def test_the_backbone_config_round_trips_and_names_the_papers_fields():
    cfg = TransformerXLConfig.preset("tiny", n_token=40, cutoffs=[20], div_val=2, untie_r=True,
                                     same_length=True, clamp_len=5)
    backbone = TransformerXLBackbone(**cfg.to_dict())
    again = TransformerXLBackbone.from_config(backbone.get_config())
    assert again.config == cfg and backbone.config == cfg
    assert backbone.token_embedding is backbone.transformer.word_emb
    registered = keras.saving.get_registered_object("txl_tf>TransformerXLBackbone")
    assert registered is TransformerXLBackbone


def test_misspelled_arguments_are_refused_not_dropped():
    """Keras's functional model silently drops keyword arguments it does not
    know: a typo would build a model of other sizes or lengths."""
    from txl_tf import ConfigError, TxlError
    with pytest.raises(ConfigError, match=r"unknown arguments \['n_layers'\]"):
        TransformerXLBackbone(n_token=40, n_layers=3)
    backbone = TransformerXLBackbone(**TransformerXLConfig.preset("tiny", n_token=40).to_dict())
    with pytest.raises(TxlError, match=r"unknown arguments \['memlen'\]"):
        TransformerXLCausalLM(backbone, memlen=4)
    with pytest.raises(TxlError, match="segment_len must be an integer >= 1, got 2.5"):
        TransformerXLCausalLM(backbone, segment_len=2.5)  # was cut to 2


def test_the_tokenizer_wraps_words_and_saves_with_the_preset(tmp_path):
    words = WordTokenizer(["<unk>", "<eos>", "the", "cat", "sat"])
    tokenizer = TransformerXLTokenizer(words)
    ids = tokenizer.tokenize(["the cat sat", "the dog"])
    assert ids.to_list() == [[2, 3, 4, 1], [2, 0, 1]]
    assert tokenizer.detokenize(ids) == ["the cat sat\n", "the <unk>\n"]
    assert tokenizer.token_to_id("cat") == 3 and tokenizer.get_vocabulary()[4] == "sat"
    tokenizer.save_assets(str(tmp_path))  # what save_to_preset writes under assets/
    again = TransformerXLTokenizer.from_config(tokenizer.get_config())
    again.load_assets(str(tmp_path))
    assert again.inner.fingerprint() == words.fingerprint()


@pytest.mark.parametrize("inner", [WordTokenizer(["<unk>", "<eos>", "the"]), ByteTokenizer()])
def test_the_tokenizer_names_an_id_outside_its_vocabulary(inner):
    # A list's index: -1 gave the last entry (a wrong answer), 3 an IndexError.
    tokenizer = TransformerXLTokenizer(inner)
    size = tokenizer.vocabulary_size()
    for bad in (-1, size, 1.5, True):
        with pytest.raises(TxlError, match=rf"^id {bad!r} is outside the vocabulary "
                                           rf"\[0, {size}\)$"):
            tokenizer.id_to_token(bad)
    assert tokenizer.id_to_token(np.int64(2)) == ("the" if size == 3 else "\x02")
    with pytest.raises(TxlError, match="'the cat' is not one token of the vocabulary"):
        tokenizer.token_to_id("the cat")
    with pytest.raises(TxlError, match="the tokenizer has no vocabulary yet"):
        TransformerXLTokenizer().tokenize("the")
    assert tokenizer.detokenize(np.array([2, 2])) == tokenizer.detokenize([[2, 2]])[0]


def test_the_tokenizer_lists_sentencepiece_pieces_as_its_vocabulary():
    # get_vocabulary gave [the model's hash] (one entry), so id_to_token
    # raised IndexError and token_to_id refused every piece.
    from txl_tf.text import SentencePieceTokenizer
    text = ["the cat sat on the mat", "a dog ran to the old tree"] * 20
    inner = SentencePieceTokenizer.train(texts=text, vocab_size=300)
    tokenizer = TransformerXLTokenizer(inner)
    assert tokenizer.get_vocabulary() == inner.pieces
    assert len(tokenizer.get_vocabulary()) == tokenizer.vocabulary_size() == inner.vocab_size
    for i in (0, 3, inner.vocab_size - 1):
        assert tokenizer.token_to_id(tokenizer.id_to_token(i)) == i


def test_generate_prompts_continue_their_last_line_as_the_command_line_does():
    # keras-hub's generate_preprocess kept the <eos> the word tokenizer adds
    # to an unfinished last line: generate("the cat") continued after a line
    # end, while `python -m training.generate` continues the line.
    import random

    import tensorflow as tf

    from training.generate import prompt_ids
    from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
        TransformerXLCausalLMPreprocessor)
    words = WordTokenizer(["<unk>", "<eos>", "the", "cat", "sat"])
    lm1b = WordTokenizer(["<S>", "<UNK>", "the", "cat"], unk_token="<UNK>", eos_token="<S>",
                         bos_token="<S>")
    rng = random.Random(7)
    pieces = ["the", "cat", "sat", "dog", " ", "  ", "\t", "\n", "\r\n", "\u2028", "\x00"]
    prompts = ["the cat", "the cat\n", "the\ncat", " ", "\n", "cat \n\n"] + [
        "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(20)]
    for inner in (words, lm1b, ByteTokenizer()):
        preprocessor = TransformerXLCausalLMPreprocessor(TransformerXLTokenizer(inner),
                                                         sequence_length=32)
        rows = preprocessor.generate_preprocess(prompts)
        graph = next(iter(tf.data.Dataset.from_tensors(prompts).map(
            preprocessor.generate_preprocess)))
        one = preprocessor.generate_preprocess(prompts[0])
        for i, prompt in enumerate(prompts):
            expected = prompt_ids(inner, prompt).tolist()
            for got in (rows, graph):
                mask = np.asarray(got["padding_mask"][i], bool)
                assert np.asarray(got["token_ids"][i])[mask].tolist() == expected, prompt
        assert np.asarray(one["token_ids"])[np.asarray(one["padding_mask"], bool)].tolist() \
            == prompt_ids(inner, prompts[0]).tolist()
        # No ids at all (the rule's gather of each row's last id was out of range).
        empty = preprocessor.generate_preprocess("")
        assert not np.asarray(empty["padding_mask"]).any() and prompt_ids(inner, "").size == 0
    assert prompt_ids(words, "the cat").tolist() == [2, 3]


def test_a_model_converted_from_the_hugging_face_port_loads_as_a_preset(tmp_path):
    """`txl-convert`'s output of the port's layout (PyTorch same_length rule,
    zero-filled start) through `from_preset`, `save_to_preset` and keras-hub's
    loader: the same scores as `load_pretrained`, and `generate` the
    Decoder's ids with the memory the model expects."""
    from tests.test_convert import _port_files
    from txl_tf import Decoder
    from txl_tf.weights.convert import convert
    _, weights, config, vocab = _port_files(tmp_path)
    out = str(tmp_path / "model")
    convert("pytorch", weights, out, config=config, vocab=vocab)
    core = load_pretrained(out)
    ids = np.random.default_rng(0).integers(0, 60, (2, 6)).astype(np.int32)
    # Rows are read from an empty memory: with same_length, of the config's
    # mem_len slots (no slots would leave each position only itself).
    expected, _ = core(ids, core.initial_memory(2, zero_filled=False))
    causal_lm = TransformerXLCausalLM.from_preset(out)
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    again = keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))
    for model in (causal_lm, again):
        got = model.backbone.transformer.crit(model.backbone(
            {"token_ids": ids, "padding_mask": np.ones_like(ids)}))
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)
        # the preset records the vocabulary's fingerprint, as txl-convert's directory does
        assert model.backbone.config == core.config
    assert again.backbone.config.vocab_fingerprint == \
        causal_lm.preprocessor.tokenizer.inner.fingerprint()
    prompt = ids[:1]
    padded = {"token_ids": np.pad(prompt, [[0, 0], [0, 14]]),
              "padding_mask": np.pad(np.ones_like(prompt), [[0, 0], [0, 14]])}
    again.compile(sampler="greedy")
    again.preprocessor = None  # ids in, ids out
    out_ids = again.generate(padded, stop_token_ids=None)["token_ids"][0, 6:]
    decoder = Decoder(core)
    np.testing.assert_array_equal(out_ids, decoder.generate(prompt, 14, temperature=0).ids[0])


def test_the_tokenizer_and_preprocessor_load_from_a_preset_alone(model_dir, tmp_path):
    # TransformerXLTokenizer had no backbone_cls: keras-hub's from_preset
    # found no tokenizer class for the preset ("Unable to find a subclass of
    # Tokenizer that is compatible with TransformerXLBackbone").
    from txl_tf.models.transformer_xl import TransformerXLCausalLMPreprocessor
    TransformerXLCausalLM.from_preset(model_dir).save_to_preset(str(tmp_path / "preset"))
    expected = ByteTokenizer().encode("import os").tolist()
    for loader in (TransformerXLTokenizer, keras_hub.tokenizers.Tokenizer):
        tokenizer = loader.from_preset(str(tmp_path / "preset"))
        assert type(tokenizer) is TransformerXLTokenizer
        assert tokenizer.tokenize("import os").numpy().tolist() == expected
    for loader in (TransformerXLCausalLMPreprocessor, keras_hub.models.CausalLMPreprocessor):
        assert type(loader.from_preset(str(tmp_path / "preset"))) is \
            TransformerXLCausalLMPreprocessor


def test_a_preset_whose_vocabulary_is_not_the_models_is_refused(model_dir, tmp_path):
    """A preset's tokenizer files of another vocabulary (another size, or the
    size but not the fingerprint the config records) loaded silently and
    gave other ids, as a model directory's `vocab/` does not."""
    import shutil

    from txl_tf.errors import ModelDirError
    from txl_tf.text.char import CharTokenizer
    TransformerXLCausalLM.from_preset(model_dir).save_to_preset(str(tmp_path / "preset"))
    same_size = CharTokenizer([chr(c) for c in range(256)], unk_char=None)
    for name, other, message in [("bigger", WordTokenizer(["<unk>", "<eos>", "a"]),
                                  "size mismatch: .* has 3 tokens, the model has n_token=256"),
                                 ("same_size", same_size, "not the vocabulary the model was "
                                                          "trained with")]:
        preset = shutil.copytree(tmp_path / "preset", tmp_path / name)
        shutil.rmtree(preset / "assets" / "tokenizer")
        other.save(preset / "assets" / "tokenizer")
        with pytest.raises(ModelDirError, match=message):
            TransformerXLCausalLM.from_preset(str(preset))
        causal_lm = keras_hub.models.CausalLM.from_preset(str(preset))  # keras-hub's own
        with pytest.raises(ModelDirError, match=message):
            causal_lm.generate("a", max_length=4)
        with pytest.raises(ModelDirError, match=message):
            causal_lm.fit(["a a"], verbose=0)


def test_a_preset_of_a_model_without_a_recorded_vocabulary_records_it(tmp_path):
    """`save_to_preset` of a model whose config records no fingerprint wrote
    none: its vocabulary with two lines swapped (the folder rewritten, as by
    `Tokenizer.save`) loaded without a word and read "the cat" as "cat the"."""
    import json
    import shutil

    from txl_tf.errors import ModelDirError
    words = ["<unk>", "<eos>", "the", "cat", "sat"]
    cfg = TransformerXLConfig.preset("tiny", n_token=len(words), tgt_len=4, mem_len=4)
    causal_lm = TransformerXLCausalLM(
        TransformerXLBackbone(**cfg.to_dict()),
        preprocessor=TransformerXLCausalLM.preprocessor_cls(
            TransformerXLTokenizer(WordTokenizer(words)), sequence_length=8))
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    assert causal_lm.core.config.vocab_fingerprint is None  # the model is left as it was
    with open(tmp_path / "preset" / "config.json", encoding="utf-8") as f:
        assert json.load(f)["config"]["vocab_fingerprint"] == WordTokenizer(words).fingerprint()
    assert TransformerXLCausalLM.from_preset(str(tmp_path / "preset")).core.config == \
        cfg.replace(vocab_fingerprint=WordTokenizer(words).fingerprint())
    shutil.rmtree(tmp_path / "preset" / "assets" / "tokenizer")
    WordTokenizer(words[:2] + [words[3], words[2]] + words[4:]).save(
        tmp_path / "preset" / "assets" / "tokenizer")
    message = "the preprocessor's tokenizer is not the vocabulary the model was trained with"
    with pytest.raises(ModelDirError, match=message):
        TransformerXLCausalLM.from_preset(str(tmp_path / "preset"))
    with pytest.raises(ModelDirError, match=message):
        keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset")).generate("the",
                                                                                 max_length=4)


@needs_bfloat16_matmuls
def test_a_preset_saved_under_mixed_precision_loads(tmp_path):
    # keras-hub's loader took the saved policy's name for a dtype:
    # "ValueError: Invalid dtype: mixed_bfloat16". A float preset loads
    # under the global policy (keras-hub's rule), and so does this one.
    # `sequence_length` was refused for a keras-hub folder ("unknown arguments").
    cfg = TransformerXLConfig.preset("tiny", n_token=256, tgt_len=4)
    causal_lm = TransformerXLCausalLM(
        TransformerXLBackbone(**cfg.to_dict(), dtype="mixed_bfloat16"),
        preprocessor=TransformerXLCausalLM.preprocessor_cls(TransformerXLTokenizer(ByteTokenizer()),
                                                            sequence_length=8))
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    again = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"), sequence_length=5)
    assert again.core.dtype_policy.name == keras.config.dtype_policy().name
    assert again.preprocessor.sequence_length == 5
    bf16 = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"), dtype="mixed_bfloat16")
    np.testing.assert_array_equal(scores(bf16), scores(causal_lm))


@pytest.mark.parametrize("kind", [  # the odd seeds compute in bfloat16
    "byte", pytest.param("char", marks=needs_bfloat16_matmuls), "word",
    pytest.param("sentencepiece", marks=needs_bfloat16_matmuls)])
def test_random_models_round_trip_through_a_preset_bitwise(kind, tmp_path):
    """A seeded random small model and vocabulary of each kind, saved with
    `save_to_preset`, comes back through every keras-hub loader: the same
    config, lengths, log-probs (bitwise), vocabulary and ids, also after the
    seed is set again (tf.random.set_seed dropped SentencePiece's model)."""
    import random

    from txl_tf.models.transformer_xl import TransformerXLCausalLMPreprocessor
    from txl_tf.text import CharTokenizer, SentencePieceTokenizer
    seed = ["byte", "char", "word", "sentencepiece"].index(kind)
    rng = random.Random(seed)
    texts = ["the cat sat on the mat\n", "  def f(a, b):\n", "a dog ran to the old tree"]
    inner = {"byte": ByteTokenizer, "char": lambda: CharTokenizer.build("".join(texts)),
             "word": lambda: WordTokenizer.build("".join(texts)),
             "sentencepiece": lambda: SentencePieceTokenizer.train(texts=texts * 8,
                                                                   vocab_size=300)}[kind]()
    n_token = inner.vocab_size
    cutoffs = sorted(rng.sample(range(2, n_token - 1), rng.randint(0, 2)))
    cfg = TransformerXLConfig(
        n_token=n_token, n_layer=rng.randint(1, 2), d_model=rng.choice([8, 16]),
        n_head=rng.randint(1, 3), d_head=4, d_inner=16, cutoffs=cutoffs,
        div_val=rng.choice([1, 2]) if cutoffs else 1, tie_weight=rng.random() < 0.7,
        untie_r=rng.random() < 0.5, pre_lnorm=rng.random() < 0.5, dropout=0.0,
        tgt_len=rng.randint(1, 6), mem_len=rng.randint(0, 6), clamp_len=rng.choice([-1, 3]),
        same_length=rng.random() < 0.5, init_std=0.3)
    dtype = "mixed_bfloat16" if seed % 2 else None
    keras.utils.set_random_seed(seed)
    tokenizer = TransformerXLTokenizer(inner)
    causal_lm = TransformerXLCausalLM(
        TransformerXLBackbone(**cfg.to_dict(), dtype=dtype),
        TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=rng.randint(4, 12)),
        mem_len=rng.randint(0, 6), segment_len=rng.randint(1, 4))
    lengths = [rng.randint(1, 6) for _ in range(3)]
    ids = np.array([[rng.randrange(n_token) for _ in range(6)] for _ in lengths], np.int32)
    inputs = {"token_ids": ids, "padding_mask": (np.arange(6) < np.c_[lengths]).astype(np.int32)}
    expected = causal_lm(inputs).numpy()
    words = tokenizer.tokenize(texts).to_list()
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    keras.utils.set_random_seed(seed + 1)
    policy = {"dtype": causal_lm.backbone.dtype_policy.name}
    # keras-hub's rule: a preset loads under the global policy unless told
    assert TransformerXLCausalLM.from_preset(str(tmp_path / "preset")).core.compute_dtype == \
        keras.config.dtype_policy().compute_dtype
    loaders = [TransformerXLCausalLM.from_preset] + (
        [] if dtype else [keras_hub.models.CausalLM.from_preset])  # keras-hub's fails on mixed
    for load in loaders:
        again = load(str(tmp_path / "preset"), **policy)
        np.testing.assert_array_equal(again(inputs).numpy(), expected)
        assert again.backbone.config == cfg.replace(vocab_fingerprint=inner.fingerprint())
        assert (again.mem_len, again.segment_len, again.preprocessor.sequence_length) == \
            (causal_lm.mem_len, causal_lm.segment_len, causal_lm.preprocessor.sequence_length)
        assert again.preprocessor.tokenizer.get_vocabulary() == tokenizer.get_vocabulary()
    backbone = keras_hub.models.Backbone.from_preset(str(tmp_path / "preset"), **policy)
    np.testing.assert_array_equal(backbone(inputs).numpy(), causal_lm.backbone(inputs).numpy())
    for load in (TransformerXLTokenizer.from_preset, keras_hub.tokenizers.Tokenizer.from_preset,
                 lambda p: keras_hub.models.CausalLMPreprocessor.from_preset(p).tokenizer):
        again = load(str(tmp_path / "preset"))
        assert again.inner.fingerprint() == inner.fingerprint()
        assert again.tokenize(texts).to_list() == words == tokenizer.tokenize(texts).to_list()


def test_a_preset_save_killed_anywhere_leaves_one_whole_preset_or_an_error(
        model_dir, tmp_path, killed_at_file_operation):
    """keras-hub wrote the preset in place, config.json before the weights: a
    save over another preset killed in between left the new config (another
    clamp_len and same_length) beside the old weights, loaded without a word."""
    from txl_tf.errors import TxlError
    old = TransformerXLCausalLM.from_preset(model_dir)
    core = TransformerXL(TransformerXLConfig.preset("tiny", init_std=0.3, mem_len=16, tgt_len=8,
                                                    clamp_len=3, same_length=True))
    new = TransformerXLCausalLM(TransformerXLBackbone.from_core(core),
                                preprocessor=old.preprocessor)
    # Killed before the k-th rename or removal of a file or write of the weights.
    outcomes, k = set(), 0
    while "new" not in outcomes:
        k += 1
        folder = tmp_path / f"k{k}"
        old.save_to_preset(str(folder))
        killed_at_file_operation(lambda: new.save_to_preset(str(folder)), k,
                                 also=[(keras.Model, "save_weights")])
        try:
            loaded = TransformerXLCausalLM.from_preset(str(folder))
        except TxlError as err:
            assert "is neither a model directory" in str(err)
            outcomes.add("refused")
            continue
        expected = new if loaded.core.config.clamp_len == 3 else old
        assert loaded.core.config.same_length == expected.core.config.same_length
        np.testing.assert_array_equal(scores(loaded), scores(expected), f"killed at {k}")
        outcomes.add("new" if expected is new else "old")
    assert outcomes == {"old", "refused", "new"}


def test_a_backbone_saved_over_a_causal_lm_preset_leaves_a_backbone_preset(model_dir, tmp_path):
    """The task's task.json, preprocessor.json, tokenizer.json and assets/
    stayed: `TransformerXLCausalLM.from_preset` built the old task, the old
    backbone's config in its task.json (clamp_len -1), over the new weights.
    A backbone's preset has no tokenizer: keras-hub's task loader needs
    `preprocessor=None` there."""
    import os
    causal_lm = TransformerXLCausalLM.from_preset(model_dir, sequence_length=24)
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    assert {"task.json", "preprocessor.json", "tokenizer.json", "assets"} <= set(
        os.listdir(tmp_path / "preset"))
    core = TransformerXL(TransformerXLConfig.preset("tiny", init_std=0.3, mem_len=16, tgt_len=8,
                                                    clamp_len=3))
    backbone = TransformerXLBackbone.from_core(core)
    backbone.save_to_preset(str(tmp_path / "preset"))
    backbone.save_to_preset(str(tmp_path / "alone"))
    assert sorted(os.listdir(tmp_path / "preset")) == sorted(os.listdir(tmp_path / "alone")) \
        == ["config.json", "metadata.json", "model.weights.h5"]
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        TransformerXLCausalLM.from_preset(str(tmp_path / "preset"))
    again = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"), preprocessor=None)
    assert again.core.config.clamp_len == 3
    np.testing.assert_array_equal(again.backbone({"token_ids": IDS, "padding_mask": MASK}),
                                  backbone({"token_ids": IDS, "padding_mask": MASK}))
    causal_lm.save_to_preset(str(tmp_path / "preset"))  # and back: the task's files again
    assert TransformerXLCausalLM.from_preset(
        str(tmp_path / "preset")).preprocessor.sequence_length == 24


def test_another_threads_weights_save_and_load_are_untouched_by_a_preset_save(tmp_path,
                                                                               monkeypatch):
    """A preset save swapped Keras's module-level `H5IOStore` for its
    in-memory subclass: another thread's `save_weights` whose store was made
    before then failed Keras's check inside ("Expected weights_store to be an
    instance of H5IOStore")."""
    import threading
    user_inside, preset_inside, user_done = (threading.Event() for _ in range(3))

    class Outer(keras.layers.Layer):  # the user's save pauses at it, its store made
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(2)

        def build(self, shape):
            self.inner.build(shape)

        def call(self, x):
            return self.inner(x)

        def save_own_variables(self, store):
            user_inside.set()
            assert preset_inside.wait(60)

    user, other = (keras.Sequential([keras.Input((3,)), Outer()]) for _ in range(2))
    path = str(tmp_path / "user.weights.h5")
    errors = []

    def user_thread():
        try:
            user.save_weights(path)
            other.load_weights(path)
        except Exception as err:  # reported below
            errors.append(err)
        finally:
            user_done.set()

    keras_save = TransformerXLBackbone.save_own_variables

    def inside_the_preset_save(self, store):  # the preset's store is the in-memory one
        assert store is not None
        preset_inside.set()
        assert user_done.wait(60)
        return keras_save(self, store)

    monkeypatch.setattr(TransformerXLBackbone, "save_own_variables", inside_the_preset_save)
    thread = threading.Thread(target=user_thread)
    thread.start()
    assert user_inside.wait(60)
    backbone = TransformerXLBackbone(**TransformerXLConfig.preset("tiny").to_dict())
    backbone.save_to_preset(str(tmp_path / "preset"))
    thread.join(60)
    assert errors == [] and preset_inside.is_set()
    np.testing.assert_array_equal(other.layers[0].inner.kernel.numpy(),
                                  user.layers[0].inner.kernel.numpy())
    again = TransformerXLBackbone.from_preset(str(tmp_path / "preset"))
    for a, b in zip(again.weights, backbone.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_second_object_of_the_presets_module_still_builds_weights_in_memory(tmp_path,
                                                                             monkeypatch):
    """The wrapped `H5IOStore` read the depth of the module object that
    wrapped it: once the module was imported again (its `sys.modules` entry
    deleted, as test runners and reloaders do), the new object's blocks
    raised a depth the wrapper never read, and weights went to HDF5's own
    file writes again (a full disk: a segmentation fault)."""
    import importlib
    import io
    import sys

    from keras.src.saving import saving_lib
    name = "txl_tf.models.transformer_xl.presets"
    first = importlib.import_module(name)
    with first._weights_through_memory():
        pass  # the store is wrapped by the first object
    monkeypatch.setattr(sys.modules["txl_tf.models.transformer_xl"], "presets", first)
    monkeypatch.delitem(sys.modules, name)
    second = importlib.import_module(name)
    assert second is not first
    with second._weights_through_memory():
        store = saving_lib.H5IOStore(str(tmp_path / "a.weights.h5"), mode="w")
        assert isinstance(store.path_or_io, io.BytesIO)
        store.close()
    assert (tmp_path / "a.weights.h5").stat().st_size > 0


def test_a_causal_lm_without_a_preprocessor_saves_and_loads_as_a_preset(tmp_path):
    keras.utils.set_random_seed(2)
    config = TransformerXLConfig.preset("tiny", n_token=30, init_std=0.3)
    lm = TransformerXLCausalLM(TransformerXLBackbone(**config.to_dict()))
    lm.save_to_preset(str(tmp_path / "preset"))
    assert [p.name for p in tmp_path.iterdir()] == ["preset"]  # the staging folder is gone
    loaded = TransformerXLCausalLM.from_preset(str(tmp_path / "preset"))
    assert loaded.preprocessor is None
    for got, want in zip(loaded.backbone.get_weights(), lm.backbone.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("imports", ["import txl_tf, keras_hub", "import keras_hub, txl_tf"])
def test_importing_txl_tf_registers_its_classes_for_a_fresh_process(model_dir, tmp_path,
                                                                    imports):
    """`import txl_tf` imports no TensorFlow, and registers its classes with
    Keras once Keras is imported, before or after it: a fresh process loads
    a keras-hub preset through `keras_hub.models.CausalLM.from_preset` and a
    `.keras` file through `keras.models.load_model` by their registered
    names alone."""
    causal_lm = TransformerXLCausalLM.from_preset(model_dir)
    causal_lm.save_to_preset(str(tmp_path / "preset"))
    model = TransformerXLLM(TransformerXLConfig.preset("tiny", mem_len=4, tgt_len=4),
                            batch_size=1)
    model.save(tmp_path / "lm.keras")
    code = (f"{imports}\nimport keras\n"
            f"print(type(keras_hub.models.CausalLM.from_preset({str(tmp_path / 'preset')!r}))"
            f".__name__, type(keras.models.load_model({str(tmp_path / 'lm.keras')!r}))"
            ".__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["TransformerXLCausalLM", "TransformerXLLM"]
