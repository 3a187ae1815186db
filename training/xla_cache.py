"""XLA's persistent compilation cache, as the training job uses it.

With `TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR` in the
environment before TensorFlow starts, TensorFlow saves each program it
compiles with XLA into DIR and loads it back, instead of compiling again, in
a later process that asks for the same program. "The same" is strict: the
cache key hashes the traced function's name, which ends in a process-wide
counter (`__inference_one_step_on_data_<n>`), and the whole HLO module, whose
name holds that counter too. A resumed run restores its checkpoint before it
traces the train step, which moves the counter, so its key would differ from
the first run's: the job calls `align_function_ids` just before `fit`, which
moves the counter to the same number in every run.
"""
import os
import shlex

FLAG = "--tf_xla_persistent_cache_directory"
# Where `align_function_ids` puts the counter: above what the job reaches
# before `fit` (a few thousand), and cheap to count up to.
TRAIN_FUNCTION_ID = 100_000


def directory(environ=os.environ):
    """The cache folder `TF_XLA_FLAGS` names, or None."""
    found = None
    for arg in shlex.split(environ.get("TF_XLA_FLAGS", "")):
        if arg.startswith(FLAG + "="):
            found = arg.split("=", 1)[1] or None
    return found


def align_function_ids(target=TRAIN_FUNCTION_ID):
    """Moves TensorFlow's function-name counter to `target`, so that what is
    traced next gets the same names in every run that does the same from
    here. Returns False (and moves nothing) where the counter is already
    past `target`."""
    from tensorflow.python.framework import ops
    drawn = ops.uid()
    if drawn >= target:
        return False
    while drawn < target:
        drawn = ops.uid()
    return True
