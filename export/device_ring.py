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
where the cache is kept on the device.
"""
from export.host_cache import SLOT_AXES

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


def ring_write_model():
    """The ONNX `ModelProto` of the ring's write (inputs `WRITE_INPUTS`,
    outputs `WRITE_OUTPUTS`; the batch, sizes and layer count are read from
    the inputs' shapes)."""
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
    node("Shape", ["valid"], "valid_shape")
    node("Gather", ["valid_shape", const("size_index", [1])], "size_64")
    node("Cast", ["size_64"], "size_1", to=int_t)
    node("Reshape", ["size_1", const("scalar", [])], "size")
    node("Add", ["slot", const("one", 1, int_t)], "slot_plus_one")
    node("Mod", ["slot_plus_one", "size"], "new_slot")
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

