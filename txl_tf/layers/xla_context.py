"""Whether the graph being traced is XLA-compiled: the layers and the
sampler pick their forms by it (chunked loops, the dtype of index math)."""
import tensorflow as tf


def compiling_with_xla():
    """Whether the graph being traced is compiled with XLA (a
    `tf.function(jit_compile=True)`, Keras's `jit_compile`), by TensorFlow's
    own test (tensorflow/python/ops/control_flow_util.py: no public one)."""
    from tensorflow.python.ops import control_flow_util
    return (not tf.executing_eagerly() and
            control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
