"""The decode cache kept on the ONNX Runtime device (`device_cache`,
`export.device_cache`), exercised on the CPU provider: OrtValues, the step's
layer views bound by pointer, the ring's write in place, exactly what the
host cache does; the session table's slab in device buffers, and memories
handed from call to call, as well. On CUDA the same code runs with the
buffers in GPU memory (`TXL_DEVICE_TESTS=cuda` runs these tests there)."""
import contextlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from export import SessionTable, open_runtime
from export.decode_cache import SLOT_AXES
from export.device_cache import WRITE_INPUTS, WRITE_OUTPUTS, on_device, ring_write_model
from export.slab import DeviceSlab, slab_put_model, slab_take_model
from export.onnx_runtime import provider_entries
from export.parity import cached_outputs, core_outputs, max_differences, random_segments
from test_decode_cache_export import CONFIG, export_of_config, stop_and_go_on  # odd head sizes
from txl_tf.errors import TxlError


@pytest.fixture(scope="module")
def exported(built_once):
    return export_of_config(built_once)


# The device runtime's device: the CPU provider standing in for the GPU
# (`make test`), or `TXL_DEVICE_TESTS=cuda` on a GPU machine, where the same
# tests check the CUDA buffers, graphs and replays against the CPU's host cache.
DEVICE = os.environ.get("TXL_DEVICE_TESTS", "cpu")


@pytest.fixture(scope="module")
def runtimes(exported):
    path = str(exported[1] / "model.onnx")
    device = open_runtime(path, device=DEVICE, device_cache=True)
    assert device.device == DEVICE
    return open_runtime(path, device="cpu", device_cache=False), device


def test_device_cache_is_off_on_the_cpu_unless_asked_and_checks_its_setting(exported):
    path = str(exported[1] / "model.onnx")
    assert not open_runtime(path, device="cpu").device_cache
    with pytest.raises(TxlError, match="device_cache must be"):
        open_runtime(path, device="cpu", device_cache="yes")
    with pytest.raises(TxlError, match="needs io_binding"):
        open_runtime(path, device="cpu", device_cache=True, io_binding=False)


def test_cuda_runs_float32_matmuls_in_full_precision_unless_tf32_is_asked():
    names = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert provider_entries(names) == [("CUDAExecutionProvider", {"use_tf32": "0"}),
                                       "CPUExecutionProvider"]
    assert provider_entries(names, tf32=True)[0][1] == {"use_tf32": "1"}
    assert provider_entries(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_the_write_graph_is_valid_onnx_with_its_named_interface():
    model = ring_write_model(CONFIG.mem_len + 1)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == list(WRITE_INPUTS)
    assert [o.name for o in model.graph.output] == list(WRITE_OUTPUTS)


def test_a_device_step_is_a_step_on_the_memory_it_holds(exported, runtimes):
    """Token by token from a memory several segments deep (the ring wraps)."""
    core, (_, device) = exported[0], runtimes
    segments = random_segments(CONFIG.n_token, 3, 4, 5, seed=4)
    reference = core_outputs(core, segments, CONFIG.mem_len, token_by_token=True)
    diff = max_differences(reference, cached_outputs(device, segments))
    assert diff["log_probs"] < 1e-5 and diff["mems"] < 1e-5 and diff["mem_mask_equal"], diff


def assert_same_state(got, want, atol=1e-5):
    """Two decode caches (`got` on the device, `want` on the host) equal
    (within `atol`) in every tensor and slot but each row's own free slot
    (`row_slot`), which no read sees: where `decode_token` steps a stopped
    row, its token is written there (`ring_cache.write_slots`)."""
    free = np.asarray(want["row_slot"])
    rows_axis = {"cache_mems": 1, "keys": 1, "values": 1, "valid": 0}
    for name, value in want.items():
        a, b = np.array(got[name].numpy()), np.array(value)
        if name in SLOT_AXES:
            for row, slot in enumerate(free):
                for array in (a, b):
                    view = np.moveaxis(array, (rows_axis[name], SLOT_AXES[name]), (0, 1))
                    view[row, slot] = 0
        np.testing.assert_allclose(a, b, atol=atol, err_msg=name)


@pytest.mark.parametrize("replay", [False, True])
def test_the_device_ring_is_written_in_place_as_the_host_writes_it(exported, runtimes, replay):
    host = runtimes[0]
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=replay)
    rng = np.random.default_rng(1)
    _, memory = host.step(rng.integers(0, CONFIG.n_token, [3, 4]))
    host_cache, device_cache = host.decode_init(memory), device.decode_init(memory)
    assert on_device(device_cache) and not on_device(host_cache)
    names = ("cache_mems", "keys", "values", "valid")

    def buffers():
        return {name: device_cache[name].data_ptr() for name in names}
    own = buffers()
    own_values = {name: device_cache[name] for name in names}
    at_init = {name: np.array(value.numpy()) for name, value in own_values.items()}
    for t in range(2 * (CONFIG.mem_len + 1) + 1):  # the ring wraps twice
        ids = rng.integers(0, CONFIG.n_token, [3])
        stopped = np.array([False, t % 3 == 1, t > 6])
        want, _ = host.decode_step(ids, host_cache, stopped)
        got, same = device.decode_step(ids, device_cache, stopped)
        assert same is device_cache
        np.testing.assert_allclose(got[~stopped], want[~stopped], atol=1e-5)
        assert_same_state(device_cache, host_cache)  # decode_token: stopped rows' free slots
        first = buffers() if t == 0 else first
        assert buffers() == first, t  # every step in the same buffers
    # Replaying (CUDA graphs, or their fixed buffers on the CPU), the first step moved the
    # cache into the buffers the graphs were captured with (`device_cache.Resident`), once:
    # the buffers it left were not written again (a step does not move the cache in anew).
    assert device.cuda_graph == replay and (buffers() != own) == replay
    if replay:
        for name, value in own_values.items():
            np.testing.assert_array_equal(value.numpy(), at_init[name], err_msg=name)
    # The memory it holds (rows at different ring positions) is taken on the device.
    memory = device.cache_memory(device_cache)
    assert all(hasattr(value, "data_ptr") for value in memory)
    for got, want in zip(memory.numpy(), host.cache_memory(host_cache).numpy()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_device_read_and_copies_leave_the_cache_they_read(runtimes):
    host, device = runtimes
    segment = np.array([[3, 4, 5], [6, 7, 8]])
    host_cache = host.decode_init(host.initial_memory(2))
    device_cache = device.decode_init(device.initial_memory(2))
    for ids in ([1, 2], [3, 4]):
        host.decode_step(np.array(ids), host_cache)
        device.decode_step(np.array(ids), device_cache)
    kept = device.take(device_cache, [0, 1])
    want, host_new = host.decode_read(segment, host_cache)
    got, device_new = device.decode_read(segment, device_cache)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert on_device(device_new) and on_device(kept)
    for name in host_new:
        np.testing.assert_allclose(device_new[name].numpy(), host_new[name], atol=1e-5)
        np.testing.assert_array_equal(device_cache[name].numpy(), kept[name].numpy())
    rows = device.take(device_new, [1])
    np.testing.assert_array_equal(rows["keys"].numpy(), device_new["keys"].numpy()[:, 1:])
    joined = device.concat([rows, device.take(device_new, [0])])
    np.testing.assert_array_equal(joined["valid"].numpy(), device_new["valid"].numpy()[::-1])


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generation_and_a_next_turn_on_the_device_equal_the_hosts(runtimes, temperature):
    host, device = runtimes
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8], [9, 10]]
    want = host.generate(prompts, 12, temperature=temperature, seed=5)
    stop = int(want.ids[1, 3])
    want = host.generate(prompts, 12, temperature=temperature, seed=5, stop_ids=[stop])
    got = device.generate(prompts, 12, temperature=temperature, seed=5, stop_ids=[stop])
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_allclose(got.log_probs, want.log_probs, atol=1e-5)
    turns = [[11, 12], [13], [14, 15, 16]]
    want_turn = host.generate(turns, 6, resume=want.state, temperature=temperature, seed=6)
    got_turn = device.generate(turns, 6, resume=got.state, temperature=temperature, seed=6)
    np.testing.assert_array_equal(got_turn.ids, want_turn.ids)
    for a, b in zip(got_turn.memory.numpy(), want_turn.memory.numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_bad_device_cache_is_one_clear_error(runtimes):
    device = runtimes[1]
    cache = device.decode_init(device.initial_memory(2))
    short = {**cache, "keys": ort.OrtValue.ortvalue_from_numpy(
        cache["keys"].numpy()[:, :, :, :-1].copy())}
    with pytest.raises(ValueError, match="another model or memory length"):
        device.decode_step(np.array([1, 2]), short)
    with pytest.raises(ValueError, match="batch mismatch"):
        device.decode_step(np.array([1, 2, 3]), cache)


def _ortvalue(array):
    return ort.OrtValue.ortvalue_from_numpy(np.array(array, order="C"), DEVICE, 0)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(keys=_ortvalue(c["keys"].numpy()[:, :, :, :-1])),
     "another model or memory length"),
    (lambda c: c.update(values=_ortvalue(c["values"].numpy().astype(np.float64))), "float32"),
    (lambda c: c.update(valid=_ortvalue(c["valid"].numpy().astype(np.int32))), "must be bool"),
    (lambda c: c.update(slot=_ortvalue(np.array(99, np.int32))), "slot must lie"),
    (lambda c: c.update(row_slot=_ortvalue(np.array([0, -1], np.int32))), "row_slot must lie"),
    (lambda c: c.pop("cache_mems"), "missing"),
])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_stepped_device_cache_is_checked_again_where_its_tensors_change(
        exported, cuda_graph, change, message):
    """A device cache's checks are remembered from step to step, and a
    tensor swapped in its dict since (the caller's) is checked again."""
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=cuda_graph)
    cache = device.decode_init(device.initial_memory(2))
    for _ in range(3):
        device.decode_step(np.array([1, 2]), cache)
    with pytest.raises(ValueError, match="batch mismatch"):
        device.decode_step(np.array([1, 2, 3]), cache)
    change(cache)
    with pytest.raises(ValueError, match=message):
        device.decode_step(np.array([1, 2]), cache)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_device_cache_whose_valid_flags_are_swapped_is_checked_whole(exported, cuda_graph):
    """`valid` holds the batch the other tensors are checked against: once
    it is swapped, a call without ids (`cache_memory`, `take`) checks them
    all again, and no later step takes the cache for one of the new batch."""
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=cuda_graph)
    cache = device.decode_init(device.initial_memory(2))
    for _ in range(2):
        device.decode_step(np.array([1, 2]), cache)
    other = device.decode_init(device.initial_memory(3))
    cache["valid"] = other["valid"]
    for _ in range(2):
        with pytest.raises(ValueError, match="another model or memory length"):
            device.cache_memory(cache)
    with pytest.raises(ValueError, match="another model or memory length"):
        device.decode_step(np.array([1, 2, 3]), cache)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_device_step_checks_only_the_cache_tensors_that_changed(exported, monkeypatch,
                                                                   cuda_graph):
    """What `decode_step` checks of a device cache: all of it at first, then
    only the tensors it holds anew (a `Resident`'s buffers once, the ring
    positions a step without CUDA graphs replaces), and its ring positions
    only where the host did not move them on itself."""
    import export.runtime as runtime_module
    checked, positions_checked = [], []

    def check_decode_cache(cache, shapes, *args):
        checked.append(sorted(shapes))
        return real(cache, shapes, *args)

    def check_ring_positions(positions, size):
        positions_checked.append(positions.slot)
        return real_positions(positions, size)
    real, real_positions = runtime_module.check_decode_cache, runtime_module.check_ring_positions
    monkeypatch.setattr(runtime_module, "check_decode_cache", check_decode_cache)
    monkeypatch.setattr(runtime_module, "check_ring_positions", check_ring_positions)
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=cuda_graph)
    cache = device.decode_init(device.initial_memory(2))
    everything = sorted(["cache_mems", "keys", "values", "valid", "slot", "row_slot",
                         "positions"])
    for _ in range(4):
        device.decode_step(np.array([1, 2]), cache)
    if cuda_graph:  # the cache moved into the fixed buffers at its first step
        assert checked == [everything, everything]
    else:  # decode_token hands back new slot and row_slot each step
        assert checked == [everything] + [["row_slot", "slot", "valid"]] * 3
    assert len(positions_checked) == 1


@pytest.mark.parametrize("where", ["step", "realign"])
def test_an_interrupt_once_the_device_moved_the_ring_leaves_the_positions_right(
        exported, monkeypatch, where):
    """Ctrl-C as a step over the fixed buffers returns (the ring moved on on
    the device), or once a row that stopped was rotated back onto the shared
    slot: the host does not keep the positions from before, so that row
    goes on from its own memory (`stop_and_go_on`'s)."""
    import export.onnx_runtime as onnx_runtime
    from export.device_cache import FixedStep
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=True)
    rng, n_token = np.random.default_rng(0), device.n_token
    cache = device.decode_init(device.initial_memory(3))
    for _ in range(4):
        device.decode_step(rng.integers(0, n_token, 3), cache)
    alone, others = device.take(cache, [1]), device.take(cache, [0, 2])
    tokens, stopped = rng.integers(0, n_token, [4, 3]), np.array([False, True, False])

    def interrupt_after(owner, name):  # its next call is made, then the interrupt
        real = getattr(owner, name)

        def once(*args):
            real(*args)
            monkeypatch.setattr(owner, name, real)
            raise KeyboardInterrupt
        monkeypatch.setattr(owner, name, once)
    device.decode_step(tokens[0], cache, stopped)
    if where == "step":
        interrupt_after(FixedStep, "write")
        with pytest.raises(KeyboardInterrupt):
            device.decode_step(tokens[1], cache, stopped)
    else:
        device.decode_step(tokens[1], cache, stopped)
    device.decode_step(tokens[2], cache, stopped)
    if where == "realign":
        interrupt_after(onnx_runtime, "put_row")
        with pytest.raises(KeyboardInterrupt):
            device.decode_step(tokens[3], cache)
    got, _ = device.decode_step(tokens[3], cache)
    for token in tokens:
        want_others, _ = device.decode_step(token[[0, 2]], others)
    np.testing.assert_allclose(got[[0, 2]], want_others, atol=1e-5)
    want, read = device.decode_read(tokens[3, 1:2, None], alone)
    np.testing.assert_allclose(got[1:2], want, atol=1e-5)
    for a, b in zip(device.cache_memory(device.take(cache, [1])).numpy(),
                    device.cache_memory(read).numpy()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_replayed_step_sends_the_stopped_flags_only_when_they_change(exported, monkeypatch):
    """On the fixed buffers every step writes its ids, and the stopped flags
    only when they differ from the last step's (on a GPU each is a copy)."""
    device = open_runtime(str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
                          cuda_graph=True)
    cache = device.decode_init(device.initial_memory(2))
    device.decode_step(np.array([1, 2]), cache)
    sent, update = [], ort.OrtValue.update_inplace

    def counted(value, array):
        sent.append(np.asarray(array).dtype)
        return update(value, array)
    monkeypatch.setattr(ort.OrtValue, "update_inplace", counted)
    for stopped in ([0, 0], [0, 0], [1, 0], [1, 0], [0, 0]):
        device.decode_step(np.array([1, 2]), cache, stopped=np.array(stopped, bool))
    ids, flags = np.dtype(np.int32), np.dtype(np.bool_)
    assert sent == [ids, ids, ids, flags, ids, ids, flags]


def test_a_session_table_on_the_device_slab_equals_the_hosts_and_keeps_the_slab_there(
        runtimes, host_copies):
    """Sessions of mixed lengths join, leave and reset; every step reads and
    writes the slab's device buffers in place, and only log-probs (and the
    ring positions of a session joining or leaving) come to the host."""
    host, device = runtimes
    tables = [SessionTable(runtime, max_batch=2) for runtime in runtimes]
    assert isinstance(tables[1].slab, DeviceSlab) and not isinstance(tables[0].slab, DeviceSlab)
    opened = {"a": ([1, 2, 3], 9, dict(temperature=0.9, seed=4)), "b": ([4], 11, {}),
              "c": ([5, 6, 7, 8, 9, 10, 11], 7, dict(temperature=1.2, top_k=5, seed=2))}
    for table in tables:
        for key, (prompt, n, settings) in opened.items():
            table.open(key, prompt, n, **settings)
    buffers, steps = None, 0
    while tables[0].active():
        if steps == 4:
            for table in tables:
                table.reset("b", [12, 13, 14], max_new_tokens=5)
        want = tables[0].step()
        host_copies.clear()
        got = tables[1].step()
        assert got == want, steps
        # the log-probs of up to 2 rows; a joining or leaving row's ring positions
        assert set(host_copies) <= {(), (1,), (1, CONFIG.n_token), (2, CONFIG.n_token)}, \
            host_copies
        now = {name: value.data_ptr() for name, value in tables[1].slab._tensors.items()}
        assert buffers in (None, now)  # in place: the same buffers at every step
        buffers, steps = now, steps + 1
    assert not tables[1].active() and steps > 8
    for key in opened:
        want, got = (table.close(key) for table in tables)
        np.testing.assert_allclose(got.log_probs, want.log_probs, atol=1e-5)
        assert on_device(got.state.cache.tensors)
        for a, b in zip(got.memory.numpy(), want.memory.numpy()):
            np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("other_way", [False, True])
def test_a_row_that_stopped_goes_on_on_the_device_reading_no_ring_position(
        exported, runtimes, host_copies, other_way):
    """As on the host (tests/test_decode_cache_export.py), by the device step
    and over the fixed buffers that CUDA graphs replay (the device's own way
    and the other); the host knows where each row's ring stands, so the
    steps copy only their log-probs out."""
    runtime = runtimes[1] if not other_way else open_runtime(
        str(exported[1] / "model.onnx"), device=DEVICE, device_cache=True,
        cuda_graph=not runtimes[1].cuda_graph)
    copies = []

    @contextlib.contextmanager
    def watch():
        host_copies.clear()
        yield
        copies.extend(host_copies)
    stop_and_go_on(runtime, watch)
    assert set(copies) <= {(3, CONFIG.n_token)}, copies


def test_a_memory_stays_in_the_runtimes_tensors_from_call_to_call_and_equals_numpys(
        runtimes, host_copies):
    """`step`, `score`, `take` and `generate(memory=)` take and return the
    memory as OrtValues on the runtime's device: fed from one call to the
    next it is never copied to numpy, and every result equals the numpy
    path's. On the device path (forced here) rows of a memory are taken and
    joined there (prompts of mixed lengths) and a score brings only the nll
    to the host."""
    rng = np.random.default_rng(3)
    segments = [rng.integers(0, CONFIG.n_token, [2, 4]) for _ in range(3)]
    prompts = [[1, 2], [3, 4, 5]]
    memory_shapes = {(CONFIG.n_layer, 2, CONFIG.mem_len, CONFIG.d_model), (2, CONFIG.mem_len)}
    for runtime in runtimes:
        numpy_memory = runtime.initial_memory(2).numpy()
        for ids in segments[:2]:
            want_log_probs, numpy_memory = runtime.step(ids, numpy_memory)
            numpy_memory = numpy_memory.numpy()
        want_nll, numpy_memory = runtime.score(segments[2][:, :-1], segments[2][:, 1:],
                                               numpy_memory)
        numpy_memory = numpy_memory.numpy()
        want = runtime.generate(prompts, 6, memory=numpy_memory, temperature=0.0)
        host_copies.clear()
        memory = runtime.initial_memory(2)
        for ids in segments[:2]:
            log_probs, memory = runtime.step(ids, memory)
        nll, memory = runtime.score(segments[2][:, :-1], segments[2][:, 1:], memory)
        assert not memory_shapes & set(host_copies), host_copies
        if not runtime.device_cache:  # numpy takes rows on the CPU (a view of the buffer)
            continue
        assert (2, 3, CONFIG.n_token) not in host_copies  # the score's log-probs
        swapped = runtime.take(memory, [1, 0])
        got = runtime.generate(prompts, 6, memory=memory, temperature=0.0)
        assert not memory_shapes & set(host_copies), host_copies
        for value in (*memory, *swapped, *got.memory):
            assert hasattr(value, "data_ptr")
        np.testing.assert_allclose(log_probs, want_log_probs, atol=1e-6)
        np.testing.assert_allclose(nll, want_nll, atol=1e-6)
        for a, b, c in zip(memory.numpy(), numpy_memory, swapped.numpy()):
            np.testing.assert_allclose(a, b, atol=1e-6)
            np.testing.assert_array_equal(c, a[:, ::-1] if a.ndim == 4 else a[::-1])
        np.testing.assert_array_equal(got.ids, want.ids)
        for a, b in zip(got.memory.numpy(), want.memory.numpy()):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_memories_are_joined_on_the_device_with_a_graph_per_power_of_two(runtimes):
    """`concat` of 1 to 7 memories (of 1 or 2 rows) on the device is numpy's
    join, and opens join graphs of 1, 2 and 4 memories only, not one per count."""
    device = runtimes[1]
    rng = np.random.default_rng(4)
    memories = [device.step(rng.integers(0, CONFIG.n_token, [1 + i % 2, 3]))[1]
                for i in range(7)]
    for count in range(1, 8):
        got = device.concat(memories[:count]).numpy()
        for part, axis in ((0, 1), (1, 0)):
            np.testing.assert_array_equal(got[part], np.concatenate(
                [memory.numpy()[part] for memory in memories[:count]], axis))
    assert sorted(key[1] for key in device._small_graphs if key[0] == "concat") == [1, 2, 4]


# Inputs that ONNX Runtime's CUDA kernels read in host memory (shapes, axes, starts).
HOST_INPUTS = {"Reshape": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}, "ConstantOfShape": {0},
               "Tile": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "ReduceSum": {1},
               "ReduceMean": {1}, "ReduceMax": {1}, "Split": {1}, "TopK": {1},
               "Range": {0, 1, 2}, "Pad": {1, 2, 3}}


def crossings(graph):
    """Where a value would cross between the host and the GPU inside
    `graph` (ONNX Runtime adds a Memcpy node, and a CUDA graph cannot be
    captured): a value computed from shapes used as data, or a data value
    (a graph input's) used as a shape."""
    constant = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output}
    from_shapes = set()
    for node in graph.node:  # in topological order
        inputs = [i for i in node.input if i and i not in constant]
        if node.op_type == "Shape" or (inputs and all(i in from_shapes for i in inputs)):
            from_shapes.update(node.output)
    found = []
    for node in graph.node:
        if all(o in from_shapes for o in node.output):
            continue
        host = HOST_INPUTS.get(node.op_type, set())
        for position, name in enumerate(node.input):
            if name in from_shapes and position not in host:
                found.append(f"{node.name}: shape-derived {name} used as data")
            if position in host and name and name not in constant and name not in from_shapes:
                found.append(f"{node.name}: data {name} used as a host input")
    return found


def test_the_step_and_the_write_graphs_keep_every_value_on_its_device(exported):
    """What lets ONNX Runtime capture the step as a CUDA graph (it refused
    the step with `tf.zeros_like` and a slice starting at `slot`); the
    slab's row graphs keep their values on the device too."""
    step = onnx.load(str(exported[1] / "decode_step.onnx")).graph
    assert crossings(step) == []
    assert crossings(ring_write_model(CONFIG.mem_len + 1).graph) == []
    for model in (slab_put_model(CONFIG.mem_len + 1), slab_take_model()):
        onnx.checker.check_model(model, full_check=True)
        assert crossings(model.graph) == []
    # The check does find such a crossing: the model's own step graph slices
    # its memory at a data-dependent start.
    assert crossings(onnx.load(str(exported[1] / "model.onnx")).graph)


def test_replayed_steps_keep_one_cache_in_fixed_buffers_and_equal_the_hosts(exported, runtimes):
    """`cuda_graph`: the fixed-buffer path CUDA graphs replay, run on the CPU
    (no capture there). Two caches of one batch size take turns in the
    fixed buffers, a third of another batch size gets its own."""
    host = runtimes[0]
    path = str(exported[1] / "model.onnx")
    replay = open_runtime(path, device="cpu", device_cache=True, cuda_graph=True)
    assert not open_runtime(path, device="cpu", device_cache=True).cuda_graph
    with pytest.raises(TxlError, match="needs the decode cache on the device"):
        open_runtime(path, device="cpu", device_cache=False, cuda_graph=True)
    rng = np.random.default_rng(2)
    batches = (3, 3, 2)
    memories = [host.step(rng.integers(0, CONFIG.n_token, [batch, 4]))[1] for batch in batches]
    host_caches = [host.decode_init(m) for m in memories]
    replay_caches = [replay.decode_init(m) for m in memories]
    for t in range(2 * (CONFIG.mem_len + 1) + 1):
        for k in (0, 1, 2, 1, 0):
            batch = batches[k]
            ids = rng.integers(0, CONFIG.n_token, [batch])
            stopped = np.arange(batch) == t % 4
            want, _ = host.decode_step(ids, host_caches[k], stopped)
            got, _ = replay.decode_step(ids, replay_caches[k], stopped)
            np.testing.assert_allclose(got[~stopped], want[~stopped], atol=1e-5)
    for host_cache, replay_cache in zip(host_caches, replay_caches):
        assert_same_state(replay_cache, host_cache)
        for a, b in zip(replay.cache_memory(replay_cache).numpy(),
                        host.cache_memory(host_cache).numpy()):
            np.testing.assert_allclose(a, b, atol=1e-5)
    assert len(replay._residents) == 2  # one set of fixed buffers per batch size
    prompts = [[1, 2, 3], [4], [5, 6]]
    want = host.generate(prompts, 8, temperature=0.9, seed=3)
    got = replay.generate(prompts, 8, temperature=0.9, seed=3)
    np.testing.assert_array_equal(got.ids, want.ids)
    turn = [[7], [8, 9], [10]]
    np.testing.assert_array_equal(
        replay.generate(turn, 5, resume=got.state, temperature=0.0).ids,
        host.generate(turn, 5, resume=want.state, temperature=0.0).ids)


@pytest.mark.parametrize("k, after", [(1, False), (1, True), (2, False), (2, True)])
def test_a_cache_interrupted_moving_into_the_fixed_buffers_leaves_the_other_as_it_was(
        exported, runtimes, monkeypatch, k, after):
    """Ctrl-C in `Resident._take` as cache `b` moves in (its k-th copy:
    `a` out, then `b` in; before or after it): `b`'s step run again and
    `a`'s next steps are the host's (`a` was read from `b`'s buffers)."""
    import export.device_cache as device_cache
    host, path = runtimes[0], str(exported[1] / "model.onnx")
    replay = open_runtime(path, device="cpu", device_cache=True, cuda_graph=True)
    rng = np.random.default_rng(4)
    memories = [host.step(rng.integers(0, CONFIG.n_token, [2, 4]))[1] for _ in range(2)]
    host_caches = [host.decode_init(m) for m in memories]
    caches = [replay.decode_init(m) for m in memories]
    ids = rng.integers(0, CONFIG.n_token, [2])
    np.testing.assert_allclose(replay.decode_step(ids, caches[0])[0],
                               host.decode_step(ids, host_caches[0])[0], atol=1e-5)
    original, calls = device_cache.copy_on_device, [0]

    def interrupted(*args):
        calls[0] += 1
        if calls[0] == k and not after:
            raise KeyboardInterrupt
        original(*args)
        if calls[0] == k:
            raise KeyboardInterrupt
    monkeypatch.setattr(device_cache, "copy_on_device", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replay.decode_step(ids, caches[1])
    monkeypatch.undo()
    for i in (1, 0, 1, 0):
        np.testing.assert_allclose(replay.decode_step(ids, caches[i])[0],
                                   host.decode_step(ids, host_caches[i])[0], atol=1e-5,
                                   err_msg=i)


def test_the_log_probs_of_a_fixed_buffer_step_are_not_changed_by_the_next(exported):
    """The log-probs `decode_step` returns, and those a session that left a
    slab keeps, are the caller's own: later steps over the same fixed
    buffers (a `Resident`, a `DeviceSlab` of the same size) leave them."""
    path = str(exported[1] / "model.onnx")
    replay = open_runtime(path, device=DEVICE, device_cache=True, cuda_graph=True)
    cache = replay.decode_init(replay.initial_memory(2))
    first, cache = replay.decode_step([1, 2], cache)
    kept = first.copy()
    replay.decode_step([3, 4], cache)
    np.testing.assert_array_equal(first, kept)
    table = SessionTable(replay, max_batch=2)
    table.open("a", [1, 2, 3], 2, temperature=0.9, seed=3)
    table.open("b", [4], 9, seed=1)
    table.step(), table.step()  # "a" used its budget and left
    table.open("c", [5, 6], 9, seed=2)
    table.step(), table.step()  # two rows again, over the buffers "a" was read from
    rest = replay.generate(None, 3, resume=table.close("a").state)
    alone = replay.generate([[1, 2, 3]], 5, temperature=0.9, seed=3)
    np.testing.assert_allclose(rest.log_probs[0], alone.log_probs[0, 2:], atol=1e-6)


def test_an_export_whose_step_cannot_be_captured_decodes_without_graphs(exported, runtimes,
                                                                         monkeypatch, caplog):
    """Exports made before the step kept every value on the GPU: ONNX
    Runtime refuses their graphs, and the runtime goes on without them;
    where only `decode_token` is refused, it replays the step and the
    ring's write."""
    from txl_tf.errors import ModelDirError
    path = str(exported[1] / "model.onnx")
    want = runtimes[0].generate([[1, 2], [3]], 6, temperature=0.0).ids
    for refused in ({True, False}, {True}):
        replay = open_runtime(path, device="cpu", device_cache=True, cuda_graph=True)
        opened, tried = replay._open_replay, []

        def refuse(token=True, opened=opened, tried=tried, refused=refused):
            tried.append(token)
            if token in refused:
                raise ModelDirError("cannot open the ONNX model: graph capture refused")
            return opened(token=token)
        monkeypatch.setattr(replay, "_open_replay", refuse)
        caplog.clear()
        with caplog.at_level("WARNING"):
            got = replay.generate([[1, 2], [3]], 6, temperature=0.0)
        assert tried == [True, False] and "decode_token is not captured" in caplog.text
        assert replay.cuda_graph == (refused == {True}), refused
        if replay.cuda_graph:
            assert "step" in replay._replay_sessions and "token" not in replay._replay_sessions
        else:
            assert "without CUDA graphs" in caplog.text
        np.testing.assert_array_equal(got.ids, want)


def test_token_parts_time_the_fixed_steps_parts_and_only_where_they_run(exported, runtimes):
    """`benchmarks.long_memory.time_token_parts`: each part of a replayed
    step timed on its own, the host's share what the graphs leave of the
    token, and nothing where the steps do not run over fixed buffers."""
    from benchmarks.long_memory import TOKEN_PARTS, time_token_parts
    host = runtimes[0]
    path = str(exported[1] / "model.onnx")
    replay = open_runtime(path, device=DEVICE, device_cache=True, cuda_graph=True)
    memory = host.step(np.random.default_rng(3).integers(0, CONFIG.n_token, [2, 5]))[1]
    memory = (np.asarray(memory.mems), np.asarray(memory.mem_mask))
    parts = time_token_parts(replay, memory, 2, 5)["token_parts"]
    assert list(parts) == list(TOKEN_PARTS)
    assert all(parts[name] > 0 for name in ("step_graph", "read", "write", "token"))
    assert parts["host"] == pytest.approx(parts["token"] - parts["step_graph"] - parts["write"])
    unreplayed = open_runtime(path, device=DEVICE, device_cache=True, cuda_graph=False)
    assert time_token_parts(unreplayed, memory, 2, 5) == {}  # steps without fixed buffers
