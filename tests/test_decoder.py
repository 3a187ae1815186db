"""The compiled decoder and the runtimes' generation: teacher-forced greedy
checks, seeds, batches of any lengths, stop ids, resuming and conversations,
on the Keras core, ONNX Runtime and the reloaded SavedModel."""
import keras
import numpy as np
import pytest

from export import export_onnx, export_saved_model, open_runtime
from export.runtime import RuntimeInputError
from txl_tf import Decoder, TransformerXL, TransformerXLConfig, TxlError
from bfloat16_cpu import needs_bfloat16_matmuls

N_TOKEN, MEM_LEN = 50, 64


@pytest.fixture(scope="module")
def core():
    keras.utils.set_random_seed(0)
    # Large weights: confident predictions, so no near-ties between backends.
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3))


@pytest.fixture(scope="module")
def backends(core, tmp_path_factory):
    out = tmp_path_factory.mktemp("decoder")
    export_onnx(core, str(out / "model.onnx"), MEM_LEN, log_probs="last")
    export_saved_model(core, str(out / "saved_model"), MEM_LEN)
    return {"keras": Decoder(core, mem_len=MEM_LEN),
            "onnx": open_runtime(str(out / "model.onnx"), device="cpu"),
            "saved_model": open_runtime(str(out / "saved_model"), device="cpu")}


PROMPTS = [[3, 14, 15, 9, 2, 6], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def test_greedy_is_the_teacher_forced_argmax_on_every_backend(core, backends):
    results = {name: b.generate(PROMPTS, 8, temperature=0) for name, b in backends.items()}
    for name, out in results.items():
        assert out.ids.shape == (3, 8) and (out.lengths == 8).all()
        for prompt, ids, lps in zip(PROMPTS, out.ids, out.log_probs):
            seq = np.array([list(prompt) + list(ids)], np.int32)
            one_pass = core(seq, core.initial_memory(1, 0))[0].numpy()[0]
            positions = np.arange(len(prompt) - 1, seq.shape[1] - 1)
            np.testing.assert_array_equal(ids, one_pass[positions].argmax(-1), err_msg=name)
            np.testing.assert_allclose(lps, one_pass[positions, ids], atol=1e-4, err_msg=name)
    np.testing.assert_array_equal(results["onnx"].ids, results["keras"].ids)
    np.testing.assert_array_equal(results["saved_model"].ids, results["keras"].ids)


SAMPLED = dict(temperature=1.0, top_k=20, top_p=0.95, repetition_penalty=1.2, seed=11)


def test_a_seed_reproduces_sampled_output_across_runs_and_backends(backends):
    ids = {name: b.generate(PROMPTS, 12, **SAMPLED).ids for name, b in backends.items()}
    np.testing.assert_array_equal(backends["keras"].generate(PROMPTS, 12, **SAMPLED).ids,
                                  ids["keras"])
    for name in ("onnx", "saved_model"):
        np.testing.assert_array_equal(ids[name], ids["keras"], err_msg=name)
    other = backends["keras"].generate(PROMPTS, 12, **{**SAMPLED, "seed": 12}).ids
    assert (other != ids["keras"]).any()


@pytest.mark.parametrize("name, mem_len", [("keras", 16), ("onnx", MEM_LEN)])
def test_a_batch_of_lengths_1_7_40_gives_each_row_what_it_gets_alone(core, backends, name,
                                                                     mem_len):
    backend = Decoder(core, mem_len=mem_len, jit_compile=False) if name == "keras" \
        else backends[name]
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, N_TOKEN, n) for n in (1, 7, 40)]
    for settings in ({"temperature": 0}, SAMPLED):
        batch = backend.generate(prompts, 10, segment_len=16, **settings)
        seed = settings.get("seed", 0)
        for i, prompt in enumerate(prompts):
            alone = backend.generate([prompt], 10, segment_len=16, **{**settings,
                                                                      "seed": seed + i})
            np.testing.assert_array_equal(batch.ids[i], alone.ids[0])
            np.testing.assert_allclose(batch.log_probs[i], alone.log_probs[0], atol=1e-5)


@pytest.mark.parametrize("name", ["keras", "onnx"])
def test_stop_ids_end_each_row_on_its_own(backends, name):
    backend = backends[name]
    free = backend.generate(PROMPTS, 10, **SAMPLED)
    stop = int(free.ids[0, 3])
    out = backend.generate(PROMPTS, 10, stop_ids=[stop], pad_id=0, **SAMPLED)
    for row, ids in enumerate(free.ids):
        hits = np.flatnonzero(ids == stop)
        n = hits[0] + 1 if hits.size else 10
        assert out.lengths[row] == n
        np.testing.assert_array_equal(out.ids[row, :n], ids[:n])
        assert (out.ids[row, n:] == 0).all() and (out.log_probs[row, n:] == 0).all()
        assert out.state.done[row] == bool(hits.size)
    assert out.lengths.min() < 10  # row 0 stopped
    # a stopped row's memory is what it was right after reading its stop id
    alone = backend.generate([PROMPTS[0]], int(out.lengths[0]), **SAMPLED)
    np.testing.assert_allclose(_numpy(out.memory)[0][:, :1], _numpy(alone.memory)[0],
                               atol=1e-5)
    np.testing.assert_array_equal(_numpy(out.memory)[1][:1], _numpy(alone.memory)[1])


def _numpy(memory):
    return (np.asarray(memory[0]) if not hasattr(memory, "numpy") else memory.numpy()[0],
            np.asarray(memory[1]) if not hasattr(memory, "numpy") else memory.numpy()[1])


@pytest.mark.parametrize("name", ["keras", "onnx"])
def test_resume_goes_on_exactly_as_one_longer_call(backends, name):
    backend = backends[name]
    whole = backend.generate(PROMPTS, 14, **SAMPLED)
    first = backend.generate(PROMPTS, 9, **SAMPLED)
    rest = backend.generate(None, 5, resume=first.state)
    np.testing.assert_array_equal(np.concatenate([first.ids, rest.ids], 1), whole.ids)
    # float32 summation order: the resumed call projects the memory's keys
    # in one matmul where the longer call projected them token by token
    np.testing.assert_allclose(np.concatenate([first.log_probs, rest.log_probs], 1),
                               whole.log_probs, atol=5e-6)


@pytest.mark.parametrize("name", ["keras", "onnx", "saved_model"])
def test_a_next_turn_with_resume_is_the_prompt_read_on_the_memory(backends, name):
    backend = backends[name]
    first = backend.generate(PROMPTS, 4, temperature=0)
    turn = backend.generate([[5, 5], [6], [7, 8, 9]], 4, resume=first.state, temperature=0)
    reply = backend.generate([[5, 5], [6], [7, 8, 9]], 4, memory=first.memory, temperature=0)
    np.testing.assert_array_equal(turn.ids, reply.ids)
    np.testing.assert_allclose(turn.log_probs, reply.log_probs, atol=1e-5)


@pytest.mark.parametrize("name", ["keras", "onnx", "saved_model"])
def test_a_resume_and_a_next_turn_never_project_the_memory_again(backends, name,
                                                                  monkeypatch):
    """The decode cache goes on in the state: a resume, a streamed resume (one
    compiled call per chunk) and a next turn read on from it (and the
    compiled decoder's position keys with it)."""
    backend = backends[name]
    first = backend.generate(PROMPTS, 4, temperature=0)
    hooks = ("_project", "_position_keys") if name == "keras" else ("_decode_init",)
    projections = []
    for hook in hooks:
        project = getattr(backend, hook)
        monkeypatch.setattr(backend, hook,
                            lambda *a, project=project: projections.append(1) or project(*a))
    rest = backend.generate(None, 6, resume=first.state, stream=lambda ids: None,
                            stream_every=2)
    turn = backend.generate([[5, 5], [6], [7, 8, 9]], 4, resume=rest.state, temperature=0)
    assert not projections
    reply = backend.generate([[5, 5], [6], [7, 8, 9]], 4, memory=rest.memory, temperature=0)
    np.testing.assert_array_equal(turn.ids, reply.ids)
    np.testing.assert_allclose(turn.log_probs, reply.log_probs, atol=1e-5)


@pytest.mark.parametrize("source,target", [("keras", "onnx"), ("saved_model", "onnx"),
                                           ("onnx", "saved_model"), ("onnx", "keras")])
def test_a_state_resumes_on_another_backend(backends, source, target):
    whole = backends[source].generate(PROMPTS, 14, **SAMPLED)
    first = backends[source].generate(PROMPTS, 9, **SAMPLED)
    rest = backends[target].generate(None, 5, resume=first.state)
    np.testing.assert_array_equal(np.concatenate([first.ids, rest.ids], 1), whole.ids)


def test_a_resumed_memory_of_the_wrong_length_is_named(core, backends):
    other = Decoder(core, mem_len=MEM_LEN + 3).generate(PROMPTS, 2, **SAMPLED)
    with pytest.raises(RuntimeInputError, match="mems must have shape"):
        backends["onnx"].generate(None, 3, resume=other.state)


@pytest.mark.parametrize("name", ["keras", "saved_model"])
def test_the_returned_memory_continues_a_conversation(backends, name):
    backend = backends[name]
    first = backend.generate(PROMPTS, 6, temperature=0)
    replies = [[4, 4, 8], [9, 1], [30]]
    second = backend.generate(replies, 6, temperature=0, memory=first.memory)
    for row in range(3):  # everything in one prompt (memory long enough for all of it)
        history = list(PROMPTS[row]) + list(first.ids[row]) + replies[row]
        once = backend.generate([history], 6, temperature=0)
        np.testing.assert_array_equal(second.ids[row], once.ids[0])
        np.testing.assert_allclose(second.log_probs[row], once.log_probs[0], atol=1e-5)


@pytest.mark.parametrize("name", ["keras", "onnx"])
def test_streaming_sees_every_id_once_and_changes_nothing(backends, name):
    chunks = []
    out = backends[name].generate(PROMPTS, 11, stream=chunks.append, stream_every=4, **SAMPLED)
    np.testing.assert_array_equal(np.concatenate(chunks, 1), out.ids)
    if name == "keras":
        assert [c.shape[1] for c in chunks] == [4, 4, 3]
    np.testing.assert_array_equal(out.ids, backends[name].generate(PROMPTS, 11, **SAMPLED).ids)


def test_xla_and_plain_graph_decoders_agree(core, backends):
    plain = Decoder(core, mem_len=MEM_LEN, jit_compile=False).generate(PROMPTS, 8, **SAMPLED)
    xla = backends["keras"].generate(PROMPTS, 8, **SAMPLED)
    np.testing.assert_array_equal(plain.ids, xla.ids)
    np.testing.assert_allclose(plain.log_probs, xla.log_probs, atol=1e-5)


def test_new_prompts_compile_once_per_power_of_two_of_lengths(core):
    """A new prompt's first segment is read under XLA left-padded to a power
    of two: lengths 3, 5 and 7 share one program, and each row still gets the
    teacher-forced result."""
    core = TransformerXL(core.config)  # its own graphs: none traced by the tests before
    decoder = Decoder(core, mem_len=MEM_LEN)
    for length in (3, 5, 7):
        prompt = list(range(1, length + 1))
        out = decoder.generate([prompt], 4, temperature=0)
        seq = np.array([prompt + list(out.ids[0])], np.int32)
        one_pass = core(seq, core.initial_memory(1, 0))[0].numpy()[0]
        np.testing.assert_array_equal(out.ids[0], one_pass[length - 1:-1].argmax(-1))
    assert decoder._first.experimental_get_tracing_count() == 1


def test_decoders_of_one_core_share_its_compiled_graphs(core):
    """A Decoder made per call (a notebook cell, `continue_text`) compiles
    nothing again: TensorFlow keeps every XLA program it compiled (30 MB at
    `tiny`), so graphs made per Decoder grew the process at every call."""
    def traces(decoder):
        return [f.experimental_get_tracing_count() for f in
                (decoder._first, decoder._project, decoder._position_keys, decoder._decode)]

    Decoder(core, mem_len=MEM_LEN).generate([[1, 2, 3]], 4, temperature=0)
    before = traces(Decoder(core, mem_len=MEM_LEN))
    assert min(before) >= 1
    for _ in range(3):
        decoder = Decoder(core, mem_len=MEM_LEN, segment_len=4)  # settings outside the graphs
        decoder.generate([[1, 2, 3]], 4, temperature=0)
        assert traces(decoder) == before
    assert traces(Decoder(core, mem_len=MEM_LEN, jit_compile=False)) != before


def test_any_float_memory_in_and_float32_out(core):
    """A float64 memory (fresh, or holding states) is read as float32."""
    decoder = Decoder(core, mem_len=8)
    for valid in (False, True):
        memory = (np.zeros([2, 1, 8, 32]), np.full([1, 8], valid))
        out = decoder.generate([[1, 2, 3]], 2, temperature=0, memory=memory)
        assert out.memory.mems.dtype == "float32" and out.memory.mems.shape == (2, 1, 8, 32)
        want = decoder.generate(  # the same decoder, on the float32 memory
            [[1, 2, 3]], 2, temperature=0,
            memory=(np.zeros([2, 1, 8, 32], np.float32), np.full([1, 8], valid)))
        np.testing.assert_array_equal(out.ids, want.ids)


@pytest.mark.parametrize("overrides, mem_len", [(dict(zero_filled_memory=True), 5),
                                                (dict(), 0)])
def test_zero_filled_and_no_memory_decode_as_the_plain_core(overrides, mem_len):
    """Greedy decoding equals feeding the core one token at a time (a
    zero-filled memory attends its zero slots; mem_len 0 remembers nothing)."""
    keras.utils.set_random_seed(1)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3,
                                                   **overrides))
    prompt = [4, 8, 15]
    out = Decoder(core, mem_len=mem_len).generate([prompt], 9, temperature=0)
    memory = core.initial_memory(1, mem_len)
    log_probs, memory = core(np.array([prompt], np.int32), memory)
    for i in range(9):
        want = int(np.argmax(log_probs[0, -1]))
        assert out.ids[0, i] == want
        log_probs, memory = core(np.array([[want]], np.int32), memory)
    np.testing.assert_allclose(out.memory.mems, memory.mems, atol=1e-5)


@pytest.mark.parametrize("same_length,convention", [(False, "tf"), (True, "tf"),
                                                    (True, "pytorch")])
def test_a_non_finite_memory_slot_is_an_error_or_leaves_the_memory(same_length, convention):
    """The decoder's check reads only the last position's log-probs; it is
    exact: for NaN in each valid slot, in each layer, either the step is an
    error naming the stream, or no NaN is left in the new memory."""
    from txl_tf import Memory, NonFiniteMemoryError
    keras.utils.set_random_seed(1)
    config = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, mem_len=6, tgt_len=3,
                                        same_length=same_length,
                                        same_length_convention=convention)
    decoder = Decoder(TransformerXL(config), mem_len=6, jit_compile=False)
    rng = np.random.default_rng(0)
    mems = rng.normal(size=(2, 2, 6, 32)).astype(np.float32)
    mask = np.ones([2, 6], bool)
    ids = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    raised = 0
    for layer in range(2):
        for slot in range(6):
            dirty = mems.copy()
            dirty[layer, 1, slot, 0] = np.nan
            try:
                _, memory = decoder.step_last(ids, Memory(dirty, mask))
            except NonFiniteMemoryError as err:
                assert err.rows == [1]
                raised += 1
                continue
            assert np.isfinite(memory.mems.numpy()).all(), (layer, slot)
    assert raised >= 2 * (6 - 3)  # every slot that stays in the memory is seen
    with pytest.raises(NonFiniteMemoryError, match=r"stream\(s\) 1:"):
        poisoned = mems.copy()
        poisoned[0, 1, -1] = np.inf
        decoder.generate([[1, 2], [3]], 3, memory=Memory(poisoned, mask))


def test_a_clamped_model_decodes_on_its_distinct_position_keys_alone():
    """With `clamp_len` 3 and 6 memory slots, the decoder keeps keys for the
    4 distinct distances only; 20 greedy steps (the ring wrapped three
    times) give the core's token-by-token ids, log-probs and memory."""
    keras.utils.set_random_seed(2)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3,
                                                   clamp_len=3))
    memory = core.initial_memory(1, 6)
    assert core.decode_position_keys(core.decode_cache(memory))[0].shape[-1] == 4
    prompt = [4, 8, 15, 16]
    out = Decoder(core, mem_len=6).generate([prompt], 20, temperature=0)
    log_probs, memory = core(np.array([prompt], np.int32), memory)
    for i in range(20):
        want = int(np.argmax(log_probs[0, -1]))
        assert out.ids[0, i] == want
        np.testing.assert_allclose(out.log_probs[0, i], log_probs[0, -1, want], atol=1e-4)
        log_probs, memory = core(np.array([[want]], np.int32), memory)
    np.testing.assert_allclose(out.memory.mems, memory.mems, atol=1e-5)


@pytest.mark.parametrize("policy,tolerance", [
    ("mixed_float16", 0.02), pytest.param("mixed_bfloat16", 0.15, marks=needs_bfloat16_matmuls)])
def test_a_16_bit_decoder_keeps_its_cache_in_16_bits_and_scores_as_float32(policy, tolerance):
    """The decoder of a mixed-precision core (the GPU's 16-bit cache, run
    on the CPU): its ring of keys and values is in the compute dtype, its
    log-probs float32, and each id it picks is scored as the float32 core
    scores it, a token at a time on its memory of 8 (within the
    precision's tolerance, as `test_model`'s mixed-precision check)."""
    keras.utils.set_random_seed(0)
    config = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.3)
    reference = TransformerXL(config)
    reference(np.zeros([1, 1], np.int32), reference.initial_memory(1, 0))
    keras.mixed_precision.set_global_policy(policy)
    try:
        core = TransformerXL(config)
        core(np.zeros([1, 1], np.int32), core.initial_memory(1, 0))
        core.set_weights(reference.get_weights())
        out = Decoder(core, mem_len=8).generate(PROMPTS, 12, temperature=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    cache = out.state.cache.tensors
    assert cache.keys[0].dtype == cache.values[0].dtype == policy.split("_")[1]
    assert out.log_probs.dtype == np.float32 and np.isfinite(out.log_probs).all()
    for prompt, ids, lps in zip(PROMPTS, out.ids, out.log_probs):
        # The float32 core on the same ids: the prompt, then one id at a time.
        log_probs, memory = reference(np.array([prompt], np.int32),
                                      reference.initial_memory(1, 8))
        for i, token in enumerate(ids):
            got, want = lps[i], log_probs.numpy()[0, -1, token]
            assert abs(np.exp(got) - np.exp(want)) < tolerance and abs(got - want) < 5 * tolerance
            log_probs, memory = reference(np.array([[token]], np.int32), memory)


def test_a_float16_step_that_overflows_mid_decode_is_named_not_sampled_as_an_id():
    """Under mixed_float16 the prompt reads finite, then the generated id 7,
    whose embedding overflows float16, makes the next log-probs NaN: the
    sampler turned them into id n_token (greedy) or -1 (sampled), which a
    plain graph refused with TensorFlow's out-of-range assertion and XLA's
    gather clamped to a real row (generation went on, returning id 50)."""
    from txl_tf import NonFiniteMemoryError
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN,
                                                        tie_weight=False))
    finally:
        keras.config.set_dtype_policy("float32")
    table = core.word_emb.tables[0]
    table.assign(table.numpy() * (np.arange(N_TOKEN) != 7)[:, None]
                 + 60000.0 * (np.arange(N_TOKEN) == 7)[:, None])  # x sqrt(d_model): inf
    bias = core.crit.biases[0]
    bias.assign(np.where(np.arange(N_TOKEN) == 7, 50.0, 0.0))  # greedy draws 7 first
    decoder = Decoder(core, mem_len=8, jit_compile=False)
    for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3}):
        with pytest.raises(NonFiniteMemoryError,
                           match=r"^stream\(s\) 0, 1: the model produced NaN or inf log-probs "
                                 r"at new id 1, 1 .*float16: decode in float32\)"):
            decoder.generate([[1, 2, 3], [4]], 4, **sampling)


def test_the_decode_loop_brings_one_finite_flag_per_row_to_the_host(monkeypatch):
    """The check of the loop's steps read the whole `[B, V]` log-probs to the
    host after every chunk (on a GPU: the vocabulary's width per row, every
    `stream_every` ids); one flag per row is enough."""
    from txl_tf.generation import decoder as decoder_module
    seen = []
    check = decoder_module.usable_rows
    monkeypatch.setattr(decoder_module, "usable_rows",
                        lambda log_probs: seen.append(tuple(check(log_probs).shape))
                        or check(log_probs))
    keras.utils.set_random_seed(0)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN))
    Decoder(core, mem_len=8, jit_compile=False).generate([[1, 2, 3], [4]], 4,
                                                         stream=lambda ids: None,
                                                         stream_every=2)
    assert seen == [(2,), (2,)]


def test_lengths_count_this_calls_ids_and_early_stops_pad_with_pad_id(core):
    """A resumed call's `lengths` are its own ids, not the state's total; no
    ids is an empty call; a call cut short by its stop ids (in chunks, as
    streaming reads it) pads with `pad_id`, not 0."""
    decoder = Decoder(core, mem_len=MEM_LEN, jit_compile=False)
    first = decoder.generate([[1, 2, 3]], 3, temperature=0)
    more = decoder.generate(None, 4, resume=first.state)
    np.testing.assert_array_equal(first.lengths, [3])
    np.testing.assert_array_equal(more.lengths, [4])
    none = decoder.generate([[1, 2, 3]], 0, temperature=0)
    assert none.ids.shape == (1, 0) and none.lengths.tolist() == [0]
    stop = int(first.ids[0, 0])
    chunks = []
    cut = decoder.generate([[1, 2, 3]], 5, temperature=0, stop_ids=[stop], pad_id=7,
                           stream=chunks.append, stream_every=1)
    assert cut.ids.tolist() == [[stop, 7, 7, 7, 7]] and cut.lengths.tolist() == [1]
    assert len(chunks) == 1


def test_generate_names_a_stream_cadence_resume_and_seeds_it_cannot_take(core):
    from txl_tf.errors import TxlError
    decoder = Decoder(core, 4, 4, jit_compile=False)
    for options, message in (
            (dict(stream=print, stream_every=0), r"stream_every must be an integer >= 1, got 0"),
            (dict(resume="x"), r"resume must be the \.state of an earlier Generation"),
            (dict(seed=[1, 2, 3]), r"seed must be an integer or 2 integers \(one per prompt\), "
                                   r"got \[1, 2, 3\]")):
        with pytest.raises(TxlError, match=f"^{message}$"):
            decoder.generate([[1], [2]], 2, **options)


@pytest.mark.parametrize("zero_filled", [False, True])
def test_the_decoders_fresh_memory_is_the_cores(zero_filled):
    """`Decoder.initial_memory` is the core's at the decoder's `mem_len`:
    empty slots, or attended zero states under `zero_filled_memory`."""
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN,
                                                   zero_filled_memory=zero_filled))
    memory = Decoder(core, mem_len=5, jit_compile=False).initial_memory(2)
    assert memory.mems.shape == (core.config.n_layer, 2, 5, core.config.d_model)
    np.testing.assert_array_equal(memory.mem_mask, np.full([2, 5], zero_filled))


def test_pad_id_defaults_to_0(core):
    """What `generate`'s docstring states: ids after a row's stop are 0."""
    decoder = Decoder(core, mem_len=8, jit_compile=False)
    first = int(decoder.generate([[1, 2, 3]], 1, temperature=0).ids[0, 0])
    out = decoder.generate([[1, 2, 3]], 4, temperature=0, stop_ids=[first])
    np.testing.assert_array_equal(out.ids[0], [first, 0, 0, 0])
    assert out.lengths[0] == 1


@pytest.mark.parametrize("attn_type", [1, 2, 3])
def test_a_decoder_of_a_core_without_a_decode_cache_is_refused_at_construction(attn_type):
    """As `Decoder`'s Raises says: attn_type 1-3 have no decode cache."""
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN,
                                                   attn_type=attn_type))
    with pytest.raises(TxlError, match=f"attn_type {attn_type} .*decode cache"):
        Decoder(core)


@pytest.mark.parametrize("ids, message", [
    ([[5, N_TOKEN]], r"ids: id 50 at position \(0, 1\) is out of range"),
    ([[5, -1]], r"out of range"),
    ([[5.5, 2]], r"ids must have an integer dtype"), ([5, 6], r"must be a non-empty \[batch"),
    ([[True, False]], r"integer dtype")])
def test_step_last_names_ids_a_compiled_graph_would_clamp(core, ids, message):
    """XLA drops the graph's range assertion and clamps its gather: an id
    past the vocabulary, -1 and 5.5 were read as other ids without a word."""
    decoder = Decoder(core)
    with pytest.raises(TxlError, match=message):
        decoder.step_last(ids, decoder.initial_memory(len(ids)))


def test_take_and_concat_name_rows_past_the_batch_and_empty_lists(core):
    """A gather past the batch is zeros on a GPU: rows are checked first."""
    decoder = Decoder(core)
    memory = decoder.initial_memory(2)
    assert Decoder.take(memory, [1, 0]).mem_mask.shape[0] == 2
    for rows in ([2], [-1], [], [0.5], [True]):
        with pytest.raises(TxlError, match=r"rows must"):
            Decoder.take(memory, rows)
    cache = core.decode_cache(memory)
    with pytest.raises(TxlError, match=r"rows must lie in \[0, 2\)"):
        Decoder.take_cache(cache, [0, 2])
    with pytest.raises(TxlError, match="at least one Memory"):
        Decoder.concat([])
    with pytest.raises(TxlError, match="at least one decode cache"):
        Decoder.concat_caches([])


def test_split_take_and_concat_check_the_memory_as_step_last_does(core):
    """A memory given as a `(mems, mem_mask)` pair is taken; anything else is
    a `TxlError` naming the pair (was an AttributeError: `.mem_mask`)."""
    memory = Decoder(core).initial_memory(2)
    pair = [memory.mems.numpy(), memory.mem_mask.numpy()]
    for part, whole in zip(Decoder.split(pair), Decoder.split(memory)):
        np.testing.assert_array_equal(part.mem_mask, whole.mem_mask)
    assert Decoder.take(tuple(pair), [1]).mems.shape == (*memory.mems.shape[:1], 1,
                                                          *memory.mems.shape[2:])
    assert Decoder.concat([pair, memory]).mem_mask.shape[0] == 4
    calls = (lambda: Decoder.split("memory"), lambda: Decoder.take("memory", [0]),
             lambda: Decoder.concat([memory, "memory"]))
    for call in calls:
        with pytest.raises(TxlError, match=r"memory must be a txl_tf.Memory .* or a \(mems, "
                                           r"mem_mask\) pair, got str"):
            call()
