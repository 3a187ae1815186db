"""The project's one error family.

Every error raised for bad input (a value, a file, a setting or a model that
cannot be used as given) derives from `TxlError`, a `ValueError`, and keeps
its own precise name (`ConfigError`, `InputError`, `ModelDirError`, ...).
The jobs end any of them with one `error:` line (`txl_tf.app.exits`);
anything else is a bug and keeps its traceback.
"""


class TxlError(ValueError):
    """Bad input; the message names what is wrong and, where there is one, the fix."""

    # Keras re-raises an error from a layer's `call` as a new one whose message begins
    # "Exception encountered when calling ..." and lists the arguments (a subclass whose
    # constructor takes more than the message came back a RuntimeError); it passes on an
    # error carrying this mark unchanged, so ours keep their one line and their class.
    _keras_call_info_injected = True


class ModelDirError(TxlError):
    """A model directory, config, weights file or checkpoint is missing or unreadable."""
