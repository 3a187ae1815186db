"""The decode cache on the runtime's device (`OnnxRuntime` with
`device_cache`): its tensors in OrtValues, the ring's write and the memory
it holds as small ONNX graphs, the decode graphs bound to it, and graph
replay over fixed buffers. The names, shapes and the host's half of a step
are `export.decode_cache`'s.

* The device ring: on a GPU the cache lives in device memory (OrtValues) and
  the ring's write must run there too, or every step would copy the whole
  cache across the bus. `ring_write_model` builds that write as a small ONNX
  graph: for the rows not stopped, the token's layer input, keys and values
  go into the free slot of `cache_mems`, `keys` and `values`
  (ScatterElements along the slot axis), `valid` is set there, `row_slot`
  and `slot` move on; what `write_token` does on the host, for the same
  layout (`cache_shapes`). The runtime binds each ring's output to the
  ring's own buffer; ONNX Runtime's ScatterElements copies its input to its
  output only when the two are different buffers, so the write touches one
  slot, not the cache (`tests/test_device_ring.py` checks the buffers stay
  in place; `tests/test_ring_backends.py` that the TensorFlow, host and
  device rings agree). Built with `onnx.helper` at run time; `onnx` is
  needed only where the cache is kept on the device. `ring_memory_model`
  takes the memory a cache holds there too (`cache_memory`); `device_step`,
  `write_on_device` and `run_on_device` drive the decode graphs on such a
  cache (`export.onnx_runtime.OnnxRuntime` with `device_cache`).
* Where each row stands (`RingPositions`): a `DeviceCache` keeps it on the
  host, moved on by each step from the flags the host hands it, so checking
  it reads nothing from the device.
* Graph replay (ONNX Runtime, `cuda_graph`): a device step launches about a
  thousand small kernels; replayed as a CUDA graph it costs much less
  (benchmarks/NOTES.md §5). A captured graph is tied to the buffers it was
  captured with, so the runtime keeps one `Resident` per batch size: the
  cache's tensors, the step's ids, flags and outputs at fixed addresses,
  bound once. The cache being stepped lives in those buffers (its dict
  points at them); when another cache of that batch size steps, the
  resident one gets its own buffers back, with its state, and the new one
  is copied in (two device copies of the cache). So a decode loop replays
  the same two graphs (`decode_token`, the step that writes the ring in
  place, and the copy of the moved ring positions; for an export made
  before it, three: the step, the ring's write, the copy) token after
  token, and a server holds one captured set per batch size, not one per
  conversation. The three graphs over fixed
  buffers are a `FixedStep`, which also steps the first rows of a slab's
  buffers in place (`export.slab.DeviceSlab`). On the CPU provider
  the same fixed-buffer path runs without a capture (that is how the tests
  exercise it).
"""
import itertools

import numpy as np

from export.decode_cache import CACHE_NAMES, SLOT_AXES, STEP_OUTPUTS


# ---------------------------------------------------------- the device ring
# (ring, the token output of `decode_step` written into it, the ring's rank)
RINGS = (("cache_mems", "token_mems", 4), ("keys", "token_keys", 5),
         ("values", "token_values", 5))
WRITE_INPUTS = ("cache_mems", "keys", "values", "valid", "row_slot", "slot",
                "token_mems", "token_keys", "token_values", "stopped")
WRITE_OUTPUTS = ("new_cache_mems", "new_keys", "new_values", "new_valid", "new_row_slot",
                 "new_slot")
# The outputs written into their input's buffer.
IN_PLACE = ("cache_mems", "keys", "values", "valid")
OPSET = 17


def small_model(nodes, name, inputs, outputs):
    """An ONNX `ModelProto` of the graph `name` (`onnx.helper` nodes and
    value infos) at this module's opset: the small graphs run beside the
    exported ones."""
    from onnx import helper
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs),
                              opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="txl_tf")
    model.ir_version = 8
    return model


def with_cache_dtype(model, cache_dtype):
    """`model`, a small graph built for float32 keys and values, with its
    inputs and outputs of keys and values (`keys`, `token_values`,
    `new_keys`, ...) in `cache_dtype` (the export's `ExportInfo.cache_dtype`)."""
    from onnx import helper
    if np.dtype(cache_dtype) != np.float32:
        elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(cache_dtype))
        for value in list(model.graph.input) + list(model.graph.output):
            if value.name.rsplit("_", 1)[-1] in ("keys", "values"):
                value.type.tensor_type.elem_type = elem_type
    return model


def ring_write_model(size):
    """The ONNX `ModelProto` of the ring's write for a ring of `size` slots
    (inputs `WRITE_INPUTS`, outputs `WRITE_OUTPUTS`; the batch, the other
    sizes and the layer count are read from the inputs' shapes). The size is
    a constant, not read from a shape: shape arithmetic feeding the data
    would make ONNX Runtime copy it across the bus (a Memcpy node)."""
    from onnx import TensorProto, helper

    nodes, inputs = [], []

    def node(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    def const(name, values, dtype=TensorProto.INT64):
        """A constant: a 1-D int64 list, or an int32 scalar."""
        shape = [len(values)] if isinstance(values, list) else []
        nodes.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name, dtype, shape, values if shape else [values])))
        return name

    float_t, bool_t, int_t = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT32
    for ring, token, rank in RINGS:
        inputs.append(helper.make_tensor_value_info(ring, float_t, [None] * rank))
        inputs.append(helper.make_tensor_value_info(token, float_t, [None] * (rank - 1)))
    inputs += [helper.make_tensor_value_info("valid", bool_t, [None, None]),
               helper.make_tensor_value_info("row_slot", int_t, [None]),
               helper.make_tensor_value_info("slot", int_t, []),
               helper.make_tensor_value_info("stopped", bool_t, [None])]
    # The stopped flags shaped to broadcast over a ring: [1, B, 1, ...].
    for rank in sorted({rank for _, _, rank in RINGS}):
        node("Reshape", ["stopped", const(f"row_shape_{rank}", [1, -1] + [1] * (rank - 2))],
             f"stopped_{rank}")
    for ring, token, rank in RINGS:
        _write_slot(node, const, ring, token, f"stopped_{rank}", rank, SLOT_AXES[ring])
    # valid[b, slot] |= not stopped[b]
    node("Not", ["stopped"], "live")
    _write_slot(node, const, "valid", "live", None, 2, SLOT_AXES["valid"])
    # slot and each live row's own free slot move on, modulo the ring's size.
    node("Add", ["slot", const("one", 1, int_t)], "slot_plus_one")
    node("Mod", ["slot_plus_one", const("size", int(size), int_t)], "new_slot")
    node("Where", ["stopped", "row_slot", "new_slot"], "new_row_slot")

    outputs = [helper.make_tensor_value_info(f"new_{ring}", float_t, [None] * rank)
               for ring, _, rank in RINGS]
    outputs += [helper.make_tensor_value_info("new_valid", bool_t, [None, None]),
                helper.make_tensor_value_info("new_row_slot", int_t, [None]),
                helper.make_tensor_value_info("new_slot", int_t, [])]
    order = {name: i for i, name in enumerate(WRITE_INPUTS)}
    inputs.sort(key=lambda value: order[value.name])
    return small_model(nodes, "txl_ring_write", inputs, outputs)


def ring_memory_model(size):
    """The ONNX `ModelProto` of the memory a cache of `size` slots holds, in
    time order, computed where the cache is: inputs `cache_mems`, `valid`,
    `row_slot`; outputs `mems` `[L, B, size - 1, d]` and `mem_mask`
    `[B, size - 1]` (what `Runtime.cache_memory` computes on the host).
    Row b's slots `row_slot[b] + 1, ..., + size - 1` (mod size), oldest
    first, gathered by their (row, slot) coordinates (the rows counted from
    the slots, not read from a shape): onnxruntime's `symbolic_shape_infer`
    gives a GatherND with `batch_dims` the wrong shape."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    span = numpy_helper.from_array(np.arange(1, size, dtype=np.int32)[None, :], "span")
    nodes = [
        helper.make_node("Constant", [], ["span_value"], value=span),
        helper.make_node("Constant", [], ["size"], value=helper.make_tensor(
            "size", TensorProto.INT32, [], [int(size)])),
        helper.make_node("Constant", [], ["column"], value=helper.make_tensor(
            "column", TensorProto.INT64, [1], [-1])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor(
            "one", TensorProto.INT64, [], [1])),
        helper.make_node("Constant", [], ["rows_axis"], value=helper.make_tensor(
            "rows_axis", TensorProto.INT64, [], [0])),
        helper.make_node("Unsqueeze", ["row_slot", "column"], ["row_start"]),
        helper.make_node("Add", ["row_start", "span_value"], ["shifted"]),
        helper.make_node("Mod", ["shifted", "size"], ["order_32"]),
        helper.make_node("Cast", ["order_32"], ["order"], to=TensorProto.INT64),
        helper.make_node("GatherElements", ["valid", "order"], ["mem_mask"], axis=1),
        # rows first, to gather each row's slots: [B, S, L, d] -> [B, M, L, d]
        helper.make_node("Transpose", ["cache_mems"], ["by_row"], perm=[1, 2, 0, 3]),
        # Each slot's row: 1 + (a running count of ones down the rows) - 1.
        helper.make_node("Mul", ["order", "rows_axis"], ["zeros"]),
        helper.make_node("Add", ["zeros", "one"], ["ones"]),
        helper.make_node("CumSum", ["ones", "rows_axis"], ["counted"]),
        helper.make_node("Sub", ["counted", "one"], ["rows"]),
        helper.make_node("Unsqueeze", ["rows", "column"], ["rows_nd"]),
        helper.make_node("Unsqueeze", ["order", "column"], ["order_nd"]),
        helper.make_node("Concat", ["rows_nd", "order_nd"], ["coordinates"], axis=-1),
        helper.make_node("GatherND", ["by_row", "coordinates"], ["gathered"]),
        helper.make_node("Transpose", ["gathered"], ["mems"], perm=[2, 0, 1, 3]),
    ]
    return small_model(
        nodes, "txl_ring_memory",
        [helper.make_tensor_value_info("cache_mems", TensorProto.FLOAT, [None] * 4),
         helper.make_tensor_value_info("valid", TensorProto.BOOL, [None, None]),
         helper.make_tensor_value_info("row_slot", TensorProto.INT32, [None])],
        [helper.make_tensor_value_info("mems", TensorProto.FLOAT, [None] * 4),
         helper.make_tensor_value_info("mem_mask", TensorProto.BOOL, [None, None])])


def _write_slot(node, const, ring, token, stopped, rank, axis):
    """Nodes writing `token` (the ring's shape without the slot axis) into
    `ring`'s free slot, rows in `stopped` (shaped to broadcast over the
    ring) keeping their old value; with `stopped` None, a bool ring `or`
    `token` there (ONNX Runtime has no Where on bools). The result is the
    graph's output `new_{ring}` itself (no copy after it)."""
    node("Unsqueeze", [token, const(f"{ring}_axis", [axis])], f"{ring}_update_new")
    node("Shape", [f"{ring}_update_new"], f"{ring}_update_shape")
    node("Reshape", ["slot", const(f"{ring}_ones", [1] * rank)], f"{ring}_slot")
    node("Expand", [f"{ring}_slot", f"{ring}_update_shape"], f"{ring}_index")
    node("GatherElements", [ring, f"{ring}_index"], f"{ring}_old", axis=axis)
    if stopped is None:
        node("Or", [f"{ring}_old", f"{ring}_update_new"], f"{ring}_update")
    else:
        node("Where", [stopped, f"{ring}_old", f"{ring}_update_new"], f"{ring}_update")
    node("ScatterElements", [ring, f"{ring}_index", f"{ring}_update"], f"new_{ring}",
         axis=axis)


# ------------------------------------------------------- driving the graphs
NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
               "tensor(bool)": np.bool_, "tensor(int32)": np.int32}


def ortvalue(array, device):
    """An OrtValue of `array` on `device` ("cpu": over the array's buffer)."""
    import onnxruntime as ort
    # Not np.ascontiguousarray: it turns a scalar (the ring's slot) into [1].
    return ort.OrtValue.ortvalue_from_numpy(np.asarray(array, order="C"), device, 0)


def is_ortvalue(value):
    return hasattr(value, "data_type") and hasattr(value, "data_ptr")


def on_device(cache):
    """Whether a decode cache is held in OrtValues (`device_cache`), not numpy."""
    return is_ortvalue(cache["keys"])


class DeviceCache(dict):
    """A decode cache in OrtValues on the runtime's device (`OnnxRuntime`
    with `device_cache`) that knows its ring positions on the host: set
    where they are known (a cache made from host arrays, one read once),
    moved on by each step from the `stopped` flags the host hands it
    (`RingPositions.advanced`). So a step checks its rows (is any row that
    stopped going on?) without reading the device. They count only while
    the cache's `slot` and `row_slot` are the OrtValues they were set with:
    a cache whose tensors were swapped (a `Resident` giving it other
    buffers, a caller's assignment) has none until they are read again."""

    def __init__(self, tensors, positions=None):
        super().__init__(tensors)
        self._checked = None  # `mark_checked`'s
        self.remember(positions)

    def remember(self, positions, checked=False):
        """Sets the ring positions the cache's tensors hold now (None:
        unknown); `checked`: they lie in the ring (checked, or moved on by
        the host from positions that were)."""
        self._known = (self["slot"], self["row_slot"], positions, bool(checked))

    def known_positions(self):
        """The `RingPositions` the cache holds, or None where the host does not know them."""
        slot, row_slot, positions, _ = self._known
        return positions if slot is self["slot"] and row_slot is self["row_slot"] else None

    def positions_checked(self):
        """Whether the host knows the ring positions and they were checked."""
        return self._known[3] and self.known_positions() is not None

    def mark_checked(self, shapes, batch):
        """Records that the cache's tensors, as they are now, passed the
        checks of a runtime whose expected shapes are `shapes` (that dict,
        compared by identity), with `batch` rows."""
        self._checked = (shapes, batch, {name: self.get(name) for name in shapes})

    def unchecked(self, shapes):
        """`(batch, names)`: the batch of the last `mark_checked` against
        `shapes` and the names of `shapes` whose tensors the cache no longer
        holds (an OrtValue's shape and type never change: only those need
        checking again); `(None, all of them)` where there was none."""
        if self._checked is None or self._checked[0] is not shapes:
            return None, tuple(shapes)
        _, batch, tensors = self._checked
        return batch, tuple(name for name, value in tensors.items() if self.get(name) is not value)


def run_on_device(session, device, inputs, into=None, in_place=()):
    """`{output: OrtValue}` of `session` on `device`. `inputs` are OrtValues
    (bound as they are) or arrays (copied to the device); outputs named in
    `into` are written into those numpy arrays, those in `in_place` into
    their same-named input's buffer (`new_x` into `x`), the others into
    fresh OrtValues on the device."""
    binding, _bound = bind_on_device(session, device, inputs, into, in_place)
    session.run_with_iobinding(binding)
    return dict(zip([o.name for o in session.get_outputs()], binding.get_outputs()))


def bind_on_device(session, device, inputs, into=None, in_place=()):
    """`(binding, {input: OrtValue})`: `session`'s IO binding as
    `run_on_device` runs it (its arguments), and the inputs' OrtValues,
    which must outlive every run of the binding."""
    binding = session.io_binding()
    # The OrtValues must outlive the run: the binding does not keep them.
    bound = {k: v if is_ortvalue(v) else ortvalue(v, device) for k, v in inputs.items()}
    for key, value in bound.items():
        binding.bind_ortvalue_input(key, value)
    names = [o.name for o in session.get_outputs()]
    for key in names:
        target, source = (into or {}).get(key), key[len("new_"):]
        if target is not None:
            binding.bind_output(key, "cpu", 0, target.dtype, list(target.shape),
                                target.ctypes.data)
        elif source in in_place:
            value = bound[source]
            binding.bind_output(key, device, 0, NUMPY_TYPES[value.data_type()],
                                value.shape(), value.data_ptr())
        else:
            binding.bind_output(key, device, 0)
    return binding, bound


def bind_ring(binding, cache, device, rows=None):
    """Binds `decode_step`'s inputs from a device cache but `token_ids`:
    the ring's flags, slot and positions, and each layer's keys and values
    as a view of the stacked ring (by address: no copy). With `rows`, the
    first `rows` rows of a cache that holds more (a slab's): each layer's
    rows, and the flags', are a prefix of its buffer."""
    for name in ("slot", "positions"):
        binding.bind_ortvalue_input(name, cache[name])
    bind_rows(binding.bind_input, "valid", cache["valid"], device, rows)
    bind_layers(binding.bind_input, cache, device, rows)


def bind_layers(bind, cache, device, rows=None, prefix=""):
    """`bind` (an IO binding's `bind_input` or `bind_output`) of each
    layer's keys and values (`{prefix}keys_{i}`, ...) to its view of the
    stacked ring (by address), the first `rows` rows (all: None)."""
    for kind in ("keys", "values"):
        stacked = cache[kind]
        shape, dtype = stacked.shape(), NUMPY_TYPES[stacked.data_type()]
        layer_bytes = np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))
        for i in range(shape[0]):
            bind(f"{prefix}{kind}_{i}", device, 0, dtype,
                 [shape[1] if rows is None else rows] + shape[2:],
                 stacked.data_ptr() + i * layer_bytes)


def bind_rows(bind, name, value, device, rows=None):
    """`bind(name, ...)` (an IO binding's `bind_input` or `bind_output`) to
    the first `rows` rows (all: None) of the OrtValue `value`, whose first
    axis is the batch: a prefix of its buffer, bound by address."""
    shape = value.shape()
    bind(name, device, 0, NUMPY_TYPES[value.data_type()],
         [shape[0] if rows is None else rows] + shape[1:], value.data_ptr())


def device_step(step_session, write_session, device, ids, stopped, cache, n_token):
    """The log-probs of one `decode_step` on a device cache, which is then
    advanced by the ring's write (`write_session`, of `ring_write_model`):
    the cache is read once, written at one slot, and never leaves the
    device; only the log-probs come to the host."""
    binding = step_session.io_binding()
    token_ids = ortvalue(np.asarray(ids, np.int32), device)
    binding.bind_ortvalue_input("token_ids", token_ids)
    bind_ring(binding, cache, device)
    log_probs = np.empty([len(ids), n_token], np.float32)
    binding.bind_output("log_probs", "cpu", 0, np.float32, list(log_probs.shape),
                        log_probs.ctypes.data)
    for name in STEP_OUTPUTS[1:]:
        binding.bind_output(name, device, 0)
    step_session.run_with_iobinding(binding)
    write_on_device(write_session, device, cache,
                    dict(zip(STEP_OUTPUTS, binding.get_outputs())), stopped)
    return log_probs


def device_token_step(token_session, device, ids, stopped, cache, n_token):
    """The log-probs of one `decode_token` run (`token_session`) on a
    device cache: its rings and flags written in place, its ring positions
    moved on into new OrtValues it then holds (written in place, a node
    could read a position already moved); only the log-probs come to the
    host."""
    binding = token_session.io_binding()
    # The OrtValues must outlive the run: the binding does not keep them.
    inputs = {"token_ids": ortvalue(np.asarray(ids, np.int32), device),
              "stopped": ortvalue(np.asarray(stopped, np.bool_), device),
              "row_slot": cache["row_slot"], "cache_mems": cache["cache_mems"]}
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, value)
    bind_ring(binding, cache, device)
    log_probs = np.empty([len(ids), n_token], np.float32)
    binding.bind_output("log_probs", "cpu", 0, np.float32, list(log_probs.shape),
                        log_probs.ctypes.data)
    binding.bind_ortvalue_output("new_cache_mems", cache["cache_mems"])
    bind_layers(binding.bind_output, cache, device, prefix="new_")
    binding.bind_ortvalue_output("new_valid", cache["valid"])
    for name in MOVED:
        binding.bind_output(f"new_{name}", device, 0)
    token_session.run_with_iobinding(binding)
    out = dict(zip([o.name for o in token_session.get_outputs()], binding.get_outputs()))
    cache["slot"], cache["row_slot"] = out["new_slot"], out["new_row_slot"]
    return log_probs


def write_on_device(write_session, device, cache, token, stopped):
    """Writes a step's token (`token`: `{token_mems, token_keys,
    token_values}`) into the device cache's free slot with `write_session`
    (of `ring_write_model`): the rings in place, `slot` and `row_slot`
    replaced; rows in `stopped` (bool `[B]`) keep their slots."""
    written = run_on_device(
        write_session, device,
        {**{name: cache[name] for name in WRITE_INPUTS if name in cache},
         **{name: token[name] for name in STEP_OUTPUTS[1:]},
         "stopped": np.asarray(stopped, np.bool_)}, in_place=IN_PLACE)
    cache["row_slot"], cache["slot"] = written["new_row_slot"], written["new_slot"]


# ------------------------------------------------------------- graph replay
# ONNX Runtime keys captured graphs by this id: never reuse one for other buffers.
_GRAPH_IDS = itertools.count(1)
MOVED = ("slot", "row_slot")


def replay_run_options():
    """`onnxruntime.RunOptions` with a graph id of its own (`gpu_graph_id`):
    for the runs of one set of fixed buffers."""
    import onnxruntime as ort
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(next(_GRAPH_IDS)))
    return options


def copy_model(names=CACHE_NAMES):
    """An ONNX model copying each cache tensor in `names` to `copy_<name>`:
    bound to a destination buffer, a device-to-device copy."""
    from onnx import TensorProto, helper
    types = {"valid": TensorProto.BOOL, "slot": TensorProto.INT32,
             "row_slot": TensorProto.INT32}
    ranks = {"cache_mems": 4, "keys": 5, "values": 5, "valid": 2, "slot": 0, "row_slot": 1,
             "positions": 2}
    values = [(name, types.get(name, TensorProto.FLOAT), [None] * ranks[name])
              for name in names]
    return small_model(
        [helper.make_node("Identity", [name], [f"copy_{name}"]) for name, _, _ in values],
        "txl_cache_copy", [helper.make_tensor_value_info(*v) for v in values],
        [helper.make_tensor_value_info(f"copy_{n}", t, s) for n, t, s in values])


def empty_like(value, device):
    """An uninitialized OrtValue on `device` of the OrtValue `value`'s shape and type."""
    import onnxruntime as ort
    return ort.OrtValue.ortvalue_from_shape_and_type(
        value.shape(), NUMPY_TYPES[value.data_type()], device, 0)


class FixedStep:
    """One device step over fixed buffers, bound once: the step, the ring's
    write and the move of its positions (`sessions["step"]`, `["write"]`,
    `["move"]`), on the first `rows` rows of `fixed`, a device cache whose
    tensors may hold more rows (a `DeviceSlab`'s): each graph reads and
    writes those rows in place, so its runs can be replayed as CUDA graphs
    (each `FixedStep` its own graph id). The ids, flags, log-probs and the
    token's projections live in buffers of its own. Where the export has
    `decode_token` (`sessions["token"]`), that one graph is the step and
    the write, and the move follows it."""

    def __init__(self, sessions, device, fixed, rows, n_token):
        self.sessions, self.device, self.fixed, self.rows = sessions, device, fixed, int(rows)
        layers, _, _, d_model = fixed["cache_mems"].shape()
        _, _, heads, d_head, _ = fixed["keys"].shape()
        self.ids = ortvalue(np.zeros([rows], np.int32), device)
        self.stopped = ortvalue(np.zeros([rows], np.bool_), device)
        self._stopped_bytes = np.zeros([rows], np.bool_).tobytes()  # what `stopped` holds
        self.log_probs = ortvalue(np.zeros([rows, n_token], np.float32), device)
        # The ring positions a write moves on, then copied over the old ones:
        # written in place, the graph could read a position it already moved.
        self.moved = {"slot": empty_like(fixed["slot"], device),
                      "row_slot": ortvalue(np.zeros([rows], np.int32), device)}
        self.token_binding = self._bind_token() if "token" in sessions else None
        if self.token_binding is None:  # the token's projections, between step and write
            kv_dtype = NUMPY_TYPES[fixed["keys"].data_type()]
            self.token = {"token_mems": ortvalue(np.zeros([layers, rows, d_model], np.float32),
                                                 device),
                          **{name: ortvalue(np.zeros([layers, rows, heads, d_head], kv_dtype),
                                            device) for name in ("token_keys", "token_values")}}
            self.step_binding, self.write_binding = self._bind_step(), self._bind_write()
        self.move_binding = self.sessions["move"].io_binding()
        for name in MOVED:
            self.move_binding.bind_ortvalue_input(name, self.moved[name])
        self.move_binding.bind_ortvalue_output("copy_slot", fixed["slot"])
        bind_rows(self.move_binding.bind_output, "copy_row_slot", fixed["row_slot"], device,
                  rows)
        self.run_options = replay_run_options()

    def _bind_step(self):
        binding = self.sessions["step"].io_binding()
        binding.bind_ortvalue_input("token_ids", self.ids)
        bind_ring(binding, self.fixed, self.device, self.rows)
        binding.bind_ortvalue_output("log_probs", self.log_probs)
        for name in STEP_OUTPUTS[1:]:
            binding.bind_ortvalue_output(name, self.token[name])
        return binding

    def _bind_token(self):
        """`decode_token` over the fixed buffers: the rings' and the flags'
        outputs are their inputs' buffers (written in place); the stacked
        layer inputs are bound whole, as the write's (its batch axis is not
        the first: the rows are no prefix of it)."""
        binding = self.sessions["token"].io_binding()
        binding.bind_ortvalue_input("token_ids", self.ids)
        binding.bind_ortvalue_input("stopped", self.stopped)
        bind_ring(binding, self.fixed, self.device, self.rows)
        bind_rows(binding.bind_input, "row_slot", self.fixed["row_slot"], self.device, self.rows)
        binding.bind_ortvalue_input("cache_mems", self.fixed["cache_mems"])
        binding.bind_ortvalue_output("log_probs", self.log_probs)
        binding.bind_ortvalue_output("new_cache_mems", self.fixed["cache_mems"])
        bind_layers(binding.bind_output, self.fixed, self.device, self.rows, prefix="new_")
        bind_rows(binding.bind_output, "new_valid", self.fixed["valid"], self.device, self.rows)
        for name in MOVED:
            binding.bind_ortvalue_output(f"new_{name}", self.moved[name])
        return binding

    def _bind_write(self):
        """The rings are bound whole (the write's indices reach only the
        first `rows` rows: GatherElements and ScatterElements take indices
        smaller than their data), the flags and rows' slots as prefixes."""
        binding = self.sessions["write"].io_binding()
        for name in ("cache_mems", "keys", "values", "slot"):
            binding.bind_ortvalue_input(name, self.fixed[name])
        for name in ("valid", "row_slot"):
            bind_rows(binding.bind_input, name, self.fixed[name], self.device, self.rows)
        for name, value in {**self.token, "stopped": self.stopped}.items():
            binding.bind_ortvalue_input(name, value)
        for name in ("cache_mems", "keys", "values"):
            binding.bind_ortvalue_output(f"new_{name}", self.fixed[name])
        bind_rows(binding.bind_output, "new_valid", self.fixed["valid"], self.device, self.rows)
        for name in MOVED:
            binding.bind_ortvalue_output(f"new_{name}", self.moved[name])
        return binding

    def read(self, ids, stopped):
        """The log-probs (numpy) of one step of the rows. The ring is read,
        not written (`write` does that), or, with `decode_token`, written
        only at each row's free slot (outside its memory: what any read of
        the cache sees is as it was until `write` moves the ring on)."""
        self.ids.update_inplace(np.asarray(ids, np.int32))
        stopped = np.asarray(stopped, np.bool_)
        if stopped.tobytes() != self._stopped_bytes:  # (on a GPU each update is a copy to it)
            self._stopped_bytes = None  # (unknown if the update is interrupted)
            self.stopped.update_inplace(stopped)
            self._stopped_bytes = stopped.tobytes()
        if self.token_binding is not None:
            self.sessions["token"].run_with_iobinding(self.token_binding, self.run_options)
        else:
            self.sessions["step"].run_with_iobinding(self.step_binding, self.run_options)
        # On the CPU `numpy()` is a view of the buffer the next step writes.
        log_probs = self.log_probs.numpy()
        return np.array(log_probs) if self.device == "cpu" else log_probs

    def write(self):
        """Writes the token `read` projected into the free slot of the rows
        not stopped (with `decode_token`, `read` did), and moves the ring on."""
        if self.token_binding is None:
            self.sessions["write"].run_with_iobinding(self.write_binding, self.run_options)
        self.sessions["move"].run_with_iobinding(self.move_binding, self.run_options)


class Resident:
    """Fixed buffers for the device step of one batch size, and the cache
    that lives in them (see the module's docstring)."""

    def __init__(self, sessions, device, cache, n_token):
        self.sessions = sessions
        self.fixed = {name: empty_like(cache[name], device) for name in CACHE_NAMES}
        self.steps = FixedStep(sessions, device, self.fixed, cache["valid"].shape()[0], n_token)
        self.owner = None  # (the cache last moved in, its own buffers), or None

    def step(self, cache, ids, stopped):
        """The log-probs of one step of `cache` (advanced in place)."""
        if not self._holds(cache):
            self._take(cache)
        log_probs = self.steps.read(ids, stopped)
        self.steps.write()
        return log_probs

    def _holds(self, cache):
        """Whether `cache` lives in the fixed buffers (its tensors are them)."""
        return all(cache[name] is self.fixed[name] for name in CACHE_NAMES)

    def _take(self, cache):
        """Moves `cache` into the fixed buffers, and the cache there back out.
        Each cache is in them or out (one `dict.update`), and what holds them
        is read from the caches, not `owner`: an interrupt anywhere leaves no
        cache reading another's buffers."""
        if self.owner is not None and self._holds(self.owner[0]):
            owner, own_buffers = self.owner
            copy_on_device(self.sessions["copy"], self.fixed, own_buffers)
            owner.update(own_buffers)
        copy_on_device(self.sessions["copy"], cache, self.fixed)
        self.owner = (cache, {name: cache[name] for name in CACHE_NAMES})
        cache.update(self.fixed)


def copy_on_device(session, source, target):
    """Copies each cache tensor of `source` into `target`'s buffer with
    `session` (of `copy_model()`)."""
    binding = session.io_binding()
    for name in CACHE_NAMES:
        binding.bind_ortvalue_input(name, source[name])
        binding.bind_ortvalue_output(f"copy_{name}", target[name])
    session.run_with_iobinding(binding)

