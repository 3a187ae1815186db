"""A reference that Keras and tf.Module tracking must not follow."""


class Untracked:
    """Holds objects whose weights or variables belong elsewhere or must not
    be saved (tied weights, a wrapped core, evaluation memory), so they are
    not tracked, saved or counted twice. `value` is the one object passed,
    or the tuple of several."""

    def __init__(self, *objects):
        self.value = objects[0] if len(objects) == 1 else objects
