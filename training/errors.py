"""The jobs' own error: a bad flag, missing or empty data, or a model that
does not fit the data. A `TxlError`, so every job ends it with one `error:`
line (`txl_tf.app.exits`)."""
from txl_tf.errors import TxlError


class TrainingError(TxlError):
    """A bad flag, missing or empty data, or a model that does not fit the data."""
