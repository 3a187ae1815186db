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
