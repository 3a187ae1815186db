"""The runtimes: one public API (the documented list, the names it replaced
naming their replacement), clear errors for bad input (before the
backend runs), IO binding, device fallback, memory handed between backends."""
import gc
import os
import pydoc
import re
import threading
import weakref
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export import (ModelDirError, RuntimeInputError, RuntimeMemory, SessionTable, export_onnx,
                    export_saved_model, open_runtime)
from export.runtime import Runtime, generation_backend
from txl_tf import InputError, TransformerXL, TransformerXLConfig, TxlError
from txl_tf.app.deprecation import REMOVED

MEM_LEN = 4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = tmp_path_factory.mktemp("runtime")
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    export_saved_model(core, str(out / "saved_model"), MEM_LEN)
    export_onnx(core, str(out / "model.onnx"), MEM_LEN)
    return out


@pytest.fixture(scope="module", params=["onnx", "saved_model"])
def runtime(request, paths):
    return open_runtime(str(paths), backend=request.param, device="cpu")


@pytest.fixture
def guarded(runtime, monkeypatch):
    """The runtime with its backend calls replaced by a failure: checks must come first."""
    def untouchable(*args):
        raise AssertionError("the backend ran on bad input")
    monkeypatch.setattr(runtime, "_step", untouchable)
    monkeypatch.setattr(runtime, "_score", untouchable)
    return runtime


IDS = np.array([[1, 2, 3], [4, 5, 6]], np.int32)


def memory(batch=2, mem_len=MEM_LEN, n_layer=2, d_model=32, dtype=np.float32,
           mask_dtype=np.bool_):
    return (np.zeros([n_layer, batch, mem_len, d_model], dtype),
            np.zeros([batch, mem_len], mask_dtype))


@pytest.mark.parametrize("mem, message", [
    (memory(mem_len=MEM_LEN + 1), "mem_len fixed at 4"),
    (memory(n_layer=3), r"\[n_layer, batch, mem_len, d_model\]"),
    (memory(d_model=16), r"\[n_layer, batch, mem_len, d_model\]"),
    ((np.zeros([2, 2, MEM_LEN], np.float32), np.zeros([2, MEM_LEN], bool)), "shape"),
    (memory(dtype=np.float64), "float32"),
    (memory(mask_dtype=np.int32), "must be bool"),
    ((memory()[0], np.zeros([2, MEM_LEN + 1], bool)), "mem_mask"),
    ("not a memory", "pair"),
])
def test_bad_memory(guarded, mem, message):
    with pytest.raises(RuntimeInputError, match=message):
        guarded.step(IDS, mem)


def test_batch_mismatch(guarded):
    with pytest.raises(RuntimeInputError, match="batch mismatch: token_ids have batch 2 but "
                                                "the memory has batch 3"):
        guarded.step(IDS, memory(batch=3))
    with pytest.raises(RuntimeInputError, match="batch mismatch"):
        guarded.step(IDS[:1], guarded.initial_memory(2))
    for batch in (1, 3):  # prompts of two lengths: rows of the memory are taken first
        with pytest.raises(RuntimeInputError, match="batch mismatch: token_ids have batch 2"):
            guarded.generate([[1, 2], [3]], 2, memory=guarded.initial_memory(batch))


@pytest.mark.parametrize("ids, message", [
    (IDS.astype(np.float32), "integer dtype, got float32"),
    (IDS.astype(bool), "integer dtype, got bool"),
    (np.array([[1, 256]]), "id 256 at position \\(0, 1\\) is out of range .* 256 tokens"),
    (np.array([[-1, 2]]), "id -1 at position \\(0, 0\\) is out of range"),
    (np.array([1, 2, 3]), "\\[batch, length\\]"),
    (np.zeros([1, 0], np.int32), "non-empty"),
])
def test_bad_ids(guarded, ids, message):
    with pytest.raises(RuntimeInputError, match=message):
        guarded.step(ids, guarded.initial_memory(len(ids)) if ids.ndim == 2 else None)


def test_bad_score_targets(guarded):
    with pytest.raises(RuntimeInputError, match="target_ids: id 298"):
        guarded.score(IDS, IDS + 297)
    with pytest.raises(RuntimeInputError, match="differs from token_ids shape"):
        guarded.score(IDS, IDS[:, :2])


def test_errors_are_value_errors(guarded):
    assert issubclass(RuntimeInputError, InputError) and issubclass(RuntimeInputError, ValueError)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        guarded.initial_memory(0)


def test_int64_ids_accepted_and_match(runtime):
    lp32, _ = runtime.step(IDS)
    lp64, _ = runtime.step(IDS.astype(np.int64))
    np.testing.assert_array_equal(lp32, lp64)
    assert lp32.shape == (2, 3, 256)


def test_onnx_io_binding_keeps_memory_as_ortvalues(paths):
    bound = open_runtime(str(paths / "model.onnx"), device="cpu")
    plain = open_runtime(str(paths / "model.onnx"), device="cpu", io_binding=False)
    assert bound.io_binding and bound.provider == "CPUExecutionProvider"
    mem_b, mem_p = bound.initial_memory(2), plain.initial_memory(2)
    assert isinstance(mem_b.mems, ort.OrtValue) and isinstance(mem_b.mem_mask, ort.OrtValue)
    for shift in range(3):
        lp_b, mem_b = bound.step(IDS + shift, mem_b)
        lp_p, mem_p = plain.step(IDS + shift, mem_p)
        assert isinstance(mem_b.mems, ort.OrtValue) and isinstance(mem_p.mems, np.ndarray)
        np.testing.assert_array_equal(lp_b, lp_p)
        np.testing.assert_array_equal(mem_b.numpy()[0], mem_p.numpy()[0])
    assert mem_b.numpy()[1].all()  # 9 tokens seen, 4 slots: all real
    for memory in (mem_b, mem_p):  # `numpy()` is a copy: changing it leaves the memory
        memory.numpy()[0][...] = np.nan
        assert np.isfinite(memory.numpy()[0]).all()


@pytest.mark.parametrize("io_binding", [True, False])
def test_one_token_of_one_stream_runs_on_its_fixed_shape_session(paths, io_binding):
    path = str(paths / "model.onnx")
    fast = open_runtime(path, device="cpu", io_binding=io_binding, fixed_shapes="one_token")
    plain = open_runtime(path, device="cpu", io_binding=io_binding, fixed_shapes=False)
    mem_f, mem_p = fast.initial_memory(1), plain.initial_memory(1)
    for token in range(6):  # the memory fills up, then slides
        lp_f, mem_f = fast.step(np.array([[token + 3]]), mem_f)
        lp_p, mem_p = plain.step(np.array([[token + 3]]), mem_p)
        np.testing.assert_allclose(lp_f, lp_p, atol=1e-6)
        np.testing.assert_allclose(mem_f.numpy()[0], mem_p.numpy()[0], atol=1e-6)
        np.testing.assert_array_equal(mem_f.numpy()[1], mem_p.numpy()[1])
    assert list(fast._fixed) == [(1, 1)] and not plain._fixed
    assert fast._fixed_for((2, 1)) is None  # batch 2: the main session
    assert fast._fixed_for((1, 3)) is None  # 3 tokens: the main session
    got = fast.generate([[5, 6, 7]], 8, temperature=0)
    want = plain.generate([[5, 6, 7]], 8, temperature=0)
    np.testing.assert_array_equal(got.ids, want.ids)


def test_fixed_shapes_auto_follows_the_model_size_and_the_session_options(paths, monkeypatch):
    from export import onnx_runtime
    path = str(paths / "model.onnx")
    assert open_runtime(path, device="cpu").fixed_shapes == "one_token"
    assert open_runtime(path, device="cpu",
                        session_options=ort.SessionOptions()).fixed_shapes == "one_token"
    with pytest.raises(TxlError, match="fixed_shapes=True needs the runtime's own session"):
        open_runtime(path, device="cpu", session_options=ort.SessionOptions(),
                     fixed_shapes=True)
    monkeypatch.setattr(onnx_runtime, "SINGLE_STREAM_MAX_BYTES", 10)
    assert open_runtime(path, device="cpu").fixed_shapes is False
    with pytest.raises(ValueError, match="fixed_shapes must be"):
        open_runtime(path, device="cpu", fixed_shapes="yes")
    with pytest.warns(DeprecationWarning, match="single_stream is deprecated .* use fixed_shapes"):
        assert open_runtime(path, device="cpu", single_stream=True).fixed_shapes == "one_token"


def test_device_fallback_names_the_provider(paths, caplog):
    rt = open_runtime(str(paths / "model.onnx"), device="cuda")
    if rt.provider != "CUDAExecutionProvider":  # not in this onnxruntime, or did not load
        assert rt.provider == "CPUExecutionProvider" and rt.device == "cpu"
        listed = "CUDAExecutionProvider" in ort.get_available_providers()
        assert ("CUDAExecutionProvider failed to load: this onnxruntime is a CUDA" if listed
                else "CUDAExecutionProvider is not available") in caplog.text
    assert "provider=" in rt.describe()
    with pytest.raises(ValueError, match="device must be"):
        open_runtime(str(paths / "model.onnx"), device="tpu")


def test_a_listed_cuda_provider_that_does_not_load_is_one_warning_and_the_cpu(
        paths, cuda_that_does_not_load, caplog, capfd):
    """onnxruntime-gpu without a GPU or its CUDA libraries lists the CUDA
    provider that will not load: the runtime finds out once, before its
    first session (which then shares the CPU's one copy of the weights),
    says so in one line naming the CUDA it needs, and onnxruntime's own
    log of the failure stays off stderr."""
    from export import onnx_runtime
    assert onnx_runtime.choose_providers("auto")[0] == ["CPUExecutionProvider"]
    capfd.readouterr()
    rt = open_runtime(str(paths / "model.onnx"), device="auto")
    assert (rt.provider, rt.device) == ("CPUExecutionProvider", "cpu")
    cpu = open_runtime(str(paths / "model.onnx"), device="cpu")  # as without onnxruntime-gpu
    assert rt._shared_weights.keys() == cpu._shared_weights.keys()
    said = [r.getMessage() for r in caplog.records if "CUDAExecutionProvider" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "CUDAExecutionProvider failed to load: this onnxruntime is "), said
    assert "onnxruntime" not in capfd.readouterr().err  # none of its own log lines


def test_a_gpu_machine_without_onnxruntime_gpu_says_so_once(paths, monkeypatch, caplog):
    """`device="auto"` with the CPU's onnxruntime runs on the CPU without a
    word, as it should on a machine without a GPU; on one with NVIDIA's
    driver it did so too, and now says what would use the GPU."""
    from export import onnx_runtime
    monkeypatch.setattr(onnx_runtime, "cuda_built", lambda: False)
    open_runtime(str(paths / "model.onnx"), device="auto")
    assert not [r for r in caplog.records if "CUDAExecutionProvider" in r.getMessage()]
    monkeypatch.setattr(onnx_runtime, "nvidia_driver", lambda: "NVRM version: 580.82.07")
    rt = open_runtime(str(paths / "model.onnx"), device="auto")
    assert rt.device == "cpu"
    said = [r.getMessage() for r in caplog.records if "CUDAExecutionProvider" in r.getMessage()]
    assert len(said) == 1 and "NVIDIA's GPU driver: onnxruntime-gpu" in said[0], said


def test_a_gpu_machine_whose_tensorflow_lists_no_gpu_says_so_for_a_saved_model(monkeypatch,
                                                                               caplog):
    from export import tf_runtime
    monkeypatch.setattr(tf_runtime.tf.config, "list_physical_devices", lambda kind=None: [])
    assert tf_runtime.choose_tf_device("auto") == ("/CPU:0", "cpu")
    assert "no GPU visible" not in caplog.text  # no GPU here: nothing to say
    monkeypatch.setattr(tf_runtime, "nvidia_driver", lambda: "NVRM version: 580.82.07")
    assert tf_runtime.choose_tf_device("auto") == ("/CPU:0", "cpu")
    assert caplog.text.count("no GPU visible to TensorFlow") == 1
    assert "NVIDIA's GPU driver, and TensorFlow with its CUDA libraries" in caplog.text


def test_a_cuda_provider_that_cannot_start_is_not_loaded_and_prints_nothing(monkeypatch, capfd):
    """onnxruntime-gpu with a driver and no usable GPU: its CUDA provider
    loads, then raises as the session starts, which onnxruntime's Python (its
    fallback on, the default) prints on stdout before going on with the CPU;
    `cuda_loads` turns the fallback off and takes the error as its answer."""
    from export import onnx_runtime
    real = ort.InferenceSession

    def session(model, providers=None, enable_fallback=1, **kwargs):  # as onnxruntime does
        if "CUDAExecutionProvider" in providers:
            if int(enable_fallback) != 1:
                raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")
            print("*************** EP Error ***************")
            providers = ["CPUExecutionProvider"]
        return real(model, providers=providers, **kwargs)
    monkeypatch.setattr(ort, "InferenceSession", session)
    onnx_runtime.cuda_loads.cache_clear()
    try:
        assert onnx_runtime.cuda_loads() is False
        assert capfd.readouterr().out == ""
    finally:
        onnx_runtime.cuda_loads.cache_clear()


def test_a_dropped_onnx_runtime_is_freed_at_once(paths):
    """A runtime holds its sessions, the weights and open files: dropped, it
    is freed then, not at Python's next garbage collection (no reference
    cycle; a server that swaps models would hold both until then). The
    SavedModel's loaded functions are TensorFlow's own cycles."""
    gc.collect()
    gc.disable()
    try:
        runtime = open_runtime(str(paths / "model.onnx"), device="cpu")
        first = runtime.generate([[1, 2, 3]], 2, temperature=0)
        again = runtime.generate(None, 2, resume=first.state, temperature=0)
        assert generation_backend(runtime) is generation_backend(runtime)
        table = SessionTable(runtime, max_batch=2)
        table.open("a", [1, 2], 2)
        while table.active():
            table.step()
        assert table.close("a").ids.shape == (1, 2)
        freed = weakref.ref(runtime)
        del runtime, first, again, table
        assert freed() is None
    finally:
        gc.enable()


def test_memory_moves_between_backends(paths):
    onnx_rt = open_runtime(str(paths), backend="onnx", device="cpu")
    tf_rt = open_runtime(str(paths), backend="saved_model")
    _, mem = onnx_rt.step(IDS)
    lp_tf, _ = tf_rt.step(IDS, mem)          # OrtValues into the SavedModel
    lp_onnx, _ = onnx_rt.step(IDS, RuntimeMemory(*mem.numpy()))
    np.testing.assert_allclose(lp_tf, lp_onnx, atol=1e-4)
    mixed, _ = tf_rt.step(IDS, (mem.mems, mem.numpy()[1]))  # an OrtValue beside numpy
    np.testing.assert_allclose(mixed, lp_tf, atol=1e-6)


def test_open_runtime_errors(paths, tmp_path):
    with pytest.raises(FileNotFoundError):
        open_runtime(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no ONNX model"):
        open_runtime(str(paths / "saved_model"), backend="onnx")
    assert open_runtime(str(paths)).backend == "onnxruntime"  # auto prefers ONNX


def test_score_of_a_last_export_is_the_onnx_error_and_the_saved_models_nll(tmp_path):
    """What `Runtime.score`'s docstring says of a `log_probs='last'` export."""
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    export_onnx(core, str(tmp_path / "model.onnx"), MEM_LEN, log_probs="last")
    export_saved_model(core, str(tmp_path / "saved_model"), MEM_LEN, log_probs="last")
    ids, targets = np.array([[1, 2, 3]]), np.array([[2, 3, 4]])
    with pytest.raises(RuntimeInputError, match="log_probs='last'"):
        open_runtime(str(tmp_path / "model.onnx"), device="cpu").score(ids, targets)
    nll, _ = open_runtime(str(tmp_path / "saved_model"), device="cpu").score(ids, targets)
    want, _ = core(ids, core.initial_memory(1, MEM_LEN), targets=targets)
    np.testing.assert_allclose(nll, want.numpy(), atol=1e-5)


@pytest.mark.parametrize("name, backend", [("model.onnx", "onnxruntime"),
                                           ("saved_model", "saved_model"), (".", "onnxruntime")])
def test_open_runtime_takes_a_pathlib_path(paths, name, backend):
    """`path` as a `pathlib.Path`, of a `.onnx` file too (its `.endswith`
    was an AttributeError)."""
    assert open_runtime(Path(paths) / name, device="cpu").backend == backend


def test_an_option_of_the_other_backend_is_one_error_naming_it_and_its_backend(paths):
    """`open_runtime(backend="saved_model", low_memory=True)` (or any other
    ONNX Runtime option, or a SavedModel folder opened by "auto") was a bare
    `TypeError` from the SavedModel runtime's constructor, and a misspelt
    option one from ONNX Runtime's; each is refused before anything loads."""
    import inspect
    from export.onnx_runtime import OnnxRuntime
    from export.tf_runtime import SavedModelRuntime
    shared = {"self", "path", "device"}
    only_onnx = set(inspect.signature(OnnxRuntime.__init__).parameters) - shared
    assert {"low_memory", "io_binding", "tf32"} <= only_onnx
    assert not set(inspect.signature(SavedModelRuntime.__init__).parameters) - shared
    with pytest.raises(TxlError, match=r"^open_runtime: low_memory is an option of the ONNX "
                                       r"backend \(OnnxRuntime\), not of the SavedModel one"):
        open_runtime(str(paths), backend="saved_model", low_memory=True)
    for name in sorted(only_onnx):  # a SavedModel folder: "auto" opens it
        with pytest.raises(TxlError, match=rf"^open_runtime: {name} is an option of the ONNX"):
            open_runtime(str(paths / "saved_model"), **{name: True})
    with pytest.raises(TxlError, match=r"^open_runtime: io_binding, tf32 are options of the ONNX"):
        open_runtime(str(paths), backend="saved_model", tf32=True, io_binding=False)
    with pytest.raises(TxlError, match=r"^open_runtime: unknown option low_memroy; the ONNX "
                                       r"backend takes .*low_memory.*, the SavedModel one none"):
        open_runtime(str(paths), backend="onnx", low_memroy=True)


def garbage_memory(garbage, seed=0):
    """`(clean, dirty, mem_mask)`: the same real slots, zeros or `garbage` elsewhere."""
    rng = np.random.default_rng(seed)
    mems = rng.normal(size=(2, 2, MEM_LEN, 32)).astype(np.float32)
    mask = np.array([[False, True, True, True], [False] * MEM_LEN])
    clean = np.where(mask[None, :, :, None], mems, 0).astype(np.float32)
    return clean, np.where(mask[None, :, :, None], mems, garbage).astype(np.float32), mask


@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30])
def test_garbage_in_invalid_slots_changes_nothing_in_the_core(garbage):
    from txl_tf import Memory
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    clean, dirty, mask = garbage_memory(garbage)
    expected, expected_mem = core(IDS, Memory(clean, mask))
    got, got_mem = core(IDS, Memory(dirty, mask))
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    np.testing.assert_array_equal(got_mem.mems.numpy(), expected_mem.mems.numpy())
    nll, nll_mem = core(IDS, Memory(dirty, mask), targets=IDS)
    assert np.isfinite(nll.numpy()).all() and np.isfinite(nll_mem.mems.numpy()).all()


@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30])
def test_garbage_in_invalid_slots_changes_nothing_in_the_runtimes(runtime, garbage):
    clean, dirty, mask = garbage_memory(garbage, seed=1)
    expected, expected_mem = runtime.step(IDS, (clean, mask))
    got, got_mem = runtime.step(IDS, (dirty, mask))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(got_mem.numpy()[0], expected_mem.numpy()[0], atol=1e-6)
    nll, _ = runtime.score(IDS, IDS, (dirty, mask))
    assert np.isfinite(nll).all()


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_non_finite_valid_memory_is_an_error_naming_the_stream(runtime, poison):
    """NaN/inf in a valid slot: an error naming the stream, never NaN log-probs."""
    from txl_tf import NonFiniteMemoryError
    clean, _, mask = garbage_memory(0.0, seed=2)
    dirty = clean.copy()
    dirty[1, 0, 2, 5] = poison  # layer 1, stream 0, a valid slot
    for call in (lambda m: runtime.step(IDS, m),
                 lambda m: generation_backend(runtime).step_last(IDS, m),
                 lambda m: runtime.score(IDS, IDS, m)):
        with pytest.raises(NonFiniteMemoryError, match=r"stream\(s\) 0:") as caught:
            call((dirty, mask))
        assert caught.value.rows == [0]
    with pytest.raises(NonFiniteMemoryError, match=r"stream\(s\) 0:"):
        runtime.generate([[1, 2], [3]], 2, memory=(dirty, mask))
    log_probs, _ = runtime.step(IDS, (clean, mask))
    assert np.isfinite(log_probs).all()


def test_a_decode_graph_opened_alone_is_one_clear_error(tmp_path):
    """A `ModelDirError` naming the file, as docs/export-and-serving.md says
    of a decode graph, a classifier's or a foreign one (was a bare TxlError)."""
    graph = tmp_path / "decode_init.onnx"
    graph.write_bytes(b"")
    with pytest.raises(ModelDirError, match=r"decode_init\.onnx is one of the cached decode "
                                           r"interface's graphs.*open .*model\.onnx"):
        open_runtime(str(graph))


def test_a_graph_that_is_not_a_txl_model_is_one_error_naming_it(tmp_path):
    from onnx import TensorProto, helper, save_model
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    foreign = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "foreign", [value],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
        ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    save_model(foreign, str(tmp_path / "foreign.onnx"))
    with pytest.raises(TxlError, match=r"foreign\.onnx: export metadata lacks"):
        open_runtime(str(tmp_path / "foreign.onnx"))
    helper.set_model_props(foreign, {"interface": "decode_step", "mem_len": "4"})
    save_model(foreign, str(tmp_path / "renamed.onnx"))  # a decode graph under another name
    with pytest.raises(TxlError, match=r"renamed\.onnx: .*decode_step.*open the model\.onnx"):
        open_runtime(str(tmp_path / "renamed.onnx"))


# ------------------------------------------------------------ the public API
REPO = Path(__file__).resolve().parent.parent


def documented_api():
    """The names of docs/export-and-serving.md's runtime API table."""
    text = (REPO / "docs" / "export-and-serving.md").read_text()
    section = text.split("### The runtime API\n")[1].split("\n#")[0]
    return re.findall(r"^\| `(\w+)", section, re.M)


# The runtime's names removed in 0.4.0 (deprecated in 0.3.0).
REMOVED_NAMES = [name.split(".")[1] for name in REMOVED if name.startswith("Runtime.")]


def test_the_public_runtime_api_is_the_documented_list():
    from export.onnx_runtime import OnnxRuntime
    from export.tf_runtime import SavedModelRuntime
    documented = documented_api()
    assert len(documented) == len(set(documented))  # one line each
    for cls in (Runtime, OnnxRuntime, SavedModelRuntime):
        public = [n for n in dir(cls) if not n.startswith("_") and n not in REMOVED_NAMES]
        assert sorted(public) == sorted(documented), cls
    assert len(REMOVED_NAMES) == 10 and not set(REMOVED_NAMES) & set(documented)


def test_the_runtime_api_tables_calls_are_the_signatures():
    """Each `name(arguments)` of the table names the method's parameters in
    order, with their defaults (`...`: the rest), so a call by keyword as
    written works."""
    import inspect
    text = (REPO / "docs" / "export-and-serving.md").read_text()
    section = text.split("### The runtime API\n")[1].split("\n#")[0]
    calls = re.findall(r"^\| `(\w+)\(([^)]*)\)`", section, re.M)
    assert len(calls) >= 10
    for name, arguments in calls:
        written = [a.strip() for a in arguments.split(",") if a.strip()]
        params = [p for p in inspect.signature(getattr(Runtime, name)).parameters.values()
                  if p.name != "self"]
        actual = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                  for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if written and written[-1] == "...":
            written, actual = written[:-1], actual[:len(written) - 1]
        assert written == actual, name


@pytest.mark.parametrize("name", REMOVED_NAMES)
def test_the_names_removed_in_0_4_0_name_their_replacement(runtime, name):
    """One AttributeError naming the documented call that replaces each."""
    replacement = REMOVED[f"Runtime.{name}"]
    assert replacement.split("(")[0] in documented_api()
    with pytest.raises(AttributeError,
                       match=rf"^Runtime\.{name} was removed; use {re.escape(replacement)}$"):
        getattr(runtime, name)
    assert not hasattr(runtime, name) and not hasattr(type(runtime), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        runtime.no_such_name
    # help() lists it among the methods: there it says it was removed, not nothing
    assert f"|  {name}\n |      Runtime.{name} was removed; use " in \
        pydoc.render_doc(type(runtime), renderer=pydoc.plaintext)


def test_step_lasts_replacement_says_what_a_last_export_returns():
    """`step` of a `log_probs='last'` export is `[B, n_token]` already: the
    `[:, -1]` the message asked for was each row's last vocabulary entry."""
    for name in ("step_last", "next_log_probs"):
        assert "[:, -1]" in REMOVED[f"Runtime.{name}"], name
        assert "all of them on a log_probs='last' export" in REMOVED[f"Runtime.{name}"], name


def test_take_and_concat_check_what_they_are_given(paths):
    runtime = open_runtime(str(paths / "saved_model"), device="cpu")
    fresh, cache = runtime.initial_memory(2), runtime.decode_init(runtime.initial_memory(2))
    for state in (fresh, cache):
        for rows in ([2], [-1], [], [[0]], [0.5]):
            with pytest.raises(RuntimeInputError, match="rows"):
                runtime.take(state, rows)
    with pytest.raises(RuntimeInputError, match="not a mix"):
        runtime.concat([fresh, cache])
    with pytest.raises(RuntimeInputError, match="non-empty list"):
        runtime.concat([])
    with pytest.raises(RuntimeInputError, match="mem_len fixed"):
        runtime.take(memory(mem_len=MEM_LEN + 1), [0])
    copy = runtime.take(cache, [0, 1])  # every row, in order: a copy steps may advance
    assert all(not np.shares_memory(copy[name], cache[name]) for name in cache)
    runtime.decode_step(np.array([1, 2]), copy)
    with pytest.raises(RuntimeInputError, match="ring positions"):
        runtime.concat([cache, copy])


def test_a_runtime_and_a_session_tables_repr_say_what_they_are(runtime):
    """In a notebook a cell ending in the object shows its repr: the export's
    geometry and options, and the table's sessions, not `<... object at 0x...>`."""
    from export import SessionTable
    name = {"onnxruntime": "OnnxRuntime", "saved_model": "SavedModelRuntime"}[runtime.backend]
    assert repr(runtime) == f"<{name} {runtime.describe()}>"
    table = SessionTable(runtime, max_batch=2)
    table.open("a", [1, 2, 3], 2)
    table.open("b", [4], 0)
    kind = "slab" if runtime.use_decode_cache else "round robin"
    assert repr(table) == (f"<SessionTable: 2 open, 1 generating, max_batch=2, {kind} over "
                           f"{runtime!r}>")
    held, release = threading.Event(), threading.Event()

    def a_step():  # holds the lock, as a step in another thread does
        with table._lock:
            held.set()
            release.wait(60)
    stepping = threading.Thread(target=a_step)
    stepping.start()
    held.wait(60)
    try:  # a log line's repr does not wait for the step
        assert repr(table).startswith("<SessionTable: stepping, max_batch=2,")
    finally:
        release.set()
        stepping.join()
    table.run()
    assert repr(table).startswith("<SessionTable: 2 open, 0 generating,")
    unopened = object.__new__(type(runtime))  # as a debugger shows one whose __init__ failed
    assert repr(unopened).startswith("<export.")


def test_a_runtime_whose_export_was_replaced_says_so(tmp_path):
    """A runtime opens some sessions at first use (a fixed shape's, the
    decode graphs): after a re-export into its folder (a notebook cell run
    again) they read the new files, and its answers mixed two exports."""
    path = str(tmp_path / "model.onnx")
    export_onnx(TransformerXL(TransformerXLConfig.preset("tiny")), path, MEM_LEN)
    runtime = open_runtime(path, device="cpu", fixed_shapes="one_token")
    one_token = np.array([[5]], np.int32)
    runtime.step(one_token)  # a shape's first call: the main session (its second opens one)
    export_onnx(TransformerXL(TransformerXLConfig.preset("tiny")), path, MEM_LEN)  # other weights
    with pytest.raises(TxlError, match=r"changed after this runtime opened it \(model\.onnx "
                                       r"was replaced: exported again\?\); open it again"):
        runtime.step(one_token)  # its one-token session opens now
    log_probs, _ = open_runtime(path, device="cpu", fixed_shapes="one_token").step(one_token)
    assert np.isfinite(log_probs).all()
    os.remove(path)
    with pytest.raises(TxlError, match=r"model\.onnx was removed"):
        runtime.step(one_token)


def test_an_export_replaced_while_the_runtime_opens_it_is_seen(tmp_path, monkeypatch):
    """The runtime recorded its files after its main session had read them:
    a re-export landing in between (another process writing the folder) was
    recorded as the files opened, and later sessions mixed the two."""
    from export import onnx_runtime
    path = str(tmp_path / "model.onnx")
    export_onnx(TransformerXL(TransformerXLConfig.preset("tiny")), path, MEM_LEN)
    opened = onnx_runtime.open_session

    def then_replaced(*args):
        session = opened(*args)
        stamp = os.stat(path).st_mtime_ns + 10**9
        os.utime(path, ns=(stamp, stamp))  # written again once the main session read it
        monkeypatch.setattr(onnx_runtime, "open_session", opened)
        return session
    monkeypatch.setattr(onnx_runtime, "open_session", then_replaced)
    runtime = open_runtime(path, device="cpu", fixed_shapes="one_token")
    one_token = np.array([[5]], np.int32)
    runtime.step(one_token)  # the main session
    with pytest.raises(TxlError, match=r"model\.onnx was replaced"):
        runtime.step(one_token)  # its one-token session opens now


@pytest.mark.parametrize("mem_len", [2.5, float("inf"), float("nan"), "8", True])
def test_a_mem_len_that_is_not_an_integer_is_refused_by_the_exports(tmp_path, mem_len):
    """int(mem_len) took 2.5 as 2 (an export of 2 slots), "8" as 8 and True
    as 1, and raised OverflowError/ValueError naming no argument for inf/NaN."""
    from export import write_triton_repository
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    for export, path in ((export_onnx, "model.onnx"), (export_saved_model, "saved_model"),
                         (write_triton_repository, "triton")):
        with pytest.raises(TxlError, match=r"^mem_len must be an integer >= 0, got "):
            export(core, str(tmp_path / path), mem_len)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("changes,declared", [
    ({"n_token": 1000}, "log_probs"), ({"log_probs": "last"}, "log_probs"),
    ({"mem_len": 8}, "mems"), ({"n_layer": 3}, "mems"), ({"d_model": 64, "d_head": 32}, "mems")])
def test_onnx_metadata_that_is_not_the_graphs_is_refused_at_open(paths, tmp_path, changes,
                                                                  declared):
    """A model.onnx whose metadata was edited (or copied from another export):
    n_token 1000 over a 256-token graph let ids 256..999 through the runtime's
    checks, log_probs "last" over an "all" graph gave [B, T, n_token] where
    [B, n_token] is promised, and another mem_len, n_layer or d_model was
    onnxruntime's RuntimeError at the first step."""
    import json

    import onnx

    from export import ModelDirError
    model = onnx.load(str(paths / "model.onnx"))
    props = {p.key: p.value for p in model.metadata_props}
    config = json.loads(props["txl_tf.config"])
    for key, value in changes.items():
        if key in config:
            config[key] = value
        props[key] = str(value)
    props["txl_tf.config"] = json.dumps(config)
    del model.metadata_props[:]
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(ModelDirError, match=rf"model\.onnx: its metadata makes {declared} .*, "
                                            r"the graph declares .*: the metadata is not this "
                                            "graph's"):
        open_runtime(str(tmp_path / "model.onnx"), device="cpu")


def test_an_export_without_the_asked_backend_is_named(tmp_path):
    from export.runtime import choose_artefact
    (tmp_path / "onnx_only").mkdir()
    (tmp_path / "onnx_only" / "model.onnx").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^no SavedModel at '.*onnx_only'$"):
        open_runtime(str(tmp_path / "onnx_only"), backend="saved_model")
    with pytest.raises(FileNotFoundError, match=r"^no ONNX model at '.*empty'$"):
        open_runtime(str(tmp_path / "empty"), backend="onnx")
    # Was "no SavedModel at ...": the backend tried last, for a model directory or a text file.
    (tmp_path / "notes.txt").write_text("not a model")
    for path in (tmp_path / "empty", tmp_path / "notes.txt"):
        with pytest.raises(FileNotFoundError, match=r"^no export at '.*': neither an ONNX model "
                                                    r"nor a SavedModel \(open a \.onnx file, "):
            open_runtime(str(path))
    with pytest.raises(TxlError, match=r"^backend must be auto, onnx or saved_model, got "
                                       r"'tflite'$"):
        choose_artefact(str(tmp_path / "onnx_only"), backend="tflite")
    assert choose_artefact(str(tmp_path / "onnx_only")) == (
        "onnx", str(tmp_path / "onnx_only" / "model.onnx"))
