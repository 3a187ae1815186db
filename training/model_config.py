"""The model configuration of a job: preset + overrides + the corpus's vocabulary."""
import json
import os

from txl_tf import PRESETS, ConfigError, TransformerXLConfig
from training.errors import TrainingError
from training.inputs import convert


def parse_overrides(items):
    """`["untie_r=false", "tie_projs=[false,true]"]` -> dict (JSON values, else text)."""
    overrides = {}
    for item in items or ():
        if "=" not in item:
            raise TrainingError(f"--config_override {item!r} is not field=value")
        key, value = (s.strip() for s in item.split("=", 1))
        try:
            boolean = value.lower() in ("true", "false")
            overrides[key] = json.loads(value.lower() if boolean else value)
        except json.JSONDecodeError:
            overrides[key] = convert(value)
    return overrides


def build_config(preset, vocab_size, n_token=None, overrides=None, log=print):
    """`TransformerXLConfig.preset(preset, **overrides)` whose `n_token` is the
    tokenizer's `vocab_size`.

    Without `n_token` the vocabulary size is taken from the tokenizer (and a
    line says so when the preset had another); an explicit `n_token` that
    differs from the tokenizer's is an error.
    """
    if preset not in PRESETS:
        raise TrainingError(f"unknown preset {preset!r}; "
                            f"known presets: {', '.join(sorted(PRESETS))}")
    overrides = dict(overrides or {})
    flag = "--n_token"
    if "n_token" in overrides:
        n_token, flag = overrides.pop("n_token"), "--config_override n_token"
        if n_token is not None and (isinstance(n_token, bool) or not isinstance(n_token, int)):
            raise TrainingError(f"--config_override n_token must be an integer, got {n_token!r}")
    if n_token is not None and int(n_token) != vocab_size:
        raise TrainingError(
            f"vocabulary/model size mismatch: the corpus tokenizer has {vocab_size} tokens "
            f"but the model is asked for n_token={n_token}; drop {flag} to size the "
            "model from the tokenizer")
    preset_n = PRESETS[preset]["n_token"]
    if n_token is None and preset_n != vocab_size:
        log(f"n_token set from the tokenizer: {vocab_size} (preset {preset!r} has {preset_n})")
    try:
        return TransformerXLConfig.preset(preset, **{**overrides, "n_token": vocab_size})
    except ConfigError as err:
        raise TrainingError(f"invalid model configuration for preset {preset!r}: {err}") from None
    except TypeError as err:
        raise TrainingError(f"invalid --config_override: {err}") from None


def check_resumable(config, path):
    """Raises if `path` (a previous run's config.json) describes another model."""
    if not os.path.exists(path):
        return
    try:
        previous = TransformerXLConfig.from_json(path)
    except (ConfigError, ValueError, OSError) as err:
        raise TrainingError(f"cannot read {path}: {err}") from None
    if previous.n_token != config.n_token:
        raise TrainingError(
            f"vocabulary/model size mismatch: {path} was trained with n_token="
            f"{previous.n_token}, the corpus tokenizer now has {config.n_token} tokens; "
            "use a new --model_dir")
    if previous.vocab_fingerprint is None:  # recorded since; the size was checked above
        previous = previous.replace(vocab_fingerprint=config.vocab_fingerprint)
    if previous.vocab_fingerprint != config.vocab_fingerprint:
        raise TrainingError(
            f"{path} was trained with another vocabulary (fingerprint "
            f"{previous.vocab_fingerprint}; the corpus tokenizer now gives "
            f"{config.vocab_fingerprint}); use a new --model_dir or the same corpus")
    differ = {k: (v, config.to_dict()[k]) for k, v in previous.to_dict().items()
              if config.to_dict()[k] != v}
    if differ:
        listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(differ.items()))
        raise TrainingError(f"--model_dir holds a run of another model ({listed}); "
                            "use a new --model_dir or the same flags")
