"""The project's one error family.

Every error raised for bad input (a value, a file, a setting or a model that
cannot be used as given) derives from `TxlError`, a `ValueError`, and keeps
its own precise name (`ConfigError`, `InputError`, `ModelDirError`, ...).
The jobs end any of them with one `error:` line (`txl_tf.app.exits`);
anything else is a bug and keeps its traceback.
"""


class TxlError(ValueError):
    """Bad input; the message names what is wrong and, where there is one, the fix."""


class ModelDirError(TxlError):
    """A model directory, config, weights file or checkpoint is missing or unreadable."""
