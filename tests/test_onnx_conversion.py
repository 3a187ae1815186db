"""tf2onnx converts without deep-copying its graph before each optimizer, and
a conversion that fails so is done again with the copies."""
import copy
import os
import sys

import keras
import numpy as np
import onnxruntime as ort
import tensorflow as tf
import tf2onnx

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
