"""Initialisers of the paper's code: N(0, init_std) kernels, N(0, proj_init_std) projections."""
import keras


def normal(std):
    """A (serialisable) normal initialiser with mean 0 and the given std."""
    return keras.initializers.RandomNormal(mean=0.0, stddev=std)
