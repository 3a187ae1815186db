"""Segments on fixed shapes (`OnnxRuntime`'s `fixed_shapes`): a `(batch,
seq_len)` seen twice runs on a session of `model.onnx` with those axes fixed,
which computes what the dynamic one does; on the device path (forced here on
the CPU provider, as tests/test_device_ring.py does) over the fixed buffers a
CUDA graph replays (`export.device_memory.FixedSegment`). On a GPU,
`TXL_DEVICE_TESTS=cuda pytest tests/test_fixed_segments.py -k device` runs
the device path there, CUDA graphs captured."""
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import open_runtime, onnx_runtime
from export.device_memory import FixedSegment
from test_decode_cache_export import CONFIG, export_of_config
from test_device_ring import DEVICE, crossings
from txl_tf.errors import ModelDirError, TxlError

# The CPU provider computes what the dynamic session does exactly (0 seen); CUDA
# (TF32 off) within float32 round-off of the CPU.
ATOL = 1e-6 if DEVICE == "cpu" else 1e-5


@pytest.fixture(scope="module")
def path(built_once):
    return str(export_of_config(built_once)[1] / "model.onnx")


@pytest.fixture(scope="module")
def dynamic(path):
    return open_runtime(path, device="cpu", fixed_shapes=False)


def fixed_graph(path, shape):
    """`model.onnx` with `shape` fixed, as ONNX Runtime's basic (provider-free)
    optimizations leave it."""
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = os.path.join(folder, "fixed.onnx")
        onnx_runtime._fixed_shape_session(path, options, ["CPUExecutionProvider"], shape)
        return onnx.load(options.optimized_model_filepath, load_external_data=False).graph


def test_a_fixed_shape_session_equals_the_dynamic_one_and_keeps_its_values_on_the_device(
        path, dynamic):
    """Its log-probs and new memory equal the dynamic session's (0 difference
    seen on the CPU); its shape arithmetic folds away, and with it every
    value crossing between the host and the device (what keeps ONNX Runtime
    from capturing the dynamic graph as a CUDA graph)."""
    fixed = open_runtime(path, device="cpu", fixed_shapes=True)
    session = fixed._fixed_for((2, 3), open_now=True)
    rng = np.random.default_rng(0)
    feeds = {"token_ids": rng.integers(0, CONFIG.n_token, [2, 3]).astype(np.int32),
             "mems": rng.standard_normal([CONFIG.n_layer, 2, CONFIG.mem_len, CONFIG.d_model],
                                         dtype=np.float32),
             "mem_mask": rng.random([2, CONFIG.mem_len]) < 0.7}
    for got, want in zip(session.run(None, feeds), dynamic.session.run(None, feeds)):
        np.testing.assert_allclose(got, want, atol=ATOL)
    graph = fixed_graph(path, (2, 3))
    assert crossings(graph) == [] and not any(n.op_type == "Shape" for n in graph.node)
    assert crossings(onnx.load(path, load_external_data=False).graph)


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device"])
def test_steps_and_scores_on_fixed_shapes_equal_the_dynamic_path(path, dynamic, monkeypatch,
                                                                 host_copies, device_path):
    """Calls of changing shapes, each stream's memory carried, through the
    fixed-shape sessions (two kept here: the least recently used dropped and
    opened again) equal the dynamic session's. On the device path the fixed
    buffers stay where they are, a memory or log-probs handed back are not
    changed by the next call, and only what the API returns comes to the host."""
    monkeypatch.setattr(onnx_runtime, "FIXED_SHAPES_KEPT", 2)
    options = dict(device=DEVICE, device_cache=True, cuda_graph=True) if device_path else \
        dict(device="cpu")
    fixed = open_runtime(path, fixed_shapes=True, **options)
    opened = []
    open_fixed = fixed._open_fixed
    monkeypatch.setattr(fixed, "_open_fixed", lambda shape: opened.append(shape) or
                        open_fixed(shape))
    rng = np.random.default_rng(1)
    memories = {batch: (dynamic.initial_memory(batch), fixed.initial_memory(batch))
                for batch in (1, 2)}
    # (kind, batch, seq_len): each shape's second call opens it; (2, 3), used after (1, 3)
    # opened, stays when (2, 4) opens, and (1, 3) is dropped, then opened again.
    calls = [("step", 2, 3), ("score", 2, 3), ("step", 2, 3), ("score", 2, 3), ("step", 1, 3),
             ("score", 1, 3), ("step", 2, 3), ("step", 2, 4), ("score", 2, 4), ("step", 1, 3),
             ("score", 1, 3), ("step", 2, 3)]
    buffers, kept = {}, None
    for kind, batch, length in calls:
        ids = rng.integers(0, CONFIG.n_token, [batch, length + 1])
        want_memory, memory = memories[batch]
        host_copies.clear()
        if kind == "score":
            got, new_memory = fixed.score(ids[:, :-1], ids[:, 1:], memory)
            copied = set()  # the nll are written to the host, the log-probs stay
        else:
            got, new_memory = fixed.step(ids[:, :-1], memory)
            copied = {(batch, length, CONFIG.n_token)}
        if device_path:
            assert set(host_copies) <= copied, host_copies
        if kind == "score":
            want, want_memory = dynamic.score(ids[:, :-1], ids[:, 1:], want_memory)
        else:
            want, want_memory = dynamic.step(ids[:, :-1], want_memory)
        np.testing.assert_allclose(got, want, atol=ATOL)
        for a, b in zip(new_memory.numpy(), want_memory.numpy()):
            np.testing.assert_allclose(a, b, atol=ATOL)
        if kept is not None:  # the previous call's results, as they were
            for value, copy in kept:
                np.testing.assert_array_equal(value if isinstance(value, np.ndarray)
                                              else value.numpy(), copy)
        kept = [(got, got.copy())] + [(value, value.numpy().copy()) for value in new_memory]
        memories[batch] = (want_memory, new_memory)
        segment = fixed._fixed.get((batch, length))
        if isinstance(segment, FixedSegment):
            now = {name: value.data_ptr()
                   for name, value in {**segment.inputs, **segment.outputs}.items()}
            assert buffers.setdefault(segment, now) == now  # bound once, never moved
    assert opened == [(2, 3), (1, 3), (2, 4), (1, 3)], opened
    assert list(fixed._fixed) == [(2, 4), (1, 3)]
    assert device_path == all(isinstance(s, FixedSegment) for s in fixed._fixed.values())
    assert len(buffers) == (len(opened) if device_path else 0)


def test_a_segment_the_device_cannot_capture_runs_without_a_graph(path, dynamic, monkeypatch,
                                                                caplog):
    """Where ONNX Runtime refuses the capture (a node left to the CPU), the
    fixed buffers run without it, after one warning."""
    fixed = open_runtime(path, device=DEVICE, device_cache=True, cuda_graph=True,
                         fixed_shapes=True)
    open_session = fixed._open_fixed_session

    def refuse(shape, graphs):  # the first session, the one asked to capture
        if not refuse.done:
            refuse.done = True
            raise ModelDirError("cannot open the ONNX model: graph capture refused")
        return open_session(shape, graphs)
    refuse.done = False
    monkeypatch.setattr(fixed, "_open_fixed_session", refuse)
    ids = np.arange(6).reshape(2, 3) % CONFIG.n_token
    memory, want_memory = fixed.initial_memory(2), dynamic.initial_memory(2)
    with caplog.at_level("WARNING"):
        for _ in range(3):
            got, memory = fixed.step(ids, memory)
            want, want_memory = dynamic.step(ids, want_memory)
            np.testing.assert_allclose(got, want, atol=ATOL)
        fixed.step(ids[:1], fixed.initial_memory(1))
        fixed.step(ids[:1], fixed.initial_memory(1))  # another shape: no second warning
    assert caplog.text.count("segments run without CUDA graphs") == 1
    assert not fixed._segment_graphs and isinstance(fixed._fixed[(2, 3)], FixedSegment)


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device"])
def test_the_one_token_session_in_the_callers_options_fixes_no_other_graph(path, dynamic,
                                                                          device_path):
    """With `session_options` the `[1, 1]` session's overrides go into them:
    the graphs read with them later (the decode graphs' `batch` axis) must
    not be fixed to one row, and another runtime given them is refused."""
    options = dict(device=DEVICE, device_cache=True, cuda_graph=True) if device_path else \
        dict(device="cpu")
    session_options = ort.SessionOptions()
    fixed = open_runtime(path, session_options=session_options, **options)
    assert fixed.fixed_shapes == "one_token"
    fixed.step([[1]]), fixed.step([[1]])
    assert list(fixed._fixed) == [(1, 1)]
    prompts = [[1, 2], [3, 4]]
    want = dynamic.generate(prompts, 3, temperature=0)
    np.testing.assert_array_equal(fixed.generate(prompts, 3, temperature=0).ids, want.ids)
    with pytest.raises(TxlError, match=r"fixed to \[1, 1\].*options of its own"):
        open_runtime(path, session_options=session_options, **options)  # not fixed again


def test_memories_joined_on_the_device_keep_each_rows_memory_and_mask(path, dynamic):
    """`concat` of memories on the device (the join graphs) puts each
    memory's rows, masks included, where the host's join puts them: three
    memories of different lengths read (two graphs: 2, then 1 more)."""
    device = open_runtime(path, device=DEVICE, device_cache=True)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 50, [1, n]).astype(np.int32) for n in (1, 2, 4)]
    on_device = device.concat([device.step(p)[1] for p in prompts])
    on_host = dynamic.concat([dynamic.step(p)[1] for p in prompts])
    got, want = on_device.numpy(), on_host.numpy()
    np.testing.assert_array_equal(got[1], want[1])
    assert len({tuple(row) for row in want[1]}) == 3  # the masks tell the rows apart
    np.testing.assert_allclose(got[0], want[0], atol=ATOL)


def test_a_numpy_memory_crosses_once_each_way_and_nothing_handed_back_is_copied_again(
        path, dynamic, monkeypatch):
    """Evaluation with a numpy memory on the device path (forced here on the
    CPU provider, its OrtValues read as a device's: `numpy()` makes a fresh
    host array): each `step` or `score` moves the memory and its mask to the
    device once (`ortvalue_from_numpy` or `update_inplace`) and
    `memory.numpy()` brings them back once; the arrays `numpy()` made, the
    log-probs' and the memory's, are returned as they are, not copied again
    on the host (benchmarks/NOTES.md §5: what a numpy memory costs)."""
    fixed = open_runtime(path, device=DEVICE, device_cache=True, cuda_graph=True,
                         fixed_shapes=True)
    batch, length = 2, 3
    shapes = {(CONFIG.n_layer, batch, CONFIG.mem_len, CONFIG.d_model): "mems",
              (batch, CONFIG.mem_len): "mem_mask", (batch, length, CONFIG.n_token): "log_probs"}
    to_device, made = [], []
    from_numpy, numpy = ort.OrtValue.ortvalue_from_numpy, ort.OrtValue.numpy
    update_inplace = ort.OrtValue.update_inplace

    def counted_from_numpy(array, *args, **kwargs):
        to_device.append(shapes.get(tuple(array.shape)))
        return from_numpy(array, *args, **kwargs)

    def counted_update(value, array):  # a host array written into a device buffer
        to_device.append(shapes.get(tuple(array.shape)))
        return update_inplace(value, array)

    def device_numpy(value):
        made.append(np.array(numpy(value)))  # a device's numpy(): a host array of its own
        return made[-1]
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", staticmethod(counted_from_numpy))
    monkeypatch.setattr(ort.OrtValue, "update_inplace", counted_update)
    monkeypatch.setattr(ort.OrtValue, "numpy", device_numpy)
    monkeypatch.setattr(ort.OrtValue, "device_name", lambda value: "Cuda")
    rng = np.random.default_rng(5)
    memory = (rng.standard_normal(list(shapes)[0], dtype=np.float32),
              rng.random(list(shapes)[1]) < 0.7)
    want_memory = memory
    for call in range(4):
        ids = rng.integers(0, CONFIG.n_token, [batch, length + 1])
        to_device.clear(), made.clear()
        if call % 2:
            got, new_memory = fixed.score(ids[:, :-1], ids[:, 1:], memory)
        else:
            got, new_memory = fixed.step(ids[:, :-1], memory)
        crossed = [shapes.get(tuple(array.shape)) for array in made]
        memory = new_memory.numpy()
        if call:  # the shape's second call on: its fixed buffers
            assert isinstance(fixed._fixed[(batch, length)], FixedSegment)
            assert sorted(filter(None, to_device)) == ["mem_mask", "mems"], to_device
            # a step's log-probs come to the host, a score's stay (its nll are written there)
            assert crossed == ([] if call % 2 else ["log_probs"]), crossed
            assert call % 2 or any(got is array for array in made), "log-probs copied again"
            assert [id(a) for a in memory] == [id(a) for a in made[len(crossed):]]
        if call % 2:
            want, want_memory = dynamic.score(ids[:, :-1], ids[:, 1:], want_memory)
        else:
            want, want_memory = dynamic.step(ids[:, :-1], want_memory)
        np.testing.assert_allclose(got, want, atol=ATOL)
        for a, b in zip(memory, want_memory.numpy()):
            np.testing.assert_allclose(a, b, atol=ATOL)
        want_memory = want_memory.numpy()
