"""The decode cache kept on the ONNX Runtime device: the ring's write as a
small ONNX graph that runs there.

On the CPU the host writes a step's token into the cache's free slot in
numpy (`host_cache.write_token`). On a GPU the cache lives in device memory
(OrtValues) and the write must run there too, or every step would copy the
whole cache across the bus. `ring_write_model` builds that write: for the
rows not stopped, the token's layer input, keys and values go into the free
slot of `cache_mems`, `keys` and `values` (ScatterElements along the slot
axis), `valid` is set there, `row_slot` and `slot` move on; what
`write_token` does on the host, for the same cache layout
(`host_cache.cache_shapes`).

The runtime binds each ring's output to the ring's own buffer. ONNX
Runtime's ScatterElements copies its input to its output only when the two
are different buffers, so the write touches one slot, not the cache
(`tests/test_device_ring.py` checks the buffers stay in place and the
values equal the host's write).

Built with `onnx.helper` at run time (no TensorFlow); `onnx` is needed only
where the cache is kept on the device. `ring_memory_model` takes the
memory a cache holds there too (`cache_memory`). `device_step` and
`run_on_device` drive the decode graphs on such a cache
(`export.onnx_runtime.OnnxRuntime` with `device_cache`).
"""
import numpy as np

from export.host_cache import SLOT_AXES, STEP_OUTPUTS

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
    node("Unsqueeze", ["live", const("last_axis", [1])], "live_column")
    node("Shape", ["live_column"], "column_shape")
    node("Reshape", ["slot", const("scalar_as_2d", [1, 1])], "slot_2d")
    node("Expand", ["slot_2d", "column_shape"], "valid_index")
    node("GatherElements", ["valid", "valid_index"], "valid_old", axis=1)
    node("Or", ["valid_old", "live_column"], "valid_update")
    node("ScatterElements", ["valid", "valid_index", "valid_update"], "new_valid", axis=1)
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
    graph = helper.make_graph(nodes, "txl_ring_write", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="txl_tf")
    model.ir_version = 8
    return model


def ring_memory_model(size):
    """The ONNX `ModelProto` of the memory a cache of `size` slots holds, in
    time order, computed where the cache is: inputs `cache_mems`, `valid`,
    `row_slot`; outputs `mems` `[L, B, size - 1, d]` and `mem_mask`
    `[B, size - 1]` (what `Runtime.cache_memory` computes on the host).
    Row b's slots `row_slot[b] + 1, ..., + size - 1` (mod size), oldest
    first."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    span = numpy_helper.from_array(np.arange(1, size, dtype=np.int32)[None, :], "span")
    nodes = [
        helper.make_node("Constant", [], ["span_value"], value=span),
        helper.make_node("Constant", [], ["size"], value=helper.make_tensor(
            "size", TensorProto.INT32, [], [int(size)])),
        helper.make_node("Constant", [], ["column"], value=helper.make_tensor(
            "column", TensorProto.INT64, [1], [-1])),
        helper.make_node("Unsqueeze", ["row_slot", "column"], ["row_start"]),
        helper.make_node("Add", ["row_start", "span_value"], ["shifted"]),
        helper.make_node("Mod", ["shifted", "size"], ["order_32"]),
        helper.make_node("Cast", ["order_32"], ["order"], to=TensorProto.INT64),
        helper.make_node("GatherElements", ["valid", "order"], ["mem_mask"], axis=1),
        # rows first, to gather each row's slots: [B, S, L, d] -> [B, M, L, d]
        helper.make_node("Transpose", ["cache_mems"], ["by_row"], perm=[1, 2, 0, 3]),
        helper.make_node("Unsqueeze", ["order", "column"], ["order_nd"]),
        helper.make_node("GatherND", ["by_row", "order_nd"], ["gathered"], batch_dims=1),
        helper.make_node("Transpose", ["gathered"], ["mems"], perm=[2, 0, 1, 3]),
    ]
    graph = helper.make_graph(
        nodes, "txl_ring_memory",
        [helper.make_tensor_value_info("cache_mems", TensorProto.FLOAT, [None] * 4),
         helper.make_tensor_value_info("valid", TensorProto.BOOL, [None, None]),
         helper.make_tensor_value_info("row_slot", TensorProto.INT32, [None])],
        [helper.make_tensor_value_info("mems", TensorProto.FLOAT, [None] * 4),
         helper.make_tensor_value_info("mem_mask", TensorProto.BOOL, [None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="txl_tf")
    model.ir_version = 8
    return model


def _write_slot(node, const, ring, token, stopped, rank, axis):
    """Nodes writing `token` (the ring's shape without the slot axis) into
    `ring`'s free slot, rows in `stopped` keeping their old value; the
    result is the graph's output `new_{ring}` itself (no copy after it)."""
    node("Unsqueeze", [token, const(f"{ring}_axis", [axis])], f"{ring}_update_new")
    node("Shape", [f"{ring}_update_new"], f"{ring}_update_shape")
    node("Reshape", ["slot", const(f"{ring}_ones", [1] * rank)], f"{ring}_slot")
    node("Expand", [f"{ring}_slot", f"{ring}_update_shape"], f"{ring}_index")
    node("GatherElements", [ring, f"{ring}_index"], f"{ring}_old", axis=axis)
    node("Where", [stopped, f"{ring}_old", f"{ring}_update_new"], f"{ring}_update")
    node("ScatterElements", [ring, f"{ring}_index", f"{ring}_update"], f"new_{ring}",
         axis=axis)



# ------------------------------------------------------- driving the graphs
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(bool)": np.bool_,
                "tensor(int32)": np.int32}


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


def run_on_device(session, device, inputs, into=None, in_place=()):
    """`{output: OrtValue}` of `session` on `device`. `inputs` are OrtValues
    (bound as they are) or arrays (copied to the device); outputs named in
    `into` are written into those numpy arrays, those in `in_place` into
    their same-named input's buffer (`new_x` into `x`), the others into
    fresh OrtValues on the device."""
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
            binding.bind_output(key, device, 0, _NUMPY_TYPES[value.data_type()],
                                value.shape(), value.data_ptr())
        else:
            binding.bind_output(key, device, 0)
    session.run_with_iobinding(binding)
    return dict(zip(names, binding.get_outputs()))


def bind_ring(binding, cache, device):
    """Binds `decode_step`'s inputs from a device cache but `token_ids`:
    the ring's flags, slot and positions, and each layer's keys and values
    as a view of the stacked ring (by address: no copy)."""
    for name in ("valid", "slot", "positions"):
        binding.bind_ortvalue_input(name, cache[name])
    for kind in ("keys", "values"):
        stacked = cache[kind]
        shape = stacked.shape()
        layer_bytes = 4 * int(np.prod(shape[1:], dtype=np.int64))
        for i in range(shape[0]):
            binding.bind_input(f"{kind}_{i}", device, 0, np.float32, shape[1:],
                               stacked.data_ptr() + i * layer_bytes)


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
    token = dict(zip(STEP_OUTPUTS, binding.get_outputs()))
    written = run_on_device(
        write_session, device,
        {**{name: cache[name] for name in WRITE_INPUTS if name in cache},
         **{name: token[name] for name in STEP_OUTPUTS[1:]},
         "stopped": np.asarray(stopped, np.bool_)}, in_place=IN_PLACE)
    cache["row_slot"], cache["slot"] = written["new_row_slot"], written["new_slot"]
    return log_probs
