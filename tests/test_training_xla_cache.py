"""The training job's use of XLA's persistent compilation cache
(`training/xla_cache.py`): the folder named in `TF_XLA_FLAGS`, and the
function-name counter moved to the same number before the train step is
traced, whatever was traced before (a resume restores a checkpoint first).
That a resumed job then loads the first run's program, rather than
compiling it, shows on the GPU check's `train` row (the resume's compile
seconds) and in TensorFlow's log (`device_executable_persistor`: "Loading
cached entry")."""
import tensorflow as tf

from training import xla_cache


def test_the_cache_folder_is_read_from_tf_xla_flags():
    assert xla_cache.directory({}) is None
    assert xla_cache.directory({"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}) is None
    flags = "--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory=/c/xla --x=1"
    assert xla_cache.directory({"TF_XLA_FLAGS": flags}) == "/c/xla"


def _traced_name(history):
    """The name the train step's trace gets after `history` other traces
    and the counter moved to the next multiple of 10,000 past them."""
    for i in range(history):
        tf.function(lambda x: x + i).get_concrete_function(tf.TensorSpec([], tf.float32))
    target = (tf.function(lambda x: x).get_concrete_function(
        tf.TensorSpec([], tf.float32)).name.decode().rsplit("_", 1)[1])
    target = (int(target) // 10_000 + 1) * 10_000
    assert xla_cache.align_function_ids(target)
    step = tf.function(lambda x: x * 2, jit_compile=True)
    name = step.get_concrete_function(tf.TensorSpec([2], tf.float32)).name.decode()
    return int(name.rsplit("_", 1)[1]) - target


def test_the_train_step_is_traced_at_the_same_function_id_after_any_history():
    assert _traced_name(0) == _traced_name(3) == _traced_name(11)
    assert not xla_cache.align_function_ids(target=1)  # already past: nothing moved
