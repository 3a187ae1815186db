"""A reference that Keras and tf.Module tracking must not follow."""


class Untracked:
    """Holds a layer whose weights belong elsewhere (tied weights, a wrapped
    core), so it is not tracked, saved or counted twice."""

    def __init__(self, layer):
        self.layer = layer
