"""PyTorch Transformer-XL weights → a `TransformerXL`.

Two namings are read: the paper's PyTorch code (`kimiyoung/transformer-xl`,
`pytorch/mem_transformer.py`: `layers.{i}.dec_attn.qkv_net.weight`, or
`q_net` and `kv_net` for its `attn_type=2` and 3, `r_emb` and `r_bias` for
1, `r_emb` alone for 3,
`word_emb.emb_layers.{i}.weight`, `crit.out_layers.{i}.weight`, `r_w_bias`,
...) and the `transfo-xl-wt103` port, which prefixes the backbone with
`transformer.` and keeps untied r-biases in each layer's attention. PyTorch
`Linear` weights are `[out, in]`, kernels here are `[in, out]`.

The config is inferred from the tensors' shapes, or a given config is checked
against them (every mismatch names the tensor and both shapes). Missing
tensors are an error; tensors nothing reads are an error too unless
`strict=False`, and either way they are listed by name.
"""
import dataclasses
import functools
import numbers
import re
from collections import OrderedDict
from typing import List, Optional, Tuple

import numpy as np

from txl_tf.config import TransformerXLConfig
from txl_tf.weights.state_dict import StateDict, StateDictError, from_arrays, read_state_dict

PAPER, PORT = "paper", "port"
CLUSTER_ORDERS = ("tf", "pytorch")

# What the weights' own code did with them, by origin (see `_semantics`).
_PAPER_EPSILON = 1e-5


class PytorchImportError(StateDictError):
    """Weights that do not fit the (given or inferred) configuration."""


@dataclasses.dataclass
class ImportReport:
    """What `read_pytorch` found and decided; `lines()` for printing."""

    path: str
    origin: str
    cluster_order: str
    inferred: dict
    semantics: dict
    read: int = 0
    duplicates: List[str] = dataclasses.field(default_factory=list)
    unused: List[str] = dataclasses.field(default_factory=list)

    def lines(self):
        naming = ("the transfo-xl-wt103 port's (`transformer.` prefix)" if self.origin == PORT
                  else "the paper's PyTorch code's")
        out = [f"read {self.read} tensors from {self.path} in {naming} naming",
               "model: " + ", ".join(f"{k}={v}" for k, v in self.inferred.items()),
               "semantics: " + ", ".join(f"{k}={v}" for k, v in self.semantics.items())
               + f", cluster_order={self.cluster_order}"]
        if self.duplicates:
            out.append(f"tied copies checked and skipped: {', '.join(self.duplicates)}")
        if self.unused:
            out.append(f"UNUSED tensors: {', '.join(self.unused)}")
        return out


@dataclasses.dataclass
class PytorchWeights:
    """`config`, `arrays` keyed by the TF names of `txl_tf.weights.checkpoints`, `report`."""

    config: TransformerXLConfig
    arrays: "OrderedDict[str, np.ndarray]"
    report: ImportReport


# ------------------------------------------------------------------ naming
def _canonical(state):
    """`(origin, {paper-code name: name in the file})`. A DataParallel
    `module.` prefix is dropped; `transformer.` marks the port."""
    names = {}
    for name in state:
        short = name[len("module."):] if name.startswith("module.") else name
        names[short] = name
    origin = PORT if any(k.startswith("transformer.") for k in names) else PAPER
    if origin == PORT:
        names = {k[len("transformer."):] if k.startswith("transformer.") else k: v
                 for k, v in names.items()}
    return origin, names


# --------------------------------------------------------------- inference
def _layer_count(names):
    found = {int(m.group(1)) for k in names for m in [re.match(r"layers\.(\d+)\.", k)] if m}
    return max(found) + 1 if found else 0


def _indexed(names, prefix):
    return sorted(int(m.group(1)) for k in names
                  for m in [re.fullmatch(re.escape(prefix) + r"\.(\d+)(\.weight)?", k)] if m)


def infer_config(state, names, given=None):
    """Config fields read from tensor shapes (`names`: see `_canonical`).

    `given` (read_pytorch's overrides) fills the fields the shapes leave
    open: `n_head` and/or `d_head` of attn_type 2, the `cutoffs` of a
    one-table vocabulary split. Raises `PytorchImportError` where a needed
    tensor is absent or an open field is not given, naming the keywords to
    pass."""
    given = given or {}

    def shape(name, rank=2):
        if name not in names:
            raise PytorchImportError(f"cannot infer the config: no tensor "
                                     f"{_file_name(names, name)!r} in {state.path}")
        found = tuple(state.shape(names[name]))
        if len(found) != rank:
            raise PytorchImportError(f"cannot infer the config: {names[name]} has shape "
                                     f"{found}, where a {rank}-D tensor belongs")
        return found

    values = {"n_layer": _layer_count(names)}
    if values["n_layer"] == 0:
        raise PytorchImportError(f"{state.path}: no `layers.N.` tensors; is this a "
                                 "Transformer-XL state dict?")
    values["attn_type"] = attn_type_of(state, names)
    if values["attn_type"] == 3:  # r_emb [n_layer, max_klen, n_head, d_head]
        values["d_model"] = shape("layers.0.dec_attn.q_net.weight")[1]
        values["max_klen"], values["n_head"], values["d_head"] = shape("r_emb", 4)[1:]
    elif values["attn_type"] == 2:  # q_net [n_head * d_head, d_model]
        heads, values["d_model"] = shape("layers.0.dec_attn.q_net.weight")
        values["n_head"], values["d_head"] = _heads(heads, given, state.path)
    else:
        values["d_model"] = shape("layers.0.dec_attn.qkv_net.weight")[1]
        bias = "r_w_bias" if "r_w_bias" in names else "layers.0.dec_attn.r_w_bias"
        rank = 3 if values["attn_type"] == 1 and bias == "r_w_bias" else 2  # type 1: per layer
        values["n_head"], values["d_head"] = shape(bias, rank)[-2:]
    if values["attn_type"] == 1:
        values["max_klen"] = shape("r_emb", 4)[1]
    values["d_inner"] = shape("layers.0.pos_ff.CoreNet.0.weight")[0]
    tables = [shape(f"word_emb.emb_layers.{i}.weight")
              for i in _indexed(names, "word_emb.emb_layers")]
    if not tables:
        shape("word_emb.emb_layers.0.weight")
    values["n_token"] = sum(t[0] for t in tables)
    values["d_embed"] = tables[0][1]
    n_clusters = shape("crit.cluster_weight")[0] if "crit.cluster_weight" in names else 0
    if len(tables) == 1:
        values["div_val"] = 1
        values["cutoffs"] = list(given.get("cutoffs", []))
        if n_clusters and not values["cutoffs"]:
            raise PytorchImportError(
                f"cutoffs cannot be read from these weights (one embedding table, {n_clusters} "
                f"tail clusters): pass cutoffs=[...] ({n_clusters} values) or a config")
    else:
        values["div_val"] = tables[0][1] // tables[1][1] if tables[1][1] else 0
        values["cutoffs"] = list(np.cumsum([t[0] for t in tables[:-1]]).tolist())
        if n_clusters != len(tables) - 1:
            raise PytorchImportError(
                f"{len(tables)} embedding tables need {len(tables) - 1} cluster rows; "
                f"crit.cluster_weight has {n_clusters}")
    per_layer = "layers.0.dec_attn.r_w_bias" in names
    values["untie_r"] = values["attn_type"] == 0 and per_layer and (
        "r_w_bias" not in names or not all(
            np.array_equal(state[names[f"layers.{i}.dec_attn.{b}"]], state[names[b]])
            for i in range(values["n_layer"]) for b in ("r_w_bias", "r_r_bias")
            if f"layers.{i}.dec_attn.{b}" in names))
    n_bins = len(values["cutoffs"]) + 1
    values["tie_weight"] = all(
        _same(state, names, f"crit.out_layers.{i}.weight", f"word_emb.emb_layers.{i}.weight")
        for i in range(n_bins if values["div_val"] > 1 else 1))
    emb_proj = (lambda i: f"word_emb.emb_projs.{i if values['div_val'] > 1 else 0}")
    values["tie_projs"] = [_same(state, names, f"crit.out_projs.{i}", emb_proj(i))
                           for i in range(n_bins)]
    return values


def _heads(heads, given, path):
    """`(n_head, d_head)` of attn_type 2 weights, whose projections are
    `heads = n_head * d_head` wide: one or both given."""
    n_head, d_head = given.get("n_head"), given.get("d_head")
    if n_head is None and d_head is None:
        raise PytorchImportError(
            f"{path} holds attn_type 2 weights (standard attention), whose shapes tell "
            f"n_head * d_head = {heads} but not n_head from d_head: pass n_head=... and/or "
            "d_head=... or a config")
    for name in ("n_head", "d_head"):
        value = given.get(name)
        whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if value is not None and (not whole or value < 1):
            raise PytorchImportError(f"{name}={value!r}: a head count or size is an integer "
                                     ">= 1")
    if n_head is None:
        n_head = heads // d_head if d_head >= 1 else 0
    if d_head is None:
        d_head = heads // n_head if n_head >= 1 else 0
    if n_head * d_head != heads:
        passed = " and ".join(f"{k}={given[k]}" for k in ("n_head", "d_head") if k in given)
        raise PytorchImportError(f"{passed} does not fit {path}: its attention projections "
                                 f"are n_head * d_head = {heads} wide")
    return n_head, d_head


_TOLD_BY = {0: "a fused qkv_net, no r_emb", 1: "r_emb and r_bias", 2: "q_net and kv_net, no r_emb",
            3: "r_emb without r_bias"}


def attn_type_of(state, names):
    """The paper's code's `attn_type` of a state dict, told by its tensors:
    `r_emb` (learnable relative, 1, or absolute per layer, 3), a fused
    `qkv_net` (relative, 0) or `q_net` and `kv_net` (absolute sinusoid, 2)."""
    if "r_emb" in names:
        return 1 if "r_bias" in names else 3
    return 2 if "layers.0.dec_attn.q_net.weight" in names else 0


def _same(state, names, copy, original):
    """True when `copy` is absent (a tied weight saved once) or equals
    `original` (a tied weight saved under both names)."""
    if copy not in names:
        return True
    if original not in names:
        return False
    a, b = state[names[copy]], state[names[original]]
    return a.shape == b.shape and np.array_equal(a, b)


# -------------------------------------------------------------------- plan
@dataclasses.dataclass
class _Entry:
    name: str                 # paper-code name
    shape: Tuple[int, ...]    # expected [out, in] shape
    target: Optional[str]     # TF name (None: a tied copy, checked only)
    how: str = "copy"         # copy | T | layer_r | split | cluster | tied:<name> | inv_freq


def _plan(cfg, per_layer_r):
    """Every tensor the config needs, with its expected shape and target."""
    emb, soft = "transformer/adaptive_embed", "transformer/adaptive_softmax"
    ends = [0, *cfg.cutoffs, cfg.n_token]
    bins = list(zip(ends[:-1], ends[1:]))
    dims = [cfg.d_embed // cfg.div_val ** i for i in range(len(bins))]
    plan = []
    if cfg.div_val == 1:
        plan.append(_Entry("word_emb.emb_layers.0.weight", (cfg.n_token, cfg.d_embed),
                           f"{emb}/lookup_table"))
        if cfg.d_embed != cfg.d_model:
            plan.append(_Entry("word_emb.emb_projs.0", (cfg.d_model, cfg.d_embed),
                               f"{emb}/proj_W", "T"))
    else:
        for i, ((low, high), dim) in enumerate(zip(bins, dims)):
            plan.append(_Entry(f"word_emb.emb_layers.{i}.weight", (high - low, dim),
                               f"{emb}/cutoff_{i}/lookup_table"))
            plan.append(_Entry(f"word_emb.emb_projs.{i}", (cfg.d_model, dim),
                               f"{emb}/cutoff_{i}/proj_W", "T"))
    heads = cfg.n_head * cfg.d_head
    if cfg.attn_type == 1:
        klen = cfg.learnable_positions
        plan += [_Entry("r_emb", (cfg.n_layer, klen, cfg.n_head, cfg.d_head),
                        "transformer/r_emb"),
                 _Entry("r_w_bias", (cfg.n_layer, cfg.n_head, cfg.d_head), "transformer/r_w_bias"),
                 _Entry("r_bias", (cfg.n_layer, klen, cfg.n_head), "transformer/r_bias")]
    if cfg.attn_type == 3:
        plan.append(_Entry("r_emb", (cfg.n_layer, cfg.learnable_positions, cfg.n_head,
                                     cfg.d_head), "transformer/r_emb", "heads_flat"))
    for b in ("r_w_bias", "r_r_bias") if cfg.attn_type == 0 else ():
        # Untied: one pair per layer (the port keeps them in each attention).
        # Shared: one top-level pair, which the port also lists per layer.
        if not cfg.untie_r:
            plan.append(_Entry(b, (cfg.n_head, cfg.d_head), f"transformer/{b}"))
        if cfg.untie_r or per_layer_r:
            plan += [_Entry(f"layers.{i}.dec_attn.{b}", (cfg.n_head, cfg.d_head),
                            f"transformer/{b}", "layer_r" if cfg.untie_r else f"tied:{b}")
                     for i in range(cfg.n_layer)]
    for i in range(cfg.n_layer):
        p, t = f"layers.{i}", f"transformer/layer_{i}"
        if cfg.attn_type in (0, 1):
            plan.append(_Entry(f"{p}.dec_attn.qkv_net.weight", (3 * heads, cfg.d_model),
                               f"{t}/rel_attn/qkv/kernel", "T"))
        if cfg.attn_type == 0:
            plan.append(_Entry(f"{p}.dec_attn.r_net.weight", (heads, cfg.d_model),
                               f"{t}/rel_attn/r/kernel", "T"))
        if cfg.attn_type in (2, 3):  # the query's, then the keys' and values' kernels: one qkv
            plan += [
                _Entry(f"{p}.dec_attn.q_net.weight", (heads, cfg.d_model),
                       f"{t}/rel_attn/qkv/kernel", "qkv"),
                _Entry(f"{p}.dec_attn.kv_net.weight", (2 * heads, cfg.d_model),
                       f"{t}/rel_attn/qkv/kernel", "qkv")]
        plan += [
            _Entry(f"{p}.dec_attn.o_net.weight", (cfg.d_model, heads), f"{t}/rel_attn/o/kernel",
                   "T"),
            _Entry(f"{p}.dec_attn.layer_norm.weight", (cfg.d_model,),
                   f"{t}/rel_attn/LayerNorm/gamma"),
            _Entry(f"{p}.dec_attn.layer_norm.bias", (cfg.d_model,),
                   f"{t}/rel_attn/LayerNorm/beta"),
            _Entry(f"{p}.pos_ff.CoreNet.0.weight", (cfg.d_inner, cfg.d_model),
                   f"{t}/ff/layer_1/kernel", "T"),
            _Entry(f"{p}.pos_ff.CoreNet.0.bias", (cfg.d_inner,), f"{t}/ff/layer_1/bias"),
            _Entry(f"{p}.pos_ff.CoreNet.3.weight", (cfg.d_model, cfg.d_inner),
                   f"{t}/ff/layer_2/kernel", "T"),
            _Entry(f"{p}.pos_ff.CoreNet.3.bias", (cfg.d_model,), f"{t}/ff/layer_2/bias"),
            _Entry(f"{p}.pos_ff.layer_norm.weight", (cfg.d_model,), f"{t}/ff/LayerNorm/gamma"),
            _Entry(f"{p}.pos_ff.layer_norm.bias", (cfg.d_model,), f"{t}/ff/LayerNorm/beta"),
        ]
    # Output layer: one Linear over the whole vocabulary when div_val == 1
    # (its bias split at the cutoffs here), one per bin otherwise.
    one_table = cfg.div_val == 1
    for i, ((low, high), dim) in enumerate(zip(bins, dims)):
        layer = f"crit.out_layers.{0 if one_table else i}"
        if i == 0 or not one_table:
            rows, cols = (cfg.n_token, cfg.d_embed) if one_table else (high - low, dim)
            if cfg.tie_weight:
                plan.append(_Entry(f"{layer}.weight", (rows, cols), None,
                                   f"tied:word_emb.emb_layers.{0 if one_table else i}.weight"))
            else:
                plan.append(_Entry(f"{layer}.weight", (rows, cols),
                                   f"{soft}/weight" if one_table else f"{soft}/cutoff_{i}/weight"))
            if not cfg.cutoffs:
                plan.append(_Entry(f"{layer}.bias", (rows,), f"{soft}/bias"))
            elif one_table:
                plan.append(_Entry(f"{layer}.bias", (rows,), f"{soft}/cutoff_", "split"))
            else:
                plan.append(_Entry(f"{layer}.bias", (rows,), f"{soft}/cutoff_{i}/b"))
        has_proj = dim != cfg.d_model or not one_table  # as the PyTorch code builds them
        if has_proj:
            emb_proj = f"word_emb.emb_projs.{0 if one_table else i}"
            if cfg.tie_projs[i]:
                plan.append(_Entry(f"crit.out_projs.{i}", (cfg.d_model, dim), None,
                                   f"tied:{emb_proj}"))
            else:
                plan.append(_Entry(f"crit.out_projs.{i}", (cfg.d_model, dim),
                                   f"{soft}/cutoff_{i}/proj", "T"))
    if cfg.cutoffs:
        n = len(cfg.cutoffs)
        plan.append(_Entry("crit.cluster_weight", (n, cfg.d_embed),
                           f"{soft}/cutoff_0/cluster_W", "cluster"))
        plan.append(_Entry("crit.cluster_bias", (n,), f"{soft}/cutoff_0/cluster_b", "cluster"))
    plan.append(_Entry("pos_emb.inv_freq", (cfg.d_model // 2,), None, "inv_freq"))
    return plan


# --------------------------------------------------------------- semantics
def _semantics(origin):
    """Config values that follow from the code the weights were used with.

    * LayerNorm epsilon: `nn.LayerNorm`'s default 1e-5 in the paper's PyTorch
      code and the port's config (the TF code uses 1e-12).
    * `same_length`: both build the mask from the configured `mem_len`
      (`tril(ones, -(qlen - (klen - mem_len)))`), so a query sees the last
      mem_len positions: the "pytorch" convention of `txl_tf.layers.masks`.
    * Memory start: the paper's PyTorch code starts from empty memories that
      grow (`init_mems` gives size-0 tensors): our empty slots. The port's
      `init_mems` gives `mem_len` zero states that are attended, as the TF
      code whose checkpoints it was converted from did: `zero_filled_memory`.
    """
    return {"layer_norm_epsilon": _PAPER_EPSILON, "same_length_convention": "pytorch",
            "zero_filled_memory": origin == PORT}


def _default_cluster_order(origin):
    # Tail cluster i's log-probability is a column of the head. The paper's
    # PyTorch code reads column -i (mem_transformer's ProjectedAdaptiveLog-
    # Softmax: `head_logprob_i[:, -i]`), so weights trained with it hold the
    # cluster rows last-bin-first. The port reads `shortlist + i - 1` (its
    # `cluster_prob_idx`), like the TF code its weights were converted from,
    # and like `txl_tf.layers.adaptive_softmax`, so its rows are kept as is.
    return "tf" if origin == PORT else "pytorch"


# -------------------------------------------------------------------- read
def read_pytorch(source, config=None, *, cluster_order=None, strict=True, **overrides):
    """`PytorchWeights` of a state dict: a path (`.safetensors`, or `.bin` /
    `.pt` with PyTorch installed) or a mapping of arrays.

    `config` (a `TransformerXLConfig` or dict) is checked against the tensors;
    without one it is inferred (fields the weights cannot tell, such as
    `pre_lnorm` or the evaluation lengths, keep their defaults; the sizes
    they cannot tell are taken from `overrides`: `n_head=` and `d_head=` of
    attn_type 2, `cutoffs=` of a one-table vocabulary split). The origin's
    semantics (`_semantics`) are applied on top, then `overrides`.
    `cluster_order` ("tf" or "pytorch") overrides the origin's rule for
    weights of unknown provenance.
    """
    state = source if isinstance(source, StateDict) else (
        read_state_dict(source) if not hasattr(source, "items") else from_arrays(source))
    origin, names = _canonical(state)
    order = cluster_order or _default_cluster_order(origin)
    if order not in CLUSTER_ORDERS:
        raise PytorchImportError(f"cluster_order must be one of {CLUSTER_ORDERS}, got {order!r}")
    if config is None:
        inferred = infer_config(state, names, overrides)
        base = TransformerXLConfig(**inferred)
    else:
        base = config if isinstance(config, TransformerXLConfig) else \
            TransformerXLConfig.from_dict(dict(config))
        inferred = {k: getattr(base, k) for k in (
            "n_layer", "d_model", "n_head", "d_head", "d_inner", "n_token", "d_embed",
            "div_val", "cutoffs", "untie_r", "tie_weight", "tie_projs", "attn_type",
            "max_klen")}
        found = attn_type_of(state, names)
        if found != base.attn_type:
            raise PytorchImportError(f"{state.path} holds attn_type {found} weights "
                                     f"({_TOLD_BY[found]}); the config has attn_type "
                                     f"{base.attn_type}")
    semantics = _semantics(origin)
    # An override the shapes were read with (`cutoffs=` of one table) is in
    # `base` already; given again, `replace` would re-derive `tie_projs`.
    changes = {k: v for k, v in {**semantics, **overrides}.items()
               if config is not None or k not in inferred
               or (list(v) if isinstance(v, tuple) else v) != inferred[k]}
    cfg = base.replace(**changes)
    semantics = {k: getattr(cfg, k) for k in semantics}
    per_layer_r = "layers.0.dec_attn.r_w_bias" in names
    plan = _plan(cfg, per_layer_r and not cfg.untie_r)
    report = ImportReport(state.path, origin, order, inferred, semantics)
    arrays = _assemble(state, names, cfg, plan, order, report)
    used = {e.name for e in plan}
    report.unused = sorted(names[k] for k in names if k not in used)
    if report.unused and strict:
        raise PytorchImportError(
            f"{len(report.unused)} tensors of {state.path} fit nothing in this model: "
            f"{', '.join(report.unused[:20])}{' ...' if len(report.unused) > 20 else ''} "
            "(check the config; strict=False ignores them)")
    return PytorchWeights(cfg, arrays, report)


def _file_name(names, name):
    """`name` (paper-code naming) as the file spells it, absent or not: with
    the prefixes (`module.`, the port's `transformer.`) of its neighbours,
    the output layer's or the backbone's."""
    if name in names:
        return names[name]
    output = name.startswith("crit.")
    for short, full in names.items():
        if short.startswith("crit.") == output:
            return full[:len(full) - len(short)] + name
    return name


def _assemble(state, names, cfg, plan, order, report):
    file_name = functools.partial(_file_name, names)
    mismatched = [f"{file_name(e.name)}: the weights have {tuple(state.shape(names[e.name]))}, "
                  f"the config needs {e.shape}"
                  for e in plan if e.name in names and tuple(state.shape(names[e.name])) != e.shape]
    if mismatched:
        raise PytorchImportError("weights do not fit the config: " + "; ".join(mismatched))
    optional = ("tied:", "inv_freq")
    missing = [file_name(e.name) for e in plan
               if e.name not in names and not e.how.startswith(optional)]
    if missing:
        raise PytorchImportError(
            f"{state.path} lacks {len(missing)} tensors the config needs: "
            f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
    arrays, layer_r = OrderedDict(), {}
    for e in plan:
        if e.name not in names:
            continue
        value = np.asarray(state[names[e.name]])
        if value.dtype.kind != "f" and value.dtype.name != "bfloat16":  # ml_dtypes' is kind V
            raise PytorchImportError(f"{names[e.name]} holds {value.dtype} values, where a "
                                     "floating-point weight belongs")
        report.read += 1
        if e.how.startswith("tied:"):
            original = e.how[len("tied:"):]
            if not np.array_equal(value, state[names[original]]):
                raise PytorchImportError(
                    f"{names[e.name]} differs from {names[original]}, which the config ties "
                    "it to (tie_weight / tie_projs / untie_r)")
            report.duplicates.append(names[e.name])
        elif e.how == "inv_freq":
            expected = 1.0 / 10000 ** (np.arange(0, cfg.d_model, 2.0) / cfg.d_model)
            # A half or bfloat16 state dict holds them rounded (bfloat16: 8 significant bits).
            if not np.allclose(value.astype(np.float64), expected, rtol=2.0 ** -7, atol=0):
                raise PytorchImportError(f"{names[e.name]} is not the sinusoid's frequencies "
                                         f"for d_model={cfg.d_model}")
            report.duplicates.append(names[e.name])
        elif e.how == "T":
            arrays[e.target] = value.T
        elif e.how == "qkv":  # columns [q | k | v], in the plan's order
            arrays[e.target] = value.T if e.target not in arrays else \
                np.concatenate([arrays[e.target], value.T], 1)
        elif e.how == "heads_flat":  # [..., n_head, d_head] -> [..., d_model]
            arrays[e.target] = value.reshape(value.shape[:-2] + (-1,))
        elif e.how == "layer_r":
            layer_r.setdefault(e.target, []).append(value)
        elif e.how == "split":
            ends = [0, *cfg.cutoffs, cfg.n_token]
            for i in range(len(ends) - 1):
                arrays[f"{e.target}{i}/b"] = value[ends[i]:ends[i + 1]]
        elif e.how == "cluster" and order == "pytorch":
            arrays[e.target] = value[::-1]
        else:
            arrays[e.target] = value
    for target, values in layer_r.items():
        arrays[target] = np.stack(values)
    return arrays


def import_pytorch(source, config=None, *, cluster_order=None, strict=True, **overrides):
    """A `TransformerXL` holding PyTorch Transformer-XL weights (`read_pytorch`
    reads them).

    Args:
        source: a path (`.safetensors`, or `.bin` / `.pt` with PyTorch
            installed) or a mapping of arrays.
        config: None (inferred from the tensors), or a `TransformerXLConfig`
            or dict, checked against them.
        cluster_order: None (the origin's rule), `"tf"` or `"pytorch"`:
            the vocabulary clusters' order for weights of unknown provenance.
        strict: tensors nothing reads are an error (False: listed only).
        **overrides: config fields applied last (and the sizes the weights
            cannot tell: see `read_pytorch`).

    Returns:
        The `TransformerXL`; the import report is at `core.import_report`.

    Raises:
        PytorchImportError: a tensor that does not fit, naming it.
    """
    from txl_tf.weights.checkpoints import set_weights
    from txl_tf.core import TransformerXL
    from txl_tf.layers.init import skip_random_init

    weights = read_pytorch(source, config, cluster_order=cluster_order, strict=strict,
                           **overrides)
    with skip_random_init():  # every weight is assigned next
        core = TransformerXL(weights.config)
    set_weights(core, weights.arrays)
    core.import_report = weights.report
    return core
