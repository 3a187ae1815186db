"""Running XLA-compiled functions on the device that holds the weights.

A `tf.function(jit_compile=True)` runs on the device it is called from (the
default one: the first GPU where there is one), whatever device its variables
are on; reading a variable of another device is then an error ("Trying to
access resource ... located in device"). A model made under
`OneDeviceStrategy("/cpu:0")` on a machine with a GPU, or under `"/gpu:1"`,
has its weights elsewhere: its compiled functions are called under that
device here.
"""
import tensorflow as tf


def weights_device(layer):
    """The device of `layer`'s first weight (None: it has none yet).

    Args:
        layer: a built Keras layer or model.

    Returns:
        A TensorFlow device name, or None.
    """
    weights = layer.weights
    return weights[0].value.device if weights else None


def weights_key(layer):
    """What a graph traced on `layer` depends on besides its weights'
    values: each weight, by path and identity (`enable_lora` and
    `quantize` add or replace weights, so a graph traced before reads the
    model as it was).

    Args:
        layer: a Keras layer or model.

    Returns:
        A hashable tuple.
    """
    return tuple((w.path, id(w)) for w in layer.weights)


def kept_on(layer, name, make):
    """What `make()` returns, kept on `layer` under `name` until `layer`'s
    weights change (`weights_key`): graphs traced on a layer, which
    TensorFlow never frees, made once per layer instead of once per call.

    Args:
        layer: a Keras layer or model.
        name: the attribute the value is kept under.
        make: a function of no arguments that makes the value.

    Returns:
        The kept value.
    """
    key = weights_key(layer)
    kept = layer.__dict__.get(name)
    if kept is None or kept[0] != key:
        kept = layer.__dict__[name] = (key, make())
    return kept[1]


def strategy_device(strategy):
    """The device of a `tf.distribute.OneDeviceStrategy` (its variables'),
    else None (another strategy places its own functions).

    Args:
        strategy: a `tf.distribute.Strategy`, e.g. a model's
            `distribute_strategy`.

    Returns:
        A TensorFlow device name, or None.
    """
    if not isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return None
    return strategy.extended.worker_devices[0]


def on_device(function, device):
    """`function`, each call made under `tf.device(device)`.

    Args:
        function: a callable (e.g. a compiled `tf.function`).
        device: a device name; None: `function` itself.

    Returns:
        The wrapped callable (its other attributes are `function`'s; a
        wrapped one is not wrapped again).
    """
    if function is None or device is None or isinstance(function, _OnDevice):
        return function
    return _OnDevice(function, device)


class _OnDevice:
    def __init__(self, function, device):
        self.function, self.device = function, device

    def __call__(self, *args, **kwargs):
        with tf.device(self.device):
            return self.function(*args, **kwargs)

    def __getattr__(self, name):  # e.g. a tf.function's get_concrete_function
        if name == "function":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.function, name)
