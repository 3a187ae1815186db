"""The shipped flagfiles parse and carry the paper's training settings."""
import glob
import os

import pytest
from absl import flags

from training import train
from training.model_config import build_config
from txl_tf import PRESETS
from txl_tf.app.flagspec import define, values

CONFIGS = os.path.join(os.path.dirname(train.__file__), "configs")

# name: (preset, dataset, global batch, lr, warmup, steps, tgt/mem, dropout, dropatt, config)
PAPER = {
    "enwik8_base": ("enwik8_base", "enwik8", 24, 2.5e-4, 0, 400_000, 512, 0.1, 0.0,
                    dict(n_layer=12, d_model=512, untie_r=False, div_val=1)),
    "enwik8_large": ("enwik8_large", "enwik8", 64, 2.5e-4, 4000, 400_000, 768, 0.15, 0.15,
                     dict(n_layer=24, d_model=1024, d_inner=3072, untie_r=False)),
    "text8": ("text8", "text8", 64, 2.5e-4, 4000, 400_000, 768, 0.15, 0.15,
              dict(n_layer=24, d_model=1024, untie_r=False)),
    "wt103_base": ("wt103_base", "wt103", 60, 2.5e-4, 0, 200_000, 150, 0.1, 0.0,
                   dict(n_layer=16, d_model=410, div_val=1, cutoffs=[20000, 40000, 200000])),
    "wt103_large": ("wt103_large", "wt103", 128, 2.5e-4, 16000, 4_000_000, 384, 0.2, 0.2,
                    dict(n_layer=18, div_val=4, untie_r=True, init_std=0.005,
                         tie_projs=[False, True, True, True])),
    "lm1b_base": ("lm1b_base", "lm1b", 256, 2.5e-4, 0, 400_000, 256, 0.1, 0.0,
                  dict(n_layer=18, div_val=4, untie_r=True, proj_same_dim=False,
                       tie_projs=[False, False, False, False])),
    "lm1b_large": ("lm1b_large", "lm1b", 512, 1e-4, 30000, 1_200_000, 32, 0.05, 0.05,
                   dict(n_layer=24, d_model=1280, n_head=16, d_head=80, d_inner=8192,
                        div_val=4, untie_r=True, proj_same_dim=False, init_std=0.005,
                        tie_projs=[False, False, False, False])),
}


def test_every_config_is_checked():
    names = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(CONFIGS, "*.cfg")))
    assert names == sorted(PAPER)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_flagfile(name):
    preset, dataset, batch, lr, warmup, steps, length, dropout, dropatt, fields = PAPER[name]
    flag_values = flags.FlagValues()
    define(train.SPEC, flag_values)
    flag_values(["train", f"--flagfile={os.path.join(CONFIGS, name + '.cfg')}"])
    o = values(train.SPEC, flag_values)
    assert (o["preset"], o["dataset"], o["batch_size"]) == (preset, dataset, batch)
    assert (o["learning_rate"], o["warmup_steps"], o["train_steps"]) == (lr, warmup, steps)
    assert (o["min_lr_ratio"], o["clip"]) == (0.004, 0.25)
    config = build_config(preset, PRESETS[preset]["n_token"], None,
                          train._model_overrides(o), log=lambda _: None)
    assert (config.tgt_len, config.mem_len) == (length, length)
    assert (config.dropout, config.dropatt) == (dropout, dropatt)
    for field, value in fields.items():
        assert getattr(config, field) == value, field


# The architecture of each configuration's source script (n_layer, d_model,
# n_head, d_head, d_inner, div_val, cutoffs, untie_r, init_std, proj_same_dim).
ARCHITECTURE = {
    "enwik8_base": (12, 512, 8, 64, 2048, 1, [], False, 0.02, True),
    "enwik8_large": (24, 1024, 8, 128, 3072, 1, [], False, 0.02, True),
    "text8": (24, 1024, 8, 128, 3072, 1, [], False, 0.02, True),
    "wt103_base": (16, 410, 10, 41, 2100, 1, [20000, 40000, 200000], False, 0.02, True),
    "wt103_large": (18, 1024, 16, 64, 4096, 4, [20000, 40000, 200000], True, 0.005, True),
    "lm1b_base": (18, 1024, 8, 128, 4096, 4, [60000, 100000, 640000], True, 0.02, False),
    "lm1b_large": (24, 1280, 16, 80, 8192, 4, [60000, 100000, 640000], True, 0.005, False),
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURE))
def test_preset_architecture_is_the_scripts(name):
    config = build_config(PAPER[name][0], PRESETS[name]["n_token"], None, {},
                          log=lambda _: None)
    fields = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val", "cutoffs",
              "untie_r", "init_std", "proj_same_dim")
    assert tuple(getattr(config, f) for f in fields) == ARCHITECTURE[name]
    assert (config.d_embed, config.attn_type, config.pre_lnorm) == (config.d_model, 0, False)
    assert (config.tie_weight, config.same_length, config.clamp_len) == (True, False, -1)


# The paper's evaluation (pytorch/run_*.sh eval): tgt_len, mem_len, clamp_len, same_length.
EVALUATION = {
    "enwik8_base": (80, 2100, 820, True), "enwik8_large": (128, 3800, 1000, True),
    "text8": (128, 3800, 1000, True), "wt103_base": (64, 640, 400, True),
    "wt103_large": (128, 1600, 1000, True), "lm1b_base": (32, 128, -1, True),
    "lm1b_large": (32, 128, -1, True),
}


@pytest.mark.parametrize("name", sorted(EVALUATION))
def test_paper_evaluation_settings_are_the_scripts(name):
    from txl_tf.config import eval_settings
    settings = eval_settings(name)
    fields = ("tgt_len", "mem_len", "clamp_len", "same_length")
    assert tuple(settings[f] for f in fields) == EVALUATION[name]


def test_a_model_size_other_than_the_tokenizers_names_the_flag_that_asked_for_it():
    # Given as --config_override n_token=100 (training.classify has no --n_token),
    # the message said "drop --n_token".
    from training.errors import TrainingError
    from training.model_config import build_config, parse_overrides
    for n_token, overrides, flag in ((100, None, "--n_token"),
                                     (None, ["n_token=100"], "--config_override n_token")):
        with pytest.raises(TrainingError, match=rf"^vocabulary/model size mismatch: the corpus "
                                                rf"tokenizer has 256 tokens but the model is "
                                                rf"asked for n_token=100; drop {flag} to size "
                                                rf"the model from the tokenizer$"):
            build_config("tiny", 256, n_token, parse_overrides(overrides))
    with pytest.raises(TrainingError, match=r"^--config_override n_token must be an integer, "
                                            r"got '256'$"):
        build_config("tiny", 256, overrides={"n_token": "256"})
    with pytest.raises(TrainingError, match=r"^--config_override 'dropout' is not field=value$"):
        parse_overrides(["dropout"])
    with pytest.raises(TrainingError, match=r"^invalid model configuration for preset 'tiny': "
                                            r"dropout must be a number, got 'abc'$"):
        build_config("tiny", 256, overrides=parse_overrides(["dropout=abc"]))
    assert build_config("tiny", 256, overrides={"n_token": 256}).n_token == 256


def test_a_previous_runs_config_is_read_or_named(tmp_path):
    from training.errors import TrainingError
    from training.model_config import check_resumable
    from txl_tf import TransformerXLConfig
    path = str(tmp_path / "config.json")
    config = TransformerXLConfig.preset("tiny")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(TrainingError, match=rf"^cannot read {path}: "):
        check_resumable(config, path)
    config.to_json(path)  # a run from before fingerprints were recorded
    check_resumable(config.replace(vocab_fingerprint="0123456789abcdef"), path)
    with pytest.raises(TrainingError, match=rf"^vocabulary/model size mismatch: {path} was "
                                            r"trained with n_token=256, the corpus tokenizer "
                                            r"now has 100 tokens; use a new --model_dir$"):
        check_resumable(config.replace(n_token=100), path)
