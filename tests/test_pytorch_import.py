"""PyTorch weights → TransformerXL, checked against a numpy model with the
PyTorch code's semantics (tests/reference_pytorch_numpy.py)."""
import builtins
import re
import sys

import numpy as np
import pytest

from tests.pytorch_fixtures import CASES, make_state, random_case, save_safetensors
from tests.reference_pytorch_numpy import PytorchReference, pytorch_mask
from txl_tf import TransformerXLConfig
from txl_tf.layers.masks import causal_visibility
from txl_tf.weights import import_pytorch
from txl_tf.weights.pytorch_import import PytorchImportError, read_pytorch
from txl_tf.weights.state_dict import StateDictError

SEG, MEM, BATCH, SEGMENTS = 4, 8, 2, 3


def _run_core(core, ids):
    memory = core.initial_memory(BATCH, MEM)
    out = []
    for s in range(SEGMENTS):
        log_probs, memory = core(ids[:, s * SEG:(s + 1) * SEG], memory)
        out.append(np.asarray(log_probs))
    return np.concatenate(out, 1)


def _run_reference(case, ids, same_length, clamp_len, cluster_rule=None):
    port = case["port"]
    ref = PytorchReference(case["state"], mem_len=MEM, same_length=same_length,
                           clamp_len=clamp_len, zero_start=port,
                           cluster_rule=cluster_rule or ("tf" if port else "pytorch"),
                           **case["hyper"])
    out = [ref.forward(ids[:, s * SEG:(s + 1) * SEG].T).transpose(1, 0, 2)
           for s in range(SEGMENTS)]
    return np.concatenate(out, 1)


def _ids(n_token, seed=0):
    return np.random.default_rng(seed).integers(0, n_token, (BATCH, SEG * SEGMENTS))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("same_length,clamp_len", [(False, -1), (True, -1), (True, 3)])
def test_matches_pytorch_reference(tmp_path, name, same_length, clamp_len):
    case = CASES[name]()
    path = save_safetensors(case["state"], tmp_path / "w.safetensors")
    core = import_pytorch(path, same_length=same_length, clamp_len=clamp_len, mem_len=MEM)
    ids = _ids(case["hyper"]["n_token"])
    got = _run_core(core, ids)
    want = _run_reference(case, ids, same_length, clamp_len)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-4)
    assert np.abs(got - want).max() <= 1e-4
    if same_length:
        # The TF rule sees one key more once the memory is full: from segment
        # 3 with a growing memory, from the start with the port's zero states.
        tf_rule = import_pytorch(path, same_length=True, clamp_len=clamp_len, mem_len=MEM,
                                 same_length_convention="tf")
        diff = np.abs(_run_core(tf_rule, ids) - want)
        full = 0 if case["port"] else 2 * SEG
        assert diff[:, :full].max(initial=0) <= 1e-4 and diff[:, full:].max() > 1e-2


def test_inferred_config_and_semantics():
    port = read_pytorch(CASES["wt103_port"]()["state"])
    cfg = port.config
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner) == (2, 32, 2, 8, 48)
    assert (cfg.n_token, cfg.cutoffs, cfg.div_val, cfg.d_embed) == (60, [20, 40], 4, 32)
    assert cfg.untie_r and cfg.tie_weight and cfg.tie_projs == [False, True, True]
    assert (cfg.layer_norm_epsilon, cfg.same_length_convention, cfg.zero_filled_memory) == \
        (1e-5, "pytorch", True)
    assert port.report.origin == "port" and port.report.cluster_order == "tf"
    assert "crit.out_projs.1" in port.report.duplicates
    paper = read_pytorch(CASES["adaptive_paper"]()["state"])
    assert paper.report.cluster_order == "pytorch" and not paper.config.zero_filled_memory
    assert (paper.config.d_embed, paper.config.tie_weight, paper.config.untie_r) == \
        (16, False, False)
    np.testing.assert_array_equal(
        paper.arrays["transformer/adaptive_softmax/cutoff_0/cluster_b"],
        CASES["adaptive_paper"]()["state"]["crit.cluster_bias"][::-1])


def test_cluster_order_override_changes_tail_bins():
    case = CASES["adaptive_paper"]()
    ids = _ids(case["hyper"]["n_token"])
    core = import_pytorch(case["state"], cluster_order="tf", mem_len=MEM)
    got = _run_core(core, ids)
    assert np.abs(got - _run_reference(case, ids, False, -1, cluster_rule="tf")).max() <= 1e-4
    assert np.abs(got - _run_reference(case, ids, False, -1)).max() > 1e-2


def test_given_config_is_checked_tensor_by_tensor():
    state = CASES["enwik8_paper"]()["state"]
    good = TransformerXLConfig(n_token=24, n_layer=2, d_model=32, n_head=2, d_head=8,
                               d_inner=48)
    assert read_pytorch(state, good).config.d_inner == 48
    with pytest.raises(PytorchImportError) as err:
        read_pytorch(state, good.replace(d_inner=64))
    message = str(err.value)
    assert "layers.0.pos_ff.CoreNet.0.weight: the weights have (48, 32), the config needs " \
           "(64, 32)" in message and "layers.1.pos_ff.CoreNet.3.weight" in message
    with pytest.raises(PytorchImportError, match=r"lacks 11 tensors.*layers\.2\.dec_attn"):
        read_pytorch(state, good.replace(n_layer=3))


def test_unknown_and_missing_tensors_are_named():
    state = dict(CASES["enwik8_paper"]()["state"])
    state["layers.0.dec_attn.extra_gate"] = np.zeros(3, np.float32)
    with pytest.raises(PytorchImportError, match="layers.0.dec_attn.extra_gate"):
        read_pytorch(state)
    assert read_pytorch(state, strict=False).report.unused == ["layers.0.dec_attn.extra_gate"]
    del state["layers.1.dec_attn.o_net.weight"]
    with pytest.raises(PytorchImportError, match=r"lacks 1 tensors.*layers\.1\.dec_attn\.o_net"):
        read_pytorch(state, strict=False)


def test_missing_tensors_are_named_as_the_file_names_them():
    # The port's and DataParallel's prefixes were left out of the names.
    state = CASES["wt103_port"]()["state"]
    state = {f"module.{k}": v for k, v in state.items()
             if k not in ("transformer.layers.1.dec_attn.o_net.weight", "crit.out_layers.2.bias")}
    names = "module.transformer.layers.1.dec_attn.o_net.weight, module.crit.out_layers.2.bias"
    with pytest.raises(PytorchImportError, match=f"lacks 2 tensors the config needs: "
                                                 f"{re.escape(names)}$"):
        read_pytorch(state)
    del state["module.transformer.layers.0.pos_ff.CoreNet.0.weight"]
    with pytest.raises(PytorchImportError, match="no tensor 'module.transformer.layers.0.pos_ff"):
        read_pytorch(state)


def test_tied_copy_that_differs_is_refused():
    state = make_state(24, 32, 2, 8, 48, 1, save_tied_copies=True)
    state["crit.out_layers.0.weight"] = state["word_emb.emb_layers.0.weight"] + 1
    assert not read_pytorch(state).config.tie_weight  # inferred: untied
    tied = TransformerXLConfig(n_token=24, n_layer=1, d_model=32, n_head=2, d_head=8, d_inner=48)
    with pytest.raises(PytorchImportError, match="crit.out_layers.0.weight differs from"):
        read_pytorch(state, tied)


def test_one_table_split_needs_cutoffs():
    state = make_state(30, 32, 2, 8, 48, 1, cutoffs=[10, 20], seed=4)
    with pytest.raises(PytorchImportError, match=r"cutoffs cannot be read .* pass "
                                                 r"cutoffs=\[\.\.\.\] \(2 values\)"):
        read_pytorch(state)
    cfg = TransformerXLConfig(n_token=30, n_layer=1, d_model=32, n_head=2, d_head=8,
                              d_inner=48, cutoffs=[10, 20])
    for arrays in read_pytorch(state, cfg).arrays, read_pytorch(state, cutoffs=[10, 20]).arrays:
        np.testing.assert_array_equal(arrays["transformer/adaptive_softmax/cutoff_1/b"],
                                      state["crit.out_layers.0.bias"][10:20])


def test_torch_pickle_without_torch_says_what_to_do(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    path.write_bytes(b"not read")
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(StateDictError, match=r"needs PyTorch.*safetensors"):
        import_pytorch(str(path))


# What torch.load(weights_only=True) raises for a pickled module: torch 2.1's
# one line, and torch 2.6's advice (one phrase in terminal bold) before the reason.
_REFUSALS = {
    "2.1": "Weights only load failed. Re-running `torch.load` with `weights_only` set to "
           "`False` will likely succeed, but it can result in arbitrary code execution.Do it "
           "only if you get the file from a trusted source. WeightsUnpickler error: "
           "Unsupported class torch.nn.modules.linear.Linear",
    "2.6": "Weights only load failed. This file can still be loaded, to do so you have two "
           "options, \x1b[1mdo those steps only if you trust the source of the checkpoint"
           "\x1b[0m. \n\t(1) In PyTorch 2.6, we changed the default value of the `weights_only` "
           "argument in `torch.load` from `False` to `True`. Re-running `torch.load` with "
           "`weights_only` set to `False` will likely succeed, but it can result in arbitrary "
           "code execution.\n\tWeightsUnpickler error: Unsupported global: GLOBAL "
           "torch.nn.modules.linear.Linear was not an allowed global by default. Please use "
           "`torch.serialization.add_safe_globals([torch.nn.modules.linear.Linear])` to "
           "allowlist this global if you trust this class/function.\n\nCheck the "
           "documentation of torch.load.",
}


@pytest.mark.parametrize("version", sorted(_REFUSALS))
def test_a_refused_torch_pickle_names_what_it_holds(tmp_path, monkeypatch, version):
    """The reason, not torch's advice to load with weights_only=False, nor its
    terminal escapes (torch 2.6 put its reason below that advice)."""
    import pickle
    import types

    def load(*args, **kwargs):
        raise pickle.UnpicklingError(_REFUSALS[version])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
    path = tmp_path / "model.pt"
    path.write_bytes(b"not read")
    with pytest.raises(StateDictError) as err:
        read_pytorch(str(path))
    message = str(err.value)
    assert re.search(r"refused it \(Unsupported (class|global: GLOBAL) "
                     r"torch\.nn\.modules\.linear\.Linear[^.]*\)\. The paper", message), message
    assert "\x1b" not in message and "weights_only` set to `False" not in message, message


# torch 2.13's other refusals: its reason on a line of its own after the
# "WeightsUnpickler error:" of a request to file an issue, and (a global of a
# blocked module: no "WeightsUnpickler error" at all) after its advice alone.
_ADVICE_213 = ("Weights only load failed. In PyTorch 2.6, we changed the default value of the "
               "`weights_only` argument in `torch.load` from `False` to `True`. Re-running "
               "`torch.load` with `weights_only` set to `False` will likely succeed, but it can "
               "result in arbitrary code execution. Do it only if you got the file from a "
               "trusted source.\n")
_DOCS_213 = ("\n\nCheck the documentation of torch.load to learn more about types accepted by "
             "default with weights_only https://pytorch.org/docs/stable/generated/torch.load.html.")


@pytest.mark.parametrize("message,reason", [
    (_ADVICE_213 + "Please file an issue with the following so that we can make "
     "`weights_only=True` compatible with your use case: WeightsUnpickler error: \n\n"
     "Unsupported operand 149" + _DOCS_213, "Unsupported operand 149"),
    (_ADVICE_213 + "\n\nTrying to load unsupported GLOBAL posix.system whose module posix is "
     "blocked." + _DOCS_213, "Trying to load unsupported GLOBAL posix.system whose module posix "
     "is blocked"),
    ("Weights only load failed. ``torch.distributed.tensor`` must be imported to load DTensors\n "
     + _ADVICE_213[len("Weights only load failed. "):] + _DOCS_213,
     "``torch.distributed.tensor`` must be imported to load DTensors"),
    ("", "UnpicklingError"),
    ("invalid load key, 'x'.", "invalid load key, 'x'."),
])
def test_every_form_of_torchs_refusal_gives_its_reason(tmp_path, monkeypatch, message, reason):
    """torch 2.13 gave "()" for an unsupported operand (its reason a line
    below "WeightsUnpickler error:") and, for a global of a blocked module
    (os.system), its own advice to load with weights_only=False."""
    import pickle
    import types

    def load(*args, **kwargs):
        raise pickle.UnpicklingError(message)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(load=load))
    path = tmp_path / "model.pt"
    path.write_bytes(b"not read")
    with pytest.raises(StateDictError) as err:
        read_pytorch(str(path))
    assert f"refused it ({reason}). The paper" in str(err.value), str(err.value)


class _TensorWithoutNumpy:
    """A tensor of torch < 2.3 beside numpy 2: `.numpy()` raises as there."""
    dtype = "torch.float32"

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        raise RuntimeError("Numpy is not available")


def test_a_torch_that_cannot_hand_tensors_to_numpy_is_named():
    """torch 2.1 and 2.2 were built for numpy 1: beside numpy 2 each tensor's
    `.numpy()` raised a bare RuntimeError out of the import."""
    with pytest.raises(StateDictError, match=r"entry 'w'.*Numpy is not available.*torch "
                                             r"older than 2\.3 needs numpy < 2"):
        read_pytorch({"w": _TensorWithoutNumpy()})


class _TensorNumpyRefuses(_TensorWithoutNumpy):
    """A tensor whose `.numpy()` raises `error`, as torch 2.13's does for a
    sparse, quantized or float8 tensor (TypeError) or a conjugate view."""

    def __init__(self, error):
        self.error = error

    def numpy(self):
        raise self.error


@pytest.mark.parametrize("error", [
    TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() first."),
    TypeError("Got unsupported ScalarType QInt8"),
    TypeError("Got unsupported ScalarType Float8_e4m3fn"),
    RuntimeError("Can't call numpy() on Tensor that has conjugate bit set. Use "
                 "tensor.resolve_conj().numpy() instead."),
])
def test_a_tensor_numpy_cannot_take_is_named_without_blaming_torchs_version(error):
    """A sparse, quantized or float8 tensor raised torch's bare TypeError out
    of the import (no entry named); a RuntimeError was blamed on torch < 2.3."""
    with pytest.raises(StateDictError) as err:
        read_pytorch({"w": _TensorNumpyRefuses(error)})
    message = str(err.value)
    assert "entry 'w'" in message and str(error) in message, message
    assert "older than 2.3" not in message, message


def test_unreadable_files(tmp_path):
    with pytest.raises(StateDictError, match="not found"):
        read_pytorch(str(tmp_path / "missing.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(StateDictError, match="cannot read .*bad.safetensors"):
        read_pytorch(str(bad))
    other = tmp_path / "weights.h5"
    other.write_bytes(b"")
    with pytest.raises(StateDictError, match="unknown weights format"):
        read_pytorch(str(other))


def test_an_in_memory_state_dict_entry_that_is_not_a_tensor_is_named():
    with pytest.raises(StateDictError, match=r"entry 'word_emb.emb_layers.0.weight' is a list"):
        import_pytorch({"word_emb.emb_layers.0.weight": [[0.0, 1.0]]})


@pytest.mark.parametrize("qlen,mlen", [(4, 0), (4, 4), (4, 8), (3, 5), (6, 2)])
def test_pytorch_same_length_mask_matches_the_paper_formula(qlen, mlen):
    # mem_len == mlen: the memory length here is the configured one there.
    visible = causal_visibility(qlen, mlen, True, "pytorch").numpy()
    if mlen:
        np.testing.assert_array_equal(visible, ~pytorch_mask(qlen, mlen, mlen, True))
    else:  # that code masks every key here (NaN); a query keeps itself
        np.testing.assert_array_equal(visible, np.eye(qlen, dtype=bool))
    np.testing.assert_array_equal(causal_visibility(qlen, mlen, False, "pytorch").numpy(),
                                  ~pytorch_mask(qlen, mlen, mlen, False))
    assert visible.sum(1).tolist() == [max(mlen, 1)] * qlen


def test_convention_round_trips_and_is_validated():
    cfg = TransformerXLConfig(n_token=10, same_length_convention="pytorch")
    assert TransformerXLConfig.from_json(cfg.to_json()).same_length_convention == "pytorch"
    assert TransformerXLConfig(n_token=10).same_length_convention == "tf"
    with pytest.raises(ValueError, match="same_length_convention must be one of"):
        TransformerXLConfig(n_token=10, same_length_convention="torch")


def _segments(core, reference, ids, seg_len, mem_len):
    memory, got, want = core.initial_memory(ids.shape[0], mem_len), [], []
    for start in range(0, ids.shape[1], seg_len):
        log_probs, memory = core(ids[:, start:start + seg_len], memory)
        got.append(np.asarray(log_probs))
        want.append(reference.forward(ids[:, start:start + seg_len].T).transpose(1, 0, 2))
    return np.concatenate(got, 1), np.concatenate(want, 1)


def _reference(case, **run):
    return PytorchReference(case["state"], mem_len=run["mem_len"],
                            same_length=run["same_length"], clamp_len=run["clamp_len"],
                            pre_lnorm=run["pre_lnorm"], zero_start=case["port"],
                            cluster_rule="tf" if case["port"] else "pytorch", **case["hyper"])


@pytest.mark.parametrize("seed", range(12))
def test_random_models_match_the_pytorch_reference(tmp_path, seed):
    # Seeded random sizes, attention types, vocabulary splits, tying, namings,
    # pre_lnorm, same_length, clamp_len and memory (0 too): two segments with
    # memory carried equal the paper-semantics reference (float64) to 1e-4.
    case = random_case(seed)
    run = case["run"]
    source = case["state"] if seed % 2 else save_safetensors(case["state"],
                                                             tmp_path / "w.safetensors")
    core = import_pytorch(source, **case["overrides"])
    ids = np.random.default_rng(seed).integers(0, case["hyper"]["n_token"],
                                               (run["batch"], 2 * run["seg_len"]))
    got, want = _segments(core, _reference(case, **run), ids, run["seg_len"], run["mem_len"])
    assert np.abs(got - want).max() <= 1e-4
    # Bad input names the tensor: one that is not floating point, one missing.
    rng = np.random.default_rng(seed)
    needed = sorted(set(case["state"]) - set(core.import_report.duplicates))
    name = needed[int(rng.integers(len(needed)))]
    broken = dict(case["state"], **{name: case["state"][name].astype(np.int32)})
    with pytest.raises(PytorchImportError, match=re.escape(name)):
        read_pytorch(broken, core.config)
    needed = [n for n in needed if n not in ("r_emb", "r_bias", "layers.0.dec_attn.q_net.weight")]
    name = needed[int(rng.integers(len(needed)))]  # not one that tells the attn_type
    broken = {k: v for k, v in case["state"].items() if k != name}
    with pytest.raises(PytorchImportError, match=f"lacks 1 tensors .*: {re.escape(name)}$"):
        read_pytorch(broken, core.config)


def test_given_cutoffs_keep_the_projections_the_weights_tie():
    # One table (div_val 1) split at cutoffs the shapes cannot tell, its own
    # projection for bin 1 and the embedding's for bin 2: `cutoffs=` used to
    # re-derive tie_projs ([False, True, True]) and refuse the weights.
    hyper = dict(n_token=30, n_head=2, d_head=8, cutoffs=[10, 20])
    state = make_state(d_model=32, d_embed=16, d_inner=48, n_layer=1,
                       tie_projs=[False, False, True], seed=5, **hyper)
    core = import_pytorch(state, cutoffs=(10, 20), mem_len=4)
    assert core.config.tie_projs == [False, False, True]
    run = dict(mem_len=4, same_length=False, clamp_len=-1, pre_lnorm=False)
    ids = np.random.default_rng(0).integers(0, 30, (2, 6))
    got, want = _segments(core, _reference(dict(state=state, hyper=hyper, port=False), **run),
                          ids, 3, 4)
    assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("dtype", ["int32", "bool", "complex64", "<U4"])
def test_a_tensor_that_is_not_floating_point_is_named(tmp_path, dtype):
    state = make_state(24, 32, 2, 8, 48, 1)
    name = "layers.0.pos_ff.CoreNet.0.weight"
    state[name] = state[name].astype(dtype)  # was cast silently into the weight
    for source in [state] + ([save_safetensors(state, tmp_path / "w.safetensors")]
                             if dtype in ("int32", "bool") else []):
        with pytest.raises(PytorchImportError, match=f"{name} holds .* values, where a "
                                                     "floating-point weight belongs"):
            import_pytorch(source)


@pytest.mark.parametrize("name,shape", [("word_emb.emb_layers.0.weight", (24 * 32,)),
                                        ("layers.0.dec_attn.qkv_net.weight", (48 * 32,)),
                                        ("r_w_bias", (2, 8, 1))])
def test_a_tensor_of_another_rank_is_named_while_inferring(name, shape):
    state = make_state(24, 32, 2, 8, 48, 1)
    state[name] = np.zeros(shape, np.float32)  # was an IndexError or ValueError
    with pytest.raises(PytorchImportError, match=f"{re.escape(name)} has shape "
                                                 rf"{re.escape(str(shape))}, where a \d-D"):
        read_pytorch(state)


def test_a_half_precision_state_dict_imports():
    # model.half().state_dict() rounds the sinusoid's frequencies too; they
    # used to be refused as "not the sinusoid's frequencies". They are
    # checked, not read: the core computes its own (the reference too here).
    case = CASES["wt103_port"]()
    half = {k: v.astype(np.float16) for k, v in case["state"].items()}
    core = import_pytorch(half, mem_len=MEM)
    case["state"] = {k: v for k, v in half.items() if not k.endswith("inv_freq")}
    ids = _ids(case["hyper"]["n_token"])
    assert np.abs(_run_core(core, ids) - _run_reference(case, ids, False, -1)).max() <= 1e-4
    wrong = dict(half)
    wrong["transformer.pos_emb.inv_freq"] = (1 / 1000 ** (np.arange(0, 32, 2.0) / 32)).astype(
        np.float16)  # another base
    with pytest.raises(PytorchImportError, match="inv_freq is not the sinusoid's frequencies"):
        read_pytorch(wrong)


def test_state_dicts_missing_parts_or_with_extra_tensors_are_named():
    state = CASES["adaptive_paper"]()["state"]
    for kept, message in (
            (lambda k: not k.startswith("layers."), r"<state dict>: no `layers\.N\.` tensors; "
                                                   r"is this a Transformer-XL state dict\?"),
            (lambda k: "word_emb" not in k, r"cannot infer the config: no tensor "
                                            r"'word_emb\.emb_layers\.0\.weight' in <state dict>"),
            (lambda k: "cluster" not in k, r"3 embedding tables need 2 cluster rows; "
                                           r"crit\.cluster_weight has 0")):
        with pytest.raises(PytorchImportError, match=message):
            import_pytorch({k: v for k, v in state.items() if kept(k)})
    with pytest.raises(PytorchImportError, match=r"cluster_order must be one of \('tf', "
                                                 r"'pytorch'\), got 'x'"):
        import_pytorch(state, cluster_order="x")
    extra = {**state, "foo.bar": np.zeros(3, np.float32)}
    assert "UNUSED tensors: foo.bar" in import_pytorch(extra, strict=False).import_report.lines()
