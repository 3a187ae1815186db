"""What `TransformerXLCausalLM.generate` hands keras-hub's samplers, and the
one use of their internals: the loop's final state.

keras-hub's samplers (`keras_hub.samplers.Sampler.__call__`, keras-hub 0.32)
run their decoding loop through `Sampler.run_loop` and return the prompt
alone, dropping the cache the loop carried. `TransformerXLCausalLM.generate`
carries a per-row flag in that cache (the step at which a row's log-probs
stopped being a distribution: an XLA loop cannot raise) and reads it back
here. Importing this module raises if `run_loop` is gone, and
`final_loop_vars` raises where a sampler did not call it.
"""
import keras_hub
import tensorflow as tf

from txl_tf.errors import TxlError

if not hasattr(keras_hub.samplers.Sampler, "run_loop"):
    raise ImportError(f"keras-hub {keras_hub.__version__} has no Sampler.run_loop; "
                      "txl_tf.keras_support.keras_hub_samplers must be updated for this version")


class final_loop_vars:
    """Within it, the final loop variables of `sampler`'s decoding loop
    (`run_loop`'s result) are kept; `cache()` then returns the cache the
    loop carried (keras-hub's samplers carry `(prompt, cache, index, ...)`).
    Python runs at tracing, so a compiled generate reads them once.

    Args:
        sampler: a `keras_hub.samplers.Sampler`.
    """

    def __init__(self, sampler):
        self.sampler, self.final = sampler, []

    def __enter__(self):
        run_loop = type(self.sampler).run_loop

        def kept(*args, **kwargs):
            self.final.append(run_loop(self.sampler, *args, **kwargs))
            return self.final[-1]
        self.sampler.run_loop = kept
        return self

    def __exit__(self, *exc):
        del self.sampler.run_loop

    def cache(self):
        """The loop's final cache (a dict).

        Returns:
            The second of the loop's final variables.
        """
        if len(self.final) != 1 or not isinstance(self.final[0][1], dict):
            raise TxlError(f"keras-hub {keras_hub.__version__}'s {type(self.sampler).__name__} "
                           "did not run one decoding loop carrying the cache second: "
                           "txl_tf.keras_support.keras_hub_samplers must be updated for it")
        return self.final[0][1]


def sampler_logits(log_probs, sampler):
    """The logits handed to a keras-hub sampler: each row's log-probs less
    its largest, floored at 200 temperatures below it.

    keras-hub's samplers take `softmax(logits / temperature)`. XLA on the
    CPU computes `logits / temperature` once for the row's maximum and
    once for the exponent, rounded differently: at temperature 1e-10 the
    best id's exponent came out -167, not 0 (a float32 ulp there is 2048),
    every `exp` was 0 and the softmax NaN, and a sampler drew garbage.
    Relative to the best, floored, the scaled logits lie within 200 of 0,
    where such round-off is tiny, and every probability is what the
    log-probs give: a shift changes no softmax, `exp(-200)` is 0 in float32.

    Args:
        log_probs: `[rows, n_token]` float log-probs, every row usable.
        sampler: the `keras_hub.samplers.Sampler` to be handed them (its
            `temperature`; 1 where it has none).

    Returns:
        `[rows, n_token]` float32 logits (as the samplers compute; a tiny
        temperature is 0 in 16 bits).
    """
    temperature = tf.cast(getattr(sampler, "temperature", 1.0), tf.float32)  # or a tensor
    log_probs = tf.cast(log_probs, tf.float32)
    relative = log_probs - tf.reduce_max(log_probs, axis=-1, keepdims=True)
    return tf.maximum(relative, -200.0 * temperature)
