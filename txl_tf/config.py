"""`TransformerXLConfig`: every hyper-parameter of the paper's code, validated,
with a JSON round-trip and named presets for the paper's configurations."""
from __future__ import annotations

import dataclasses
import json
import numbers
import os
import sys
from typing import Any, List, Optional

import numpy as np

from txl_tf.app.files import parse_json
from txl_tf.checks.numpy_checks import MAX_POSITIONS, is_flag
from txl_tf.errors import TxlError


SAME_LENGTH_CONVENTIONS = ("tf", "pytorch")
# The paper's PyTorch code's `attn_type`s: 0 its relative encoding, 1 Shaw et
# al.'s learnable relative encoding, 2 the absolute sinusoid of Vaswani et al.,
# 3 Al-Rfou et al.'s learned absolute embeddings at every layer.
ATTN_TYPES = {0: "relative (the paper's)", 1: "learnable relative (Shaw et al.)",
              2: "absolute sinusoid (vanilla)", 3: "learned absolute per layer (Al-Rfou et al.)"}


class ConfigError(TxlError):
    """A configuration value is missing, out of range or inconsistent."""


_FLAGS = ("tie_weight", "proj_same_dim", "untie_r", "pre_lnorm", "same_length",
          "zero_filled_memory")
_REALS = ("dropout", "dropatt", "init_std", "proj_init_std", "layer_norm_epsilon")


def _is_int(value):
    # A Python int only, not `check_count`'s numpy integers too: the config
    # keeps the values it is given, and to_json cannot write a numpy integer.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class TransformerXLConfig:
    """Hyper-parameters of a Transformer-XL language model.

    Names follow the paper's code (`kimiyoung/transformer-xl`). `d_embed`
    defaults to `d_model`. `tie_projs` is one flag per vocabulary bin (whether
    the softmax projection of that bin is the embedding's); `None` means the
    paper's `proj_share_all_but_first` setting (all bins but the first tied
    when the vocabulary is split, else tied). `clamp_len <= 0` disables
    clamping. `mem_len` is the training memory length; inference may pass a
    memory of any length. `zero_filled_memory` makes fresh memories zero states
    that are attended (how the paper's TF code starts every stream, so models
    imported from its checkpoints set it) instead of empty slots.
    `same_length_convention` says how many keys `same_length` leaves each
    query (see `txl_tf.layers.masks`): "tf" (the paper's TF code) the last
    M + 1 positions, "pytorch" (its PyTorch code) the last M, itself
    included, M being the memory length. `vocab_fingerprint` is the
    `Tokenizer.fingerprint()` of the vocabulary the model was trained with
    (None: not recorded); loading a model's vocabulary checks it.
    `attn_type` is the paper's PyTorch code's: 0 its relative encoding
    (the default), 1 Shaw et al.'s learnable relative embeddings and biases
    per layer (`max_klen` of them, default `tgt_len + mem_len`: farther
    distances share the farthest; see `txl_tf.layers.learnable_attention`),
    2 the absolute sinusoid added to the input (and to the first layer's
    memory) with standard attention: the vanilla Transformer of the paper's
    ablation (see `txl_tf.layers.absolute_attention`), 3 a learned absolute
    embedding per position (`max_klen`) added to every layer's input and
    memory, with standard attention.
    """

    n_token: int
    n_layer: int = 2
    d_model: int = 32
    n_head: int = 2
    d_head: int = 16
    d_inner: int = 64
    d_embed: Optional[int] = None
    div_val: int = 1
    cutoffs: List[int] = dataclasses.field(default_factory=list)
    tie_weight: bool = True
    tie_projs: Optional[List[bool]] = None
    proj_same_dim: bool = True
    dropout: float = 0.1
    dropatt: float = 0.0
    untie_r: bool = False
    pre_lnorm: bool = False
    tgt_len: int = 32
    mem_len: int = 32
    clamp_len: int = -1
    same_length: bool = False
    same_length_convention: str = "tf"
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_epsilon: float = 1e-12
    zero_filled_memory: bool = False
    vocab_fingerprint: Optional[str] = None
    attn_type: int = 0
    max_klen: Optional[int] = None

    def __post_init__(self):
        if self.d_embed is None:
            self.d_embed = self.d_model
        if not isinstance(self.cutoffs, (list, tuple)) or not all(
                isinstance(c, numbers.Integral) and not isinstance(c, bool) for c in self.cutoffs):
            raise ConfigError(f"cutoffs must be a list of integers, got {self.cutoffs!r}")
        self.cutoffs = [int(c) for c in self.cutoffs]
        if self.tie_projs is None:
            # proj_share_all_but_first: the head bin keeps its own projection.
            split = bool(self.cutoffs)
            self.tie_projs = [not split or i > 0 for i in range(len(self.cutoffs) + 1)]
        if not isinstance(self.tie_projs, (list, tuple)) or not all(
                is_flag(t) for t in self.tie_projs):
            raise ConfigError(f"tie_projs must be a list of booleans, got {self.tie_projs!r}")
        self.tie_projs = [bool(t) for t in self.tie_projs]
        for name in _FLAGS:  # a string ("false", "no") would be truthy
            if not is_flag(getattr(self, name)):
                raise ConfigError(f"{name} must be a boolean, got {getattr(self, name)!r}")
            setattr(self, name, bool(getattr(self, name)))
        self.validate()
        for name in _REALS:  # plain floats: to_json cannot write numpy's or a Fraction
            setattr(self, name, float(getattr(self, name)))

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raises `ConfigError` naming the first inconsistent field."""
        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")

        for name in ("n_token", "n_layer", "d_model", "n_head", "d_head",
                     "d_inner", "d_embed", "div_val", "tgt_len"):
            positive(name)
        if not _is_int(self.mem_len) or self.mem_len < 0:
            raise ConfigError(f"mem_len must be an integer >= 0, got {self.mem_len!r}")
        if self.tgt_len + self.mem_len > MAX_POSITIONS:  # a graph's shapes wrapped them
            raise ConfigError(
                f"tgt_len + mem_len must be at most {MAX_POSITIONS} (2**31 - 1: TensorFlow "
                f"counts a segment's keys in int32), got {self.tgt_len} + {self.mem_len}")
        if not _is_int(self.clamp_len):
            raise ConfigError(f"clamp_len must be an integer, got {self.clamp_len!r}")
        for name in _REALS:
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"{name} must be a number, got {value!r}")
        if self.d_model % 2:
            raise ConfigError(
                f"d_model must be even (sin and cos halves), got {self.d_model}")
        for name in ("dropout", "dropatt"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        for name in ("init_std", "proj_init_std", "layer_norm_epsilon"):
            # NaN, inf and an int beyond a float (math.isfinite's OverflowError) fail it
            if not 0 < getattr(self, name) <= sys.float_info.max:
                raise ConfigError(f"{name} must be a finite number > 0, got "
                                  f"{getattr(self, name)}")
        if self.vocab_fingerprint is not None and not isinstance(self.vocab_fingerprint, str):
            raise ConfigError(f"vocab_fingerprint must be a string or None, got "
                              f"{self.vocab_fingerprint!r}")
        if not _is_int(self.attn_type) or self.attn_type not in ATTN_TYPES:  # not 1.0
            known = ", ".join(f"{k} {v}" for k, v in ATTN_TYPES.items())
            raise ConfigError(
                f"attn_type must be one of {known}, got {self.attn_type!r}")
        if self.max_klen is not None and (not _is_int(self.max_klen) or self.max_klen < 1
                                          or self.max_klen > MAX_POSITIONS
                                          or self.attn_type not in (1, 3)):
            raise ConfigError(f"max_klen is for attn_type 1 and 3, an integer in [1, "
                              f"{MAX_POSITIONS}]; got "
                              f"{self.max_klen!r} with attn_type {self.attn_type}")
        if self.attn_type == 3 and self.n_head * self.d_head != self.d_model:
            raise ConfigError(f"attn_type 3 adds [n_head * d_head] embeddings to d_model "
                              f"states: n_head * d_head = {self.n_head * self.d_head} must be "
                              f"d_model = {self.d_model}")
        if self.same_length_convention not in SAME_LENGTH_CONVENTIONS:
            raise ConfigError(
                f"same_length_convention must be one of {list(SAME_LENGTH_CONVENTIONS)}, "
                f"got {self.same_length_convention!r}")
        previous = 0
        for c in self.cutoffs:
            if not previous < c < self.n_token:
                raise ConfigError(
                    f"cutoffs must be strictly increasing and inside (0, n_token="
                    f"{self.n_token}), got {self.cutoffs}")
            previous = c
        if self.div_val > 1 and not self.cutoffs:
            raise ConfigError("div_val > 1 needs cutoffs (a vocabulary split)")
        smallest = self.d_embed // self.div_val ** len(self.cutoffs)
        if smallest < 1:
            raise ConfigError(
                f"d_embed={self.d_embed} // div_val={self.div_val}**{len(self.cutoffs)} "
                "leaves a bin with no embedding dimension")
        if len(self.tie_projs) != len(self.cutoffs) + 1:
            raise ConfigError(
                f"tie_projs needs one flag per vocabulary bin ({len(self.cutoffs) + 1}),"
                f" got {len(self.tie_projs)}")

    @property
    def learnable_positions(self) -> int:
        """attn_type 1's and 3's position embeddings per layer (`max_klen`)."""
        return self.max_klen or self.tgt_len + self.mem_len

    # ------------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        """The config as a dict.

        Returns:
            A dict of every field (`from_dict`'s input).
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TransformerXLConfig":
        """A config from a dict of its fields.

        Args:
            values: field name -> value; `n_token` required.

        Returns:
            The `TransformerXLConfig`.

        Raises:
            ConfigError: an unknown field, no `n_token`, or a bad value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config fields: {unknown}")
        if "n_token" not in values:
            raise ConfigError("the config has no n_token (the vocabulary size)")
        return cls(**values)

    def to_json(self, path: Optional[str] = None) -> str:
        """The config as JSON (keys sorted, indented).

        Args:
            path: None, or a file to write it to as well.

        Returns:
            The JSON text.
        """
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: "str | os.PathLike") -> "TransformerXLConfig":
        """A config from JSON (`to_json`'s).

        Args:
            text_or_path: JSON text (starting with `{`) or a file's path (a
                str or a `pathlib.Path`).

        Returns:
            The `TransformerXLConfig`.

        Raises:
            FileNotFoundError: no such file.
            ConfigError: not text or a path, not a JSON object of config
                fields, or a bad one.
        """
        if isinstance(text_or_path, os.PathLike):  # a Path has no lstrip
            text_or_path = os.fspath(text_or_path)
        if not isinstance(text_or_path, str):
            raise ConfigError(f"from_json takes JSON text or a file's path, got "
                              f"{type(text_or_path).__name__}")
        text, where = text_or_path, ""
        try:
            if not text_or_path.lstrip().startswith("{"):
                where = f"{text_or_path}: "
                with open(text_or_path, encoding="utf-8") as f:
                    text = f.read()
            values = parse_json(text)
        except ValueError as err:  # not JSON, or a file that is not UTF-8
            raise ConfigError(f"{where}not a JSON object of config fields ({err})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{where}not a JSON object of config fields (a "
                              f"{type(values).__name__})")
        return cls.from_dict(values)

    def replace(self, **changes: Any) -> "TransformerXLConfig":
        """A copy with some fields changed (validated). Derived defaults follow:
        `d_embed` tracks `d_model` if it was equal to it, and `tie_projs` is
        re-derived when `cutoffs` change, unless they are given too.

        Args:
            **changes: field name -> new value.

        Returns:
            The new `TransformerXLConfig`.

        Raises:
            ConfigError: an unknown field or a bad value.
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ConfigError(f"unknown config fields: {unknown}")
        if "d_model" in changes and "d_embed" not in changes and self.d_embed == self.d_model:
            changes["d_embed"] = None
        if "cutoffs" in changes and "tie_projs" not in changes:
            changes["tie_projs"] = None
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerXLConfig":
        """A named configuration (see `PRESETS`), optionally with overrides.

        Args:
            name: a key of `PRESETS`.
            **overrides: field name -> value, over the preset's.

        Returns:
            The `TransformerXLConfig`.

        Raises:
            ConfigError: an unknown preset or a bad override.
        """
        if not isinstance(name, str) or name not in PRESETS:  # a list: not a TypeError
            raise ConfigError(
                f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
        values = dict(PRESETS[name])
        values.update(overrides)
        return cls.from_dict(values)


# Training settings of the paper's scripts (kimiyoung/transformer-xl tf/scripts,
# tf/sota; training/configs/*.cfg cite each). The evaluation settings the paper
# used (all with same_length) are in EVAL_SETTINGS. The enwik8/text8 scripts
# keep one shared r_w_bias/r_r_bias pair (untie_r False).
_ENWIK8_BASE = dict(n_token=204, n_layer=12, d_model=512, n_head=8, d_head=64,
                    d_inner=2048, dropout=0.1, dropatt=0.0, tgt_len=512,
                    mem_len=512)
_ENWIK8_LARGE = dict(n_token=204, n_layer=24, d_model=1024, n_head=8, d_head=128,
                     d_inner=3072, dropout=0.15, dropatt=0.15, tgt_len=768,
                     mem_len=768)

PRESETS = {
    "tiny": dict(n_token=256, n_layer=2, d_model=32, n_head=2, d_head=16,
                 d_inner=64, dropout=0.0, tgt_len=16, mem_len=16),
    "small": dict(n_token=256, n_layer=4, d_model=128, n_head=4, d_head=32,
                  d_inner=512, dropout=0.1, tgt_len=64, mem_len=64),
    "enwik8_base": _ENWIK8_BASE,
    "enwik8_large": _ENWIK8_LARGE,
    "text8": dict(_ENWIK8_LARGE, n_token=27),
    "wt103_base": dict(n_token=267735, n_layer=16, d_model=410, n_head=10,
                       d_head=41, d_inner=2100, dropout=0.1, dropatt=0.0,
                       div_val=1, cutoffs=[20000, 40000, 200000],
                       tgt_len=150, mem_len=150),
    "wt103_large": dict(n_token=267735, n_layer=18, d_model=1024, n_head=16,
                        d_head=64, d_inner=4096, dropout=0.2, dropatt=0.2,
                        div_val=4, cutoffs=[20000, 40000, 200000], untie_r=True,
                        init_std=0.005, tgt_len=384, mem_len=384),
    "lm1b_base": dict(n_token=793471, n_layer=18, d_model=1024, n_head=8,
                      d_head=128, d_inner=4096, dropout=0.1, dropatt=0.0,
                      div_val=4, cutoffs=[60000, 100000, 640000], untie_r=True,
                      tie_projs=[False] * 4, proj_same_dim=False,
                      tgt_len=256, mem_len=256),
    "lm1b_large": dict(n_token=793471, n_layer=24, d_model=1280, n_head=16,
                       d_head=80, d_inner=8192, dropout=0.05, dropatt=0.05,
                       div_val=4, cutoffs=[60000, 100000, 640000], untie_r=True,
                       tie_projs=[False] * 4, proj_same_dim=False, init_std=0.005,
                       tgt_len=32, mem_len=32),
}

# The paper's evaluation settings: tgt_len, mem_len, clamp_len, same_length.
EVAL_SETTINGS = {
    "enwik8_base": dict(tgt_len=80, mem_len=2100, clamp_len=820, same_length=True),
    "enwik8_large": dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True),
    "text8": dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True),
    "wt103_base": dict(tgt_len=64, mem_len=640, clamp_len=400, same_length=True),
    "wt103_large": dict(tgt_len=128, mem_len=1600, clamp_len=1000, same_length=True),
    "lm1b_base": dict(tgt_len=32, mem_len=128, clamp_len=-1, same_length=True),
    "lm1b_large": dict(tgt_len=32, mem_len=128, clamp_len=-1, same_length=True),
}


def as_config(config: Any) -> TransformerXLConfig:
    """A config from a `TransformerXLConfig` or a dict of its fields.

    Args:
        config: a `TransformerXLConfig`, or a dict (`TransformerXLConfig.from_dict`).

    Returns:
        The `TransformerXLConfig`; `ConfigError` for anything else (a preset
        name says to pass `TransformerXLConfig.preset(name)`).
    """
    if isinstance(config, TransformerXLConfig):
        return config
    if isinstance(config, dict):
        return TransformerXLConfig.from_dict(config)
    hint = ""
    if isinstance(config, str):
        hint = (f": for the preset pass TransformerXLConfig.preset({config!r})"
                if config in PRESETS else
                f": a preset goes through TransformerXLConfig.preset(name), one of "
                f"{sorted(PRESETS)}")
    shown = repr(config)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ConfigError(f"config must be a TransformerXLConfig or a dict of its fields, got "
                      f"{type(config).__name__} {shown}{hint}")


def eval_settings(preset: str) -> dict:
    """The paper's evaluation settings for a preset (empty for tiny/small)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known presets: {sorted(PRESETS)}")
    return dict(EVAL_SETTINGS.get(preset, {}))
