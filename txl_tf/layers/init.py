"""Initialisers of the paper's code: N(0, init_std) kernels, N(0, proj_init_std) projections.

A model whose weights are about to be loaded need not draw random ones:
inside `skip_random_init()` `normal` gives zeros, which costs one buffer per
weight instead of the several temporaries of a random draw (at WT103 sizes
that is the difference between 1x and 3x the weights' size in memory).
"""
import contextlib
import threading

import keras

_state = threading.local()


def normal(std):
    """A (serialisable) normal initialiser with mean 0 and the given std
    (zeros inside `skip_random_init`)."""
    if getattr(_state, "skip", False):
        return keras.initializers.Zeros()
    return keras.initializers.RandomNormal(mean=0.0, stddev=std)


@contextlib.contextmanager
def skip_random_init():
    """Layers built inside start from zeros: use only when every weight is
    loaded right after."""
    previous = getattr(_state, "skip", False)
    _state.skip = True
    try:
        yield
    finally:
        _state.skip = previous
