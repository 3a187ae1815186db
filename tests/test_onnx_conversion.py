"""tf2onnx converts without deep-copying its graph before each optimizer, and
a conversion that fails so is done again with the copies."""
import copy
import os
import sys

import keras
import numpy as np
import onnx
import onnxruntime as ort
import tensorflow as tf
import tf2onnx
from onnx import TensorProto, helper, numpy_helper

from export.canonical import canonical_graph
from export.onnx_export import convert_with_weight_inputs, save_with_weights

SPECS = [tf.TensorSpec([None, 3], tf.float32, name="x")]


def convert(variable):
    return convert_with_weight_inputs(lambda x: {"y": tf.nn.relu(x * variable + 1.0)}, SPECS,
                                      [variable])


def outputs(model, variable, tmp_path, x):
    path = str(tmp_path / "m.onnx")
    save_with_weights(model, path, [variable], len(SPECS))
    return ort.InferenceSession(path).run(None, {"x": x})[0]


def test_the_conversion_copies_no_graph_and_leaves_the_environment(tmp_path, monkeypatch):
    variable = keras.Variable(np.array([1.0, -2.0, 3.0], np.float32))
    copies = []
    deepcopy = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *a: copies.append(type(x).__name__)
                        or deepcopy(x, *a))
    monkeypatch.delenv("TF2ONNX_CATCH_ERRORS", raising=False)
    model = convert(variable)
    assert "Graph" not in copies
    assert "TF2ONNX_CATCH_ERRORS" not in os.environ
    x = np.array([[1.0, 1.0, 1.0], [-1.0, 0.5, 2.0]], np.float32)
    np.testing.assert_allclose(outputs(model, variable, tmp_path, x),
                               np.maximum(x * variable.numpy() + 1.0, 0.0), rtol=1e-6)


def test_a_conversion_that_fails_without_the_copies_is_done_with_them(tmp_path, monkeypatch):
    variable = keras.Variable(np.array([0.5, 0.5, 0.5], np.float32))
    real, tries = tf2onnx.convert.from_function, []

    def fails_without_copies(*args, **kwargs):
        tries.append(os.environ.get("TF2ONNX_CATCH_ERRORS"))
        if tries[-1] == "FALSE":
            raise RuntimeError("an optimizer failed")
        return real(*args, **kwargs)
    monkeypatch.setattr(tf2onnx.convert, "from_function", fails_without_copies)
    monkeypatch.setenv("TF2ONNX_CATCH_ERRORS", "TRUE")  # the user's own setting is kept
    model = convert(variable)
    assert tries == ["FALSE", "TRUE"] and os.environ["TF2ONNX_CATCH_ERRORS"] == "TRUE"
    x = np.ones([1, 3], np.float32)
    np.testing.assert_allclose(outputs(model, variable, tmp_path, x), [[1.5, 1.5, 1.5]])


def test_the_first_conversion_leaves_the_tensorflow_log_level(tmp_path, monkeypatch):
    """Importing `tf2onnx.convert` sets `TF_CPP_MIN_LOG_LEVEL=3`; the
    conversion gives back the user's level (processes started afterwards,
    a job or a test's, would not show TensorFlow's C++ errors)."""
    imported = tf2onnx.convert
    monkeypatch.delitem(sys.modules, "tf2onnx.convert")  # the import runs again here
    monkeypatch.delattr(tf2onnx, "convert")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    variable = keras.Variable(np.array([0.5, 0.5, 0.5], np.float32))
    model = convert(variable)
    assert sys.modules["tf2onnx.convert"] is not imported  # imported again by the conversion
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
    np.testing.assert_allclose(outputs(model, variable, tmp_path, np.ones([1, 3], np.float32)),
                               [[1.5, 1.5, 1.5]])


def test_two_conversions_of_one_function_are_the_same_bytes(tmp_path):
    """tf2onnx orders nodes by iterating sets and names them from process-wide
    counters: without `canonical_graph`, a second conversion in the same
    process differs in node order and names (a file hash changes each export)."""
    variable = keras.Variable(np.array([1.0, -2.0, 3.0], np.float32))

    def fn(x):
        h = tf.reduce_mean(x * variable, axis=-1, keepdims=True) + tf.reduce_max(x, -1, True)
        return {"y": tf.nn.softmax(tf.concat([h, x - h, tf.abs(x)], axis=-1) * 2.0)}
    written = []
    for name in ("a.onnx", "b.onnx"):
        model = convert_with_weight_inputs(fn, SPECS, [variable])
        onnx.checker.check_model(model)
        save_with_weights(model, str(tmp_path / name), [variable], len(SPECS))
        written.append((tmp_path / name).read_bytes())
    assert written[0] == written[1]
    x = np.array([[1.0, 1.0, 1.0], [-1.0, 0.5, 2.0]], np.float32)
    got = ort.InferenceSession(str(tmp_path / "a.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, fn(tf.constant(x))["y"].numpy(), rtol=1e-5)


def test_the_canonical_graph_does_not_depend_on_node_order_or_internal_names():
    """Equal graphs in another topological order, under other internal names
    (equal constants and equal nodes made one) serialize to the same bytes."""
    def graph(order, prefix, twice):
        c = [numpy_helper.from_array(np.array([2.0], np.float32), f"{prefix}two")]
        nodes = {"a": helper.make_node("Mul", ["x", f"{prefix}two"], [f"{prefix}a"],
                                       name=f"{prefix}A"),
                 "b": helper.make_node("Exp", ["x"], [f"{prefix}b"], name=f"{prefix}B"),
                 "s": helper.make_node("Add", [f"{prefix}a", f"{prefix}b"], ["y"], name="S")}
        if twice:  # an equal constant and an equal Exp, each read instead of the first
            c.append(numpy_helper.from_array(np.array([2.0], np.float32), f"{prefix}two2"))
            nodes["b2"] = helper.make_node("Exp", ["x"], [f"{prefix}b2"], name=f"{prefix}B2",
                                           domain="")  # tf2onnx sets it on some nodes
            nodes["s"] = helper.make_node("Add", [f"{prefix}a", f"{prefix}b2"], ["y"], name="S")
            nodes["a"].input[1] = f"{prefix}two2"
        value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, 3])
                 for n in ("x", "y")]
        shapes = [helper.make_tensor_value_info(f"{prefix}{k}", TensorProto.FLOAT, [None, 3])
                  for k in nodes if k != "s"]  # b2's goes with it
        g = helper.make_graph([nodes[k] for k in order], "g", value[:1], value[1:], c,
                              doc_string=f"converted from b'__inference_run_{len(prefix)}'",
                              value_info=shapes[::-1] if twice else shapes)
        return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    first = canonical_graph(graph(["a", "b", "s"], "p_", False))
    for order, prefix, twice in [(["b", "a", "s"], "other__", False),
                                 (["b2", "b", "a", "s"], "q", True)]:
        model = canonical_graph(graph(order, prefix, twice))
        onnx.checker.check_model(model)
        assert model.SerializeToString() == first.SerializeToString()
    x = np.array([[0.0, 1.0, -1.0]], np.float32)
    model = first.SerializeToString()
    np.testing.assert_allclose(ort.InferenceSession(model).run(None, {"x": x})[0],
                               2 * x + np.exp(x), rtol=1e-6)


def test_a_loop_body_is_made_canonical_too():
    """The classifier's graph runs its documents in a Loop: the body's nodes,
    names and graph name (tf2onnx's have counters) are put in order too, and
    the body reads the outer graph's constant under its new name."""
    def graph(prefix, body_order):
        body_nodes = [helper.make_node("Identity", [f"{prefix}cond"], [f"{prefix}cond_out"],
                                       name=f"{prefix}I"),
                      helper.make_node("Mul", [f"{prefix}v", f"{prefix}two"], [f"{prefix}v2"],
                                       name=f"{prefix}M")]
        body = helper.make_graph(
            [body_nodes[k] for k in body_order], f"{prefix}body",
            [helper.make_tensor_value_info(f"{prefix}i", TensorProto.INT64, []),
             helper.make_tensor_value_info(f"{prefix}cond", TensorProto.BOOL, []),
             helper.make_tensor_value_info(f"{prefix}v", TensorProto.FLOAT,
                                           [f"unk__{len(prefix)}"])],
            [helper.make_tensor_value_info(f"{prefix}cond_out", TensorProto.BOOL, []),
             helper.make_tensor_value_info(f"{prefix}v2", TensorProto.FLOAT, [None])])
        constants = [numpy_helper.from_array(np.array([2.0], np.float32), f"{prefix}two"),
                     numpy_helper.from_array(np.array(3, np.int64), f"{prefix}trips"),
                     numpy_helper.from_array(np.array(True), f"{prefix}true")]
        loop = helper.make_node("Loop", [f"{prefix}trips", f"{prefix}true", "x"], ["y"],
                                name=f"{prefix}L", body=body)
        g = helper.make_graph([loop], "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [3])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, [3])], constants)
        return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    first = canonical_graph(graph("p_", [0, 1]))
    again = canonical_graph(graph("another_", [1, 0]))
    onnx.checker.check_model(again)
    assert again.SerializeToString() == first.SerializeToString()
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_allclose(ort.InferenceSession(first.SerializeToString()).run(
        None, {"x": x})[0], 8 * x)


def test_nodes_that_draw_or_differ_in_their_outputs_are_not_made_one():
    """Equal nodes were made one when they drew (a Dropout in training mode,
    a Loop whose body draws), and a node without its optional second output
    was taken for one with it (its reader then read the name "")."""
    value = helper.make_tensor_value_info

    def body():
        return helper.make_graph(
            [helper.make_node("Identity", ["cond"], ["cond_out"]),
             helper.make_node("RandomUniformLike", ["v"], ["r"]),
             helper.make_node("Add", ["r", "v"], ["v2"])], "body",
            [value("i", TensorProto.INT64, []), value("cond", TensorProto.BOOL, []),
             value("v", TensorProto.FLOAT, [1, 1, 4, 4])],
            [value("cond_out", TensorProto.BOOL, []),
             value("v2", TensorProto.FLOAT, [1, 1, 4, 4])])
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d1"]),
             helper.make_node("Dropout", ["x", "ratio", "train"], ["d2"]),
             helper.make_node("Loop", ["trips", "", "x"], ["l1"], body=body()),
             helper.make_node("Loop", ["trips", "", "x"], ["l2"], body=body()),
             helper.make_node("MaxPool", ["x"], ["p", ""], kernel_shape=[2, 2],
                               strides=[2, 2]),
             helper.make_node("MaxPool", ["x"], ["q", "where"], kernel_shape=[2, 2],
                               strides=[2, 2]),
             helper.make_node("Cast", ["where"], ["at"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["p", "at"], ["y"]),
             helper.make_node("Sub", ["d1", "d2"], ["d"]),
             helper.make_node("Sub", ["l1", "l2"], ["l"])]
    constants = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
                 numpy_helper.from_array(np.array(True), "train"),
                 numpy_helper.from_array(np.array(1, np.int64), "trips")]
    outputs = [value(n, TensorProto.FLOAT, None) for n in ("d", "l", "y")]
    model = canonical_graph(helper.make_model(
        helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [1, 1, 4, 4])], outputs,
                          constants),
        ir_version=8, opset_imports=[helper.make_opsetid("", 17)]))
    assert sorted(n.op_type for n in model.graph.node) == sorted(n.op_type for n in nodes)
    cast, = [n for n in model.graph.node if n.op_type == "Cast"]
    assert cast.input[0], cast
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    got = ort.InferenceSession(model.SerializeToString()).run(["y"], {"x": x})[0]
    np.testing.assert_array_equal(got.ravel(), [5 + 5, 7 + 7, 13 + 13, 15 + 15])


def test_the_canonical_graph_of_many_ready_nodes_and_constants_does_not_depend_on_order():
    """Several nodes ready at once (each reads the same node), constants in
    any order under any names, and an equal node after the first node: any
    topological order of it serializes to the same bytes, the equal nodes
    made one."""
    value = helper.make_tensor_value_info

    def graph(children, constants, prefix):
        made = {"m": ("Mul", [f"{prefix}r", f"{prefix}two"]),
                "a": ("Add", [f"{prefix}r", f"{prefix}three"]),
                "e": ("Exp", [f"{prefix}r"]), "e2": ("Exp", [f"{prefix}r"]),
                "n": ("Neg", [f"{prefix}r"]), "s": ("Sin", [f"{prefix}r"])}
        nodes = [helper.make_node("Relu", ["x"], [f"{prefix}r"], name=f"{prefix}R")]
        nodes += [helper.make_node(made[k][0], made[k][1], [f"{prefix}{k}"], name=prefix + k)
                  for k in children]
        nodes.append(helper.make_node("Sum", [f"{prefix}{k}" for k in ("m", "a", "e", "e2",
                                                                         "n", "s")], ["y"]))
        tables = {"two": 2.0, "three": 3.0}
        initializers = [numpy_helper.from_array(np.array([tables[k]], np.float32),
                                                f"{prefix}{k}") for k in constants]
        g = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [None, 3])],
                              [value("y", TensorProto.FLOAT, [None, 3])], initializers)
        return helper.make_model(g, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])

    first = canonical_graph(graph(["m", "a", "e", "e2", "n", "s"], ["two", "three"], "p_"))
    assert [n.op_type for n in first.graph.node].count("Exp") == 1
    for children, constants, prefix in [(["s", "n", "e2", "e", "a", "m"], ["three", "two"], "q"),
                                        (["e2", "a", "s", "m", "e", "n"], ["two", "three"], "z_"),
                                        (["n", "e", "m", "s", "e2", "a"], ["three", "two"], "")]:
        model = canonical_graph(graph(children, constants, prefix))
        onnx.checker.check_model(model)
        assert model.SerializeToString() == first.SerializeToString(), children
    x = np.array([[0.5, 1.0, -1.0]], np.float32)
    r = np.maximum(x, 0)
    np.testing.assert_allclose(ort.InferenceSession(first.SerializeToString()).run(
        None, {"x": x})[0], 2 * r + (r + 3) + 2 * np.exp(r) - r + np.sin(r), rtol=1e-6)
