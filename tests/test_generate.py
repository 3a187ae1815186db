"""Incremental decoding agrees with single passes of the core; sampling is
seeded and respects top-k (the `Decoder`, which replaced the first API's
`Generator`)."""
import keras
import numpy as np
import pytest

from txl_tf import Decoder, TransformerXL, TransformerXLConfig


def make_core():
    keras.utils.set_random_seed(0)
    # Large weights: confident predictions, so argmax ties cannot flip a comparison.
    return TransformerXL(TransformerXLConfig.preset("tiny", dropout=0.0, n_token=50,
                                                    init_std=0.3))


def test_greedy_generation_equals_argmax_of_full_passes():
    core = make_core()
    prompt = np.random.default_rng(0).integers(0, 50, (2, 11)).astype(np.int32)
    new = Decoder(core, mem_len=40, segment_len=4).generate(prompt, 6, temperature=0).ids
    seq = prompt
    for t in range(6):  # re-read everything each time with no memory
        log_probs, _ = core(seq, core.initial_memory(2, mem_len=0))
        expected = np.argmax(log_probs.numpy()[:, -1], -1)
        np.testing.assert_array_equal(new[:, t], expected)
        seq = np.concatenate([seq, expected[:, None].astype(np.int32)], 1)


def test_sampling_is_seeded_and_respects_top_k():
    core = make_core()
    decoder = Decoder(core)
    prompt = np.zeros((3, 2), np.int32)
    a = decoder.generate(prompt, 5, temperature=1.0, top_k=3, seed=7).ids
    b = decoder.generate(prompt, 5, temperature=1.0, top_k=3, seed=7).ids
    np.testing.assert_array_equal(a, b)
    log_probs, _ = core(prompt, core.initial_memory(3, mem_len=0))
    top3 = np.argsort(log_probs.numpy()[:, -1], -1)[:, -3:]
    assert all(a[i, 0] in top3[i] for i in range(3))
    # Another seed, other draws: at temperature 100 the top 3 are near-uniform,
    # and 15 draws repeat by chance with probability ~3^-15.
    assert not np.array_equal(a, decoder.generate(prompt, 5, temperature=100.0, top_k=3,
                                                  seed=8).ids)


def test_bad_sampling_arguments_are_named():
    decoder = Decoder(make_core())
    prompt = np.zeros((1, 2), np.int32)
    for kwargs, message in (({"top_k": 51}, r"top_k must be an integer in \[0, 50\]"),
                            ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
                            ({"max_new_tokens": -1}, "max_new_tokens must be an integer >= 0"),
                            # were a ZeroDivisionError and an UnboundLocalError
                            ({"segment_len": 0}, "segment_len must be an integer >= 1, got 0"),
                            ({"segment_len": -3}, "segment_len must be an integer >= 1")):
        call = {"max_new_tokens": 3, **kwargs}
        with pytest.raises(ValueError, match=message):
            decoder.generate(prompt, **call)
    with pytest.raises(ValueError, match="mem_len must be an integer >= 0, got -1"):
        Decoder(make_core(), mem_len=-1)
    with pytest.raises(ValueError, match="segment_len must be an integer >= 1, got 0"):
        Decoder(make_core(), segment_len=0)  # was taken as "the config's"


def test_the_removed_generator_names_what_replaces_it():
    import txl_tf  # noqa: F401  (installs the hint)
    with pytest.raises(ImportError, match=r"generation\.generate was removed.*Decoder"):
        from txl_tf.generation.generate import Generator  # noqa: F401
