"""Test-wide setup: the TF backend, quiet logs, and two logical CPU devices.

Splitting the CPU into two logical devices must happen before TensorFlow
initialises its devices, so it is done here, when pytest first imports the
test package; tests of `tf.distribute` then build a 2-replica
MirroredStrategy on `/cpu:0` and `/cpu:1`. Other tests use the default
device and are unaffected.
"""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

# Exact float32 comparisons: no TF32 matmuls when a test runs on an Ampere+ GPU.
tf.config.experimental.enable_tensor_float_32_execution(False)
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

# Seconds each module took (its tests summed, `pytest --durations=0` on the
# 2-core machine; docs/testing.md). `make test` hands whole modules to its two
# workers in this order (`--dist loadscope --no-loadscope-reorder`), the
# longest first, so that no long module is left running alone at the end.
# Modules not listed (under 20 s) follow in their usual order.
MODULE_SECONDS = {
    "test_bad_inputs": 290, "test_export_job": 220, "test_decoder": 210, "test_model": 180,
    "test_transformer_xl_causal_lm": 150, "test_classifier": 150, "test_decode_cache_export": 140,
    "test_docs": 140, "test_bench_flags": 130, "test_training_resume": 110,
    "test_memory_reach": 110, "test_training_classify": 110, "test_sessions": 100,
    "test_attention_picture": 90, "test_classifier_export": 90, "test_export_parity": 90,
    "test_training_generate": 70, "test_export_runtime": 60, "test_training_recl": 60,
    "test_learning": 60, "test_training_errors": 60, "test_onnx_weights": 60, "test_convert": 60,
    "test_evaluate": 50, "test_lora_int8": 50, "test_triton_export": 50, "test_core": 40,
    "test_kv_cache": 40, "test_causal_lm_streams": 40, "test_memory_budget": 40, "test_demo": 40,
    "test_transformer_xl_presets": 40, "test_onnx_without_tensorflow": 30, "test_device_ring": 30,
    "test_training_lock": 30, "test_classification_data": 20, "test_training_multiworker": 20,
    "test_training_logs": 20, "test_generate": 20, "test_attention_types": 20,
    "test_layer_harness": 20,
}


def pytest_collection_modifyitems(items):
    """The longest modules first (a stable sort: each module's tests stay
    together and in their order)."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.stem, 0))
