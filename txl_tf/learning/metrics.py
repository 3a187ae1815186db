"""Token-weighted language-model metrics: mean NLL, bits per token, perplexity."""
import math

import keras
import tensorflow as tf

from txl_tf.errors import TxlError


@keras.saving.register_keras_serializable(package="txl_tf")
class TokenNLL(keras.metrics.Metric):
    """Accumulates per-token NLL (nats) and reports it as `kind`:
    `"nll"` (mean nats), `"bpc"` (bits per token) or `"ppl"` (perplexity)."""

    KINDS = ("nll", "bpc", "ppl")

    def __init__(self, kind="nll", name=None, **kwargs):
        if kind not in self.KINDS:
            raise TxlError(f"kind must be one of {self.KINDS}, got {kind!r}")
        super().__init__(name=name or kind, **kwargs)
        self.kind = kind
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="total", aggregation="sum")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float32",
                                       name="count", aggregation="sum")

    def update_state(self, nll, sample_weight=None):
        nll = tf.cast(nll, tf.float32)
        weight = tf.ones_like(nll) if sample_weight is None else tf.cast(sample_weight, tf.float32)
        self.total.assign_add(tf.reduce_sum(nll * weight))
        # After the NLL: a count of static shape alone would be added even by
        # the step whose batch never comes (the end of data of unknown length).
        with tf.control_dependencies([nll]):
            self.count.assign_add(tf.reduce_sum(weight))

    def result(self):
        return self.result_of(self.total, self.count)

    def result_of(self, total, count):
        """The metric of an NLL `total` over `count` tokens (e.g. sums over replicas).

        Args:
            total: summed NLL in nats (a float32 scalar).
            count: summed token weights.

        Returns:
            The mean NLL, bits per token or perplexity (`kind`); the mean of no
            tokens is taken as 0.
        """
        mean = tf.math.divide_no_nan(tf.cast(total, tf.float32), tf.cast(count, tf.float32))
        if self.kind == "bpc":
            return mean / math.log(2.0)
        if self.kind == "ppl":
            return tf.exp(mean)
        return mean

    def get_config(self):
        return {**super().get_config(), "kind": self.kind}
