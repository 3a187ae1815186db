"""TensorFlow's absl logging, kept from configuring the user's process.

TensorFlow logs through absl while it saves a SavedModel or a checkpoint,
and absl calls `logging.basicConfig()` when the root logger has no handler
(a stderr handler from then on: the user's own `basicConfig` does nothing);
`tf.saved_model.save` also sets absl's verbosity to FATAL and back to the
level it read, which pins the `absl` logger at WARNING where it inherited
the root's. Standard library only.
"""
import contextlib
import logging


@contextlib.contextmanager
def logging_as_found():
    """Within (a `with` block, or a decorated function): puts back, on the
    way out, the root logger's level and its having no handler, and the
    `absl` logger's level.

    Not put back: absl's own verbosity (`absl.logging.get_verbosity()`,
    only its logger's level is). Not kept apart: while the block runs (a
    whole training job) the root logger may carry absl's stderr handler, so
    any thread's records go there and a `basicConfig` does nothing; on the
    way out a handler or level that another thread set meanwhile on these
    two loggers is undone too.

    Returns:
        A context manager, also usable as a decorator.
    """
    root, absl = logging.getLogger(), logging.getLogger("absl")
    had_handlers, levels = bool(root.handlers), (root.level, absl.level)
    try:
        yield
    finally:
        if not had_handlers:
            for handler in root.handlers[:]:
                root.removeHandler(handler)
        root.setLevel(levels[0])
        absl.setLevel(levels[1])
