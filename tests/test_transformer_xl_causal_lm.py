"""`TransformerXLCausalLM`: keras-hub's generate on the decode cache gives
`Decoder`'s ids and the core's log-probs; the cached call equals one pass;
every keras-hub sampler runs, seeded ones reproduce, beam search finds
sequences at least as likely as greedy's; stop ids end the mask;
the output is the core's log-probs, so keras-hub's loss is the NLL."""
import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import (Decoder, TransformerXLBackbone, TransformerXLCausalLM, TransformerXLConfig,
                    TxlError)

N_TOKEN, MEM_LEN, SEGMENT = 50, 8, 4
PROMPTS = [[3, 14, 15, 9, 2, 6], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
WIDTH = 30  # max_length: the memory of 8 wraps several times


@pytest.fixture(scope="module")
def causal_lm():
    keras.utils.set_random_seed(0)
    # Large weights: confident predictions, so no near-ties between paths.
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3, mem_len=MEM_LEN,
                                     tgt_len=SEGMENT)
    model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    model.compile(sampler="greedy")
    return model


@pytest.fixture(scope="module")
def graph_lm(causal_lm):
    """The same model, another generate function (samplers recompile it)."""
    model = TransformerXLCausalLM(causal_lm.backbone)
    model.compile(sampler="greedy")
    return model


def padded(prompts, width=WIDTH):
    ids = np.zeros([len(prompts), width], np.int32)
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, :len(p)], mask[i, :len(p)] = p, 1
    return {"token_ids": ids, "padding_mask": mask}


def test_greedy_generate_gives_the_decoders_ids_on_ragged_prompts_with_memory_wrapped(causal_lm):
    out = causal_lm.generate(padded(PROMPTS), stop_token_ids=None)
    assert out["token_ids"].shape == (3, WIDTH) and out["padding_mask"].all()
    decoder = Decoder(causal_lm.core, mem_len=MEM_LEN, segment_len=SEGMENT)
    expected = decoder.generate(PROMPTS, WIDTH, temperature=0).ids
    for row, prompt in enumerate(PROMPTS):
        np.testing.assert_array_equal(out["token_ids"][row, :len(prompt)], prompt)
        new = out["token_ids"][row, len(prompt):]
        np.testing.assert_array_equal(new, expected[row, :len(new)], err_msg=f"row {row}")


def test_generate_step_by_step_log_probs_are_the_cores(causal_lm, graph_lm):
    """The cache's log-probs after each id equal the core reading the same
    ids segment by segment with the same memory (the Decoder's log-probs)."""
    prompt = PROMPTS[0]
    graph_lm.compile(sampler="greedy")
    out = graph_lm.generate(padded([prompt]), stop_token_ids=None)["token_ids"][0]
    decoder = Decoder(causal_lm.core, mem_len=MEM_LEN, segment_len=SEGMENT)
    expected = decoder.generate([prompt], WIDTH - len(prompt), temperature=0)
    inputs = padded([prompt])
    _, cache = causal_lm._build_cache(tf.constant(inputs["token_ids"]),
                                      tf.constant(inputs["padding_mask"]))
    log_probs = [cache["log_probs"]]
    for token in out[len(prompt):-1]:
        lp, _, cache = causal_lm.call_with_cache(tf.constant([[token]]), cache)
        log_probs.append(lp[:, 0])
    log_probs = np.concatenate([lp.numpy() for lp in log_probs])
    chosen = log_probs[np.arange(len(log_probs)), out[len(prompt):]]
    np.testing.assert_allclose(chosen, expected.log_probs[0], atol=1e-5)


@pytest.mark.parametrize("history", [0, 5, 8, 13])  # empty, partly filled, full, wrapped
def test_call_with_cache_token_by_token_equals_the_core(causal_lm, history):
    """Ids read one at a time on the cache, after a history read into the
    memory, give the core's log-probs for the same ids on the same memory;
    while everything read fits the memory (up to `mem_len + 1` ids), they
    are one pass over the whole sequence."""
    rng = np.random.default_rng(history)
    length = max(MEM_LEN + 1, history + 4)
    ids = rng.integers(0, N_TOKEN, [2, length]).astype(np.int32)
    core = causal_lm.core
    memory = core.initial_memory(2, mem_len=MEM_LEN)
    for t in range(history):  # the history, token by token from an empty memory
        _, memory = core(ids[:, t:t + 1], memory)
    ring = core.decode_cache(memory)
    cache = {name: getattr(ring, name) for name in ("mems", "keys", "values", "valid",
                                                      "row_slot")}
    cached = []
    for t in range(history, length):
        lp, _, cache = causal_lm.call_with_cache(tf.constant(ids[:, t:t + 1]), cache)
        expected, memory = core(ids[:, t:t + 1], memory)
        # float32 sums in another order, on log-probs of up to ~8 in magnitude
        np.testing.assert_allclose(lp.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
        cached.append(lp.numpy()[:, 0])
    if length <= MEM_LEN + 1:
        one_pass, _ = core(ids, core.initial_memory(2, mem_len=0))
        np.testing.assert_allclose(np.stack(cached, 1), one_pass.numpy()[:, history:],
                                   rtol=1e-5, atol=1e-5)


def test_call_with_cache_takes_one_id_per_row(causal_lm):
    _, cache = causal_lm._build_cache(tf.constant(padded(PROMPTS)["token_ids"]),
                                      tf.constant(padded(PROMPTS)["padding_mask"]))
    with pytest.raises(TxlError, match=r"one id per row"):
        causal_lm.call_with_cache(tf.constant([[1, 2]] * 3), cache)


def test_call_with_cache_takes_numpy_ids_as_its_docstring_says(causal_lm):
    """`token_ids: int [B, 1]`: a numpy array reads as the tensor does, and
    one of another shape is the same TxlError (it was an AttributeError)."""
    _, cache = causal_lm._build_cache(tf.constant(padded(PROMPTS)["token_ids"]),
                                      tf.constant(padded(PROMPTS)["padding_mask"]))
    ids = np.array([[1], [2], [3]], np.int32)
    want, _, _ = causal_lm.call_with_cache(tf.constant(ids), cache)
    got, _, _ = causal_lm.call_with_cache(ids, cache)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(TxlError, match=r"one id per row"):
        causal_lm.call_with_cache(np.array([1, 2, 3], np.int32), cache)


def assert_keeps_the_prompts(token_ids, prompts=PROMPTS):
    for row, prompt in enumerate(prompts):
        np.testing.assert_array_equal(token_ids[row, :len(prompt)], prompt)
    assert ((token_ids >= 0) & (token_ids < N_TOKEN)).all()


# greedy runs above; random, top_k, top_p and beam in the tests below.
def test_contrastive_search_runs_and_keeps_the_prompts(graph_lm):
    graph_lm.compile(sampler="contrastive")
    assert_keeps_the_prompts(graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"])


@pytest.mark.parametrize("sampler, kwargs", [
    (keras_hub.samplers.RandomSampler, {}), (keras_hub.samplers.TopKSampler, {"k": 10}),
    (keras_hub.samplers.TopPSampler, {"p": 0.9})])
def test_seeded_samplers_repeat_under_a_seed_and_differ_under_another(graph_lm, sampler,
                                                                      kwargs):
    graph_lm.compile(sampler=sampler(seed=3, temperature=2.0, **kwargs))
    # The sampler's random state set to where each seed starts (what
    # compiling it anew with that seed does), the generate function compiled once.
    state = graph_lm.sampler.seed_generator.state
    runs = []
    for seed in (3, 3, 4):
        state.assign(keras.random.SeedGenerator(seed).state.value)
        runs.append(graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"])
        assert_keeps_the_prompts(runs[-1])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert (runs[0] != runs[2]).any()  # 3 x 19 or more ids at temperature 2


@pytest.mark.parametrize("temperature", [1e-10, 1e-30])
def test_a_tiny_temperature_samples_greedys_ids(causal_lm, graph_lm, temperature):
    """keras-hub's samplers divide the logits by the temperature; at 1e-10
    XLA's softmax on the CPU made NaN of a model's log-probs (the scaled
    maximum rounded apart from itself; the ids came out as garbage):
    generate hands them log-probs relative to each row's best, floored."""
    greedy = causal_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"]
    graph_lm.compile(sampler=keras_hub.samplers.RandomSampler(temperature=temperature, seed=1))
    np.testing.assert_array_equal(
        graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"], greedy)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("temperature", [1e-10, 1e-30, 0.5, 1.0, 3.0])
def test_sampler_logits_give_the_samplers_probabilities_under_xla(temperature, dtype):
    """Log-probs 12 nats apart (a trained model's best and worst ids): what
    keras-hub's sampler computes of the logits generate hands it, compiled
    by XLA, is softmax(log_probs / temperature) computed in float64 (16-bit
    log-probs too, where the temperature 1e-10 itself would be 0)."""
    from txl_tf.keras_support.keras_hub_samplers import sampler_logits
    rng = np.random.default_rng(0)
    log_probs = np.stack([[-1.7218394, -14.067131], rng.uniform(-14, -1.7, 2)]).astype(np.float32)
    log_probs = np.concatenate([log_probs, rng.uniform(-14, -1.7, (2, 254))], 1)
    log_probs = log_probs.astype(dtype)
    sampler = keras_hub.samplers.RandomSampler(temperature=temperature)
    compiled = tf.function(lambda x: sampler.compute_probabilities(sampler_logits(x, sampler)),
                           jit_compile=True)
    got = compiled(tf.constant(log_probs)).numpy()
    scaled = log_probs.astype(np.float64) / temperature
    expected = np.exp(scaled - scaled.max(-1, keepdims=True))
    np.testing.assert_allclose(got, expected / expected.sum(-1, keepdims=True), atol=1e-6)


def sequence_log_probs(core, token_ids, prompt_len):
    """The core's log-prob of each row's ids after its first `prompt_len`,
    read one id at a time on a memory of `MEM_LEN` (what generation reads:
    the prompt fits the memory, so reading it id by id is reading it whole)."""
    memory = core.initial_memory(len(token_ids), mem_len=MEM_LEN)
    total = np.zeros(len(token_ids))
    for t in range(token_ids.shape[1] - 1):
        log_probs, memory = core(token_ids[:, t:t + 1], memory)
        if t + 1 >= prompt_len:
            total += log_probs.numpy()[np.arange(len(token_ids)), 0, token_ids[:, t + 1]]
    return total


def test_beam_search_finds_sequences_at_least_as_likely_as_greedy(graph_lm):
    """Greedy's ids from `Decoder` (its own decode loop), beam's from
    keras-hub's beam search here, both scored by the core. Beam search may
    prune greedy's path (at 5 beams, one of these rows ends 0.7 nats below
    greedy's); 20 beams keep far more than greedy's one guess, so here they
    find sequences at least as likely."""
    # One length: keras-hub's beams take no prompt ids after the first step.
    prompts = [PROMPTS[0], [7, 1, 2, 3, 4, 5], [9, 9, 8, 1, 2, 3]]
    decoder = Decoder(graph_lm.core, mem_len=MEM_LEN, segment_len=SEGMENT)
    greedy = np.concatenate([prompts, decoder.generate(prompts, WIDTH - len(prompts[0]),
                                                       temperature=0).ids], 1)
    graph_lm.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=20))
    beam = graph_lm.generate(padded(prompts), stop_token_ids=None)["token_ids"]
    assert_keeps_the_prompts(beam, prompts)
    greedy_log_prob, beam_log_prob = np.split(
        sequence_log_probs(graph_lm.core, np.concatenate([greedy, beam]), len(prompts[0])), 2)
    assert (beam_log_prob >= greedy_log_prob - 1e-4).all(), (beam_log_prob, greedy_log_prob)


def test_beam_search_gives_each_row_of_a_ragged_batch_what_it_gets_alone(graph_lm):
    """Each row's beams are scored over the ids it keeps: a row with a longer
    prompt keeps fewer ids, and beams scored on the shortest row's horizon
    (ids then dropped) chose less likely ids than the row alone."""
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, N_TOKEN, length)) for length in (1, 9, 20)]
    graph_lm.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=3))
    batch = graph_lm.generate(padded(prompts), stop_token_ids=None)["token_ids"]
    assert_keeps_the_prompts(batch, prompts)
    for row, prompt in enumerate(prompts):
        alone = graph_lm.generate(padded([prompt]), stop_token_ids=None)["token_ids"][0]
        np.testing.assert_array_equal(batch[row], alone, err_msg=f"row {row}")


@pytest.mark.parametrize("same_length", [False, True])
def test_a_zero_filled_memory_gives_the_decoders_ids_and_log_probs(same_length):
    """Imported TF weights start from attended zero states: a prompt's left
    padding put them farther back than the prompt alone has them (other
    ids and log-probs for lengths that are no multiple of the segment)."""
    keras.utils.set_random_seed(2)
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.2, mem_len=MEM_LEN,
                                     tgt_len=SEGMENT, zero_filled_memory=True,
                                     same_length=same_length)
    model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    model.compile(sampler="greedy")
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, N_TOKEN, length)) for length in (1, 3, 6, 9, 14)]
    inputs = padded(prompts, 18)
    _, cache = model._build_cache(tf.constant(inputs["token_ids"]),
                                  tf.constant(inputs["padding_mask"]))
    decoder = Decoder(model.core, mem_len=MEM_LEN, segment_len=SEGMENT)
    expected = decoder.generate(prompts, 18, temperature=0)
    np.testing.assert_allclose(cache["log_probs"].numpy(), _after_prompts(decoder, prompts),
                               atol=1e-5)
    out = model.generate(inputs, stop_token_ids=None)["token_ids"]
    for row, prompt in enumerate(prompts):
        new = out[row, len(prompt):]
        np.testing.assert_array_equal(new, expected.ids[row, :len(new)], err_msg=f"row {row}")


def _after_prompts(decoder, prompts):
    """The decoder's log-probs after each prompt (nothing generated)."""
    return decoder.generate(prompts, 0).state.next_log_probs


def test_stop_ids_outside_the_vocabulary_are_one_error_and_numpy_ids_work(graph_lm):
    """A stop id outside the vocabulary was taken: -1 (the buffer's fill for
    columns to generate) ended every row at once, all new ids 0, without a
    word; numpy ids (`np.int64`, an array) failed in a dtype mismatch."""
    graph_lm.compile(sampler="greedy")
    for stop in ((-1,), (N_TOKEN,), ("a",), "<eos>", (1.5,)):
        with pytest.raises(TxlError, match=r"stop_token_ids must be"):
            graph_lm.generate(padded(PROMPTS), stop_token_ids=stop)
    free = graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"]
    stop = int(free[0, len(PROMPTS[0]) + 1])
    want = graph_lm.generate(padded(PROMPTS), stop_token_ids=(stop,))
    assert not want["padding_mask"][0].all()
    for given in ((np.int64(stop),), np.array([stop]), [np.int32(stop), stop]):
        got = graph_lm.generate(padded(PROMPTS), stop_token_ids=given)
        for key in ("token_ids", "padding_mask"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=repr(given))


def test_stop_ids_end_each_rows_mask_after_the_first_new_stop(graph_lm):
    graph_lm.compile(sampler="greedy")
    free = graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"]
    stop = int(free[1, len(PROMPTS[1]) + 2])  # row 1's third new id
    out = graph_lm.generate(padded(PROMPTS), stop_token_ids=[stop])
    for row, prompt in enumerate(PROMPTS):
        new = free[row, len(prompt):]
        hits = np.flatnonzero(new == stop)
        end = len(prompt) + (hits[0] + 1 if hits.size else len(new))
        np.testing.assert_array_equal(out["padding_mask"][row], np.arange(WIDTH) < end)
        np.testing.assert_array_equal(out["token_ids"][row, :end], free[row, :end])
    # No stop ids as an empty list: keras-hub's samplers would index its first.
    np.testing.assert_array_equal(
        graph_lm.generate(padded(PROMPTS), stop_token_ids=[])["token_ids"], free)



def test_stop_id_0_ends_a_row_only_where_it_is_generated(graph_lm):
    # The columns to generate held 0 before their ids: keras-hub's samplers
    # read a stop id there as every row's end, and each row got one id, 0.
    graph_lm.compile(sampler="greedy")
    free = graph_lm.generate(padded(PROMPTS), stop_token_ids=None)["token_ids"]
    out = graph_lm.generate(padded(PROMPTS), stop_token_ids=[0])
    for row, prompt in enumerate(PROMPTS):
        hits = np.flatnonzero(free[row, len(prompt):] == 0)
        end = len(prompt) + (hits[0] + 1 if hits.size else WIDTH - len(prompt))
        np.testing.assert_array_equal(out["padding_mask"][row], np.arange(WIDTH) < end)
        np.testing.assert_array_equal(out["token_ids"][row, :end], free[row, :end])
    assert (out["token_ids"] >= 0).all()

def test_empty_left_padded_or_out_of_vocabulary_prompts_are_one_clear_error(causal_lm):
    """XLA drops the compiled step's assertion and the gather's range check,
    so an empty row was continued from the hidden state of padding, and an
    id outside the vocabulary was read as another; a left-padded row was
    read from its padding."""
    with pytest.raises(TxlError, match=r"every prompt needs at least one id; rows \[1\]"):
        causal_lm.generate(padded([[3, 14], []]), stop_token_ids=None)
    with pytest.raises(TxlError, match=f"token id {N_TOKEN} at position \\(1, 1\\) is out of "
                                       f"range for a vocabulary of {N_TOKEN} tokens"):
        causal_lm.generate(padded([[3, 14], [2, N_TOKEN]]), stop_token_ids=None)
    with pytest.raises(TxlError, match="takes {'token_ids', 'padding_mask'}"):
        causal_lm.generate({"token_ids": padded([[3]])["token_ids"]}, stop_token_ids=None)
    left = padded([[3, 14], [2, 5]])
    left["padding_mask"][1] = np.roll(left["padding_mask"][1], 3)  # was read as [0, 0]
    with pytest.raises(TxlError, match=r"must be right-padded .* rows \[1\] are not"):
        causal_lm.generate(left, stop_token_ids=None)


def test_attention_types_without_a_decode_cache_are_refused_with_one_error():
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=MEM_LEN, tgt_len=SEGMENT,
                                     attn_type=2)
    model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    model.compile(sampler="greedy")
    with pytest.raises(TxlError, match="attn_type 2 .* cannot hold its keys"):  # a StagingError
        model.generate(padded(PROMPTS), stop_token_ids=None)


@pytest.mark.parametrize("attn_type,same_length", [(1, False), (2, False), (2, True),
                                                    (3, False), (3, True)])
def test_a_right_padded_row_reads_as_alone_under_every_attention_type(attn_type, same_length):
    """attn_type 2 and 3 count absolute positions from a segment's last key:
    a right-padded row's real tokens sat as many positions further back as
    its padding is long (log-probs off by ~0.1 with nothing said); the rows
    are read with their padding first, so each reads as it does alone."""
    keras.utils.set_random_seed(0)
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3, mem_len=MEM_LEN,
                                     tgt_len=SEGMENT, attn_type=attn_type,
                                     same_length=same_length)
    model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    x = padded([[5, 6, 7, 8, 9], [1, 2, 3], [4]], width=7)
    log_probs = model.predict(x, verbose=0)
    core = model.core
    for row in range(3):
        n = int(x["padding_mask"][row].sum())
        alone = model.predict({k: v[row:row + 1, :n] for k, v in x.items()}, verbose=0)
        np.testing.assert_allclose(log_probs[row, :n], alone[0], atol=1e-5, err_msg=f"row {row}")
        if not same_length:  # the backbone reads from no memory then
            direct, _ = core(x["token_ids"][row:row + 1, :n], core.initial_memory(1, mem_len=0))
            np.testing.assert_allclose(alone[0], direct.numpy()[0], atol=1e-5)


def test_the_output_is_log_probs_so_keras_hubs_loss_is_the_nll(causal_lm):
    x = padded([[5, 6, 7, 8, 9], [1, 2, 3]], width=6)
    y = np.roll(x["token_ids"], -1, axis=1)
    log_probs = causal_lm.predict(x, verbose=0)
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    core = causal_lm.core
    for row in range(2):
        n = int(x["padding_mask"][row].sum())
        alone, _ = core(x["token_ids"][row:row + 1, :n], core.initial_memory(1, mem_len=0))
        np.testing.assert_allclose(log_probs[row, :n], alone.numpy()[0], atol=1e-5)
    weights = x["padding_mask"].astype(np.float32)
    nll = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0]
    causal_lm.compile(optimizer="adam", sampler="greedy")
    loss = causal_lm.evaluate(x, y, sample_weight=weights, verbose=0, return_dict=True)["loss"]
    np.testing.assert_allclose(loss, (nll * weights).sum() / weights.size, rtol=1e-5)


def test_same_length_rows_read_as_the_papers_code_reads_a_fresh_stream():
    # With same_length the window a query sees is counted over the memory's
    # slots: the call read with none, so each position saw only itself.
    from tests.pytorch_fixtures import CASES
    from tests.reference_pytorch_numpy import PytorchReference
    from txl_tf.weights import import_pytorch
    case = CASES["enwik8_paper"]()
    core = import_pytorch(case["state"], same_length=True, mem_len=4)
    causal_lm = TransformerXLCausalLM(TransformerXLBackbone.from_core(core))
    rows = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3]]
    log_probs = causal_lm.predict(padded(rows, width=7), verbose=0)
    for row, ids in enumerate(rows):
        ref = PytorchReference(case["state"], mem_len=4, same_length=True, **case["hyper"])
        want = ref.forward(np.array(ids)[:, None])[:, 0]
        np.testing.assert_allclose(log_probs[row, :len(ids)], want, atol=1e-4)


def test_no_xla_under_a_strategy_over_several_devices_and_a_saved_xla_compile_loads(tmp_path):
    """keras-hub's `compile` under `MirroredStrategy` over two devices (two
    GPUs; here two logical CPUs): `jit_compile=True` was taken and `fit`
    failed with a traceback (one XLA program cannot read the other replica's
    variables, keras-team/keras#19005), and a model saved where "auto" meant
    XLA (any one GPU: Keras saves the value it chose) loaded with it and
    failed the same way. Now True is one `TxlError`, "auto" and a saved True
    are off there, and one device keeps keras-hub's behaviour."""
    from training.strategy import mirrored_strategy
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=MEM_LEN, tgt_len=SEGMENT)
    one = mirrored_strategy(["/cpu:0"])
    with one.scope():
        model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
        model.compile(jit_compile=True)  # one device: as asked
    assert model.jit_compile is True
    model.compile()
    assert model.jit_compile is model._resolve_auto_jit_compile()  # Keras's "auto", untouched
    saved = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    saved.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True, sampler="greedy")
    saved.optimizer.build(saved.trainable_variables)  # as after fit: its slots are saved
    saved.save(tmp_path / "xla.keras")
    two = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with two.scope():
        model = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
        with pytest.raises(TxlError, match=r"^jit_compile=True under MirroredStrategy: its "
                                           r"replicas are on 2 devices"):
            model.compile(jit_compile=True)
        model.compile()
        assert model.jit_compile is False
        loaded = keras.models.load_model(tmp_path / "xla.keras")
    assert loaded.jit_compile is False
    assert loaded.optimizer.get_config()["learning_rate"] == pytest.approx(1e-3)  # restored
    x = padded([[5, 6, 7, 8], [1, 2, 3, 4]], width=4)
    history = loaded.fit(x, np.roll(x["token_ids"], -1, axis=1), batch_size=2, epochs=2,
                         verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert keras.ops.convert_to_numpy(loaded.optimizer.iterations) == 2
