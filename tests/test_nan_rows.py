"""A model that produces NaN log-probs mid-generation (a word whose
embedding holds NaN): every entry point ends with one
`NonFiniteLogProbsError` naming the rows and the new id each could not
draw, the same on every backend, and never draws or feeds back an id from
such a row (the samplers' side: tests/test_sampling.py)."""
import keras
import numpy as np
import pytest

from export import SessionTable, export_onnx, export_saved_model, open_runtime
from export.onnx_export import export_decode_onnx
from txl_tf import Decoder, NonFiniteMemoryError, TransformerXL, TransformerXLConfig
from txl_tf.generation.nan_rows import NonFiniteLogProbsError

N_TOKEN, POISON, MEM_LEN = 24, 7, 16
PROMPTS = [[1, 2, 3], [4, 5], [6, 8, 9, 10], [11], [12, 13], [14, 15, 16]]
SAMPLING = dict(temperature=1.0, seed=11)
NEW = 8


@pytest.fixture(scope="module")
def core():
    """A tiny model whose id 7 has a NaN embedding (its output weights are
    finite: not tied) and is likely enough that some rows draw it."""
    keras.utils.set_random_seed(0)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN,
                                                    tie_weight=False))
    table = core.word_emb.tables[0]
    table.assign(np.where((np.arange(N_TOKEN) == POISON)[:, None], np.nan, table.numpy()))
    core.crit.biases[0].assign(np.where(np.arange(N_TOKEN) == POISON, 1.5, 0.0))
    return core


@pytest.fixture(scope="module")
def exported(core, tmp_path_factory):
    # Straight from the core: a model directory's loader refuses NaN weights.
    out = tmp_path_factory.mktemp("nan_rows")
    export_saved_model(core, str(out / "saved_model"), MEM_LEN, log_probs="last")
    export_onnx(core, str(out / "model.onnx"), MEM_LEN, log_probs="last")
    export_decode_onnx(core, str(out), MEM_LEN, None)  # the cached host loop, the slab
    return out


def expected(ids):
    """What the error must say, from the ids the rows drew: the rows that
    drew the poisoned id (then could not draw the next one) and each row's
    ids before the error."""
    hit = [list(row).index(POISON) if POISON in row else None for row in ids]
    rows = [i for i, h in enumerate(hit) if h is not None]
    lengths = [NEW if h is None else h + 1 for h in hit]
    return rows, [lengths[r] for r in rows], lengths


def check(err, reference=None):
    rows, steps, lengths = expected(err.ids)
    assert 0 < len(rows) < len(PROMPTS)  # some rows break, others finish
    assert err.rows == rows and err.steps == steps
    np.testing.assert_array_equal(err.lengths, lengths)
    for row, length in enumerate(lengths):
        assert POISON not in err.ids[row, :length - 1]
        assert (err.ids[row, length:] == 0).all()  # pad_id
        assert ((0 <= err.ids) & (err.ids < N_TOKEN)).all()
    assert str(err).startswith(f"stream(s) {', '.join(map(str, rows))}: the model produced "
                               "NaN or inf log-probs at new id "
                               f"{', '.join(map(str, steps))} ")
    if reference is not None:
        assert str(err) == str(reference)
        np.testing.assert_array_equal(err.ids, reference.ids)


def generate_error(backend, prompts=PROMPTS, **options):
    with pytest.raises(NonFiniteLogProbsError) as caught:
        backend.generate(prompts, NEW, **SAMPLING, **options)
    return caught.value


@pytest.fixture(scope="module")
def reference(core):
    """The error of the compiled decoder (XLA), which the others must equal."""
    err = generate_error(Decoder(core, mem_len=MEM_LEN))
    check(err)
    return err


def test_the_decoder_names_the_rows_and_steps_with_and_without_xla(core, reference):
    assert isinstance(reference, NonFiniteMemoryError)  # the family callers catch
    check(generate_error(Decoder(core, mem_len=MEM_LEN, jit_compile=False)), reference)
    chunks = []
    streamed = generate_error(Decoder(core, mem_len=MEM_LEN), stream=chunks.append,
                              stream_every=2)
    first = min(reference.steps)
    assert [c.shape[1] for c in chunks] == [2] * (first // 2)  # none with the NaN step
    assert streamed.rows == [r for r, s in zip(reference.rows, reference.steps)
                             if s // 2 == first // 2]


@pytest.mark.parametrize("backend, cached", [("onnx", True), ("onnx", False),
                                             ("saved_model", True), ("saved_model", False)])
def test_the_runtimes_raise_the_decoders_error(exported, reference, backend, cached):
    runtime = open_runtime(str(exported), backend=backend, device="cpu")
    runtime.use_decode_cache = cached
    assert runtime.use_decode_cache == cached
    check(generate_error(runtime), reference)


def test_a_prompt_that_makes_nan_is_named_at_new_id_0(core, exported):
    prompts = [[1, 2], [3, POISON], [4]]
    for backend in (Decoder(core, mem_len=MEM_LEN), open_runtime(str(exported), device="cpu")):
        err = generate_error(backend, prompts)
        assert err.rows == [1] and err.steps == [0], (backend, str(err))
        assert "the model produced NaN or inf log-probs at new id 0 " in str(err)


def test_the_session_table_names_the_session_and_the_others_go_on(exported, reference):
    runtime = open_runtime(str(exported), device="cpu")
    table = SessionTable(runtime, max_batch=len(PROMPTS))
    assert table.slab is not None
    for i, prompt in enumerate(PROMPTS):
        table.open(f"s{i}", prompt, NEW, temperature=1.0, seed=SAMPLING["seed"] + i)
    errors = []
    while table.active():
        try:
            table.step()
        except NonFiniteLogProbsError as err:
            errors.append(err)
    named = [(row, step) for err in errors for row, step in zip(err.rows, err.steps)]
    assert sorted(named) == [(f"s{r}", s) for r, s in zip(reference.rows, reference.steps)]
    with pytest.raises(NonFiniteLogProbsError, match=r"^stream\(s\) bad: .* at new id 0 "):
        table.open("bad", [POISON], 3)


def test_a_row_whose_last_id_makes_nan_is_named_by_no_backend(core, exported, reference):
    """A row whose log-probs turn NaN after its last id (a stop id, or the
    last id asked for) draws nothing from them: every backend returns the
    ids the reference drew and names no row (the decoder named it at the end
    of a call, keras-hub and the session table after a stop id; review37)."""
    last = min(reference.steps)  # some rows drew the poisoned id as their last-th
    table_runtime = open_runtime(str(exported), device="cpu")
    backends = [Decoder(core, mem_len=MEM_LEN), Decoder(core, mem_len=MEM_LEN, jit_compile=False),
                open_runtime(str(exported), device="cpu"), table_runtime]
    backends[2].use_decode_cache = False
    for backend in backends:
        stopped = backend.generate(PROMPTS, NEW, stop_ids=[POISON], **SAMPLING)
        np.testing.assert_array_equal(stopped.ids, reference.ids, err_msg=repr(backend))
        ended = backend.generate(PROMPTS, last, **SAMPLING)
        np.testing.assert_array_equal(ended.ids, reference.ids[:, :last], err_msg=repr(backend))
    assert SessionTable(table_runtime, max_batch=len(PROMPTS)).slab is not None
    for budget, stop_ids in ((NEW, [POISON]), (last, [])):
        table = SessionTable(table_runtime, max_batch=len(PROMPTS))
        for i, prompt in enumerate(PROMPTS):
            table.open(i, prompt, budget, temperature=1.0, seed=SAMPLING["seed"] + i,
                       stop_ids=stop_ids)
        table.run()
        for i, length in enumerate(np.minimum(reference.lengths, budget)):
            np.testing.assert_array_equal(table.close(i).ids[0], reference.ids[i, :length])
    model = poisoned_causal_lm(bias=1.5)
    model.compile(sampler=keras_hub_sampler("top_k"))
    ids = hub_prompts(width=NEW)
    out = model.generate({"token_ids": ids, "padding_mask": ids > 0}, stop_token_ids=[POISON])
    ends = [list(row).index(POISON) - len(prompt) for row, prompt in zip(out["token_ids"], PROMPTS)
            if POISON in row]
    assert len(set(ends)) > 1  # the loop went on after a row stopped at the poisoned id


def test_the_command_prints_one_error_line(jobs, tmp_path):
    """`txl-generate` on an export whose byte "z" has a NaN embedding (a
    model directory's loader refuses NaN weights before this)."""
    from txl_tf.text import ByteTokenizer
    keras.utils.set_random_seed(0)
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    table = core.word_emb.tables[0]
    table.assign(np.where((np.arange(table.shape[0]) == ord("z"))[:, None], np.nan,
                          table.numpy()))
    export_onnx(core, str(tmp_path / "model.onnx"), MEM_LEN, log_probs="last")
    ByteTokenizer().save(str(tmp_path / "vocab"))
    done = jobs.run("training.generate", [f"--model={tmp_path / 'model.onnx'}",
                                          "--prompt=az", "--num_tokens=4", "--noprogress"])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert [line for line in lines if line.startswith("error:")] == lines[-1:]
    assert lines[-1].startswith("error: stream(s) 0: the model produced NaN or inf log-probs "
                                "at new id 0 "), lines[-1]


def poisoned_causal_lm(bias):
    """A `TransformerXLCausalLM` whose id 7 has a NaN embedding and output
    bias `bias`."""
    from txl_tf import TransformerXLBackbone, TransformerXLCausalLM
    keras.utils.set_random_seed(0)
    config = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, tie_weight=False,
                                        mem_len=MEM_LEN)
    model = TransformerXLCausalLM(TransformerXLBackbone(**config.to_dict()))
    table = model.core.word_emb.tables[0]
    table.assign(np.where((np.arange(N_TOKEN) == POISON)[:, None], np.nan, table.numpy()))
    model.core.crit.biases[0].assign(np.where(np.arange(N_TOKEN) == POISON, bias, 0.0))
    return model


def keras_hub_sampler(name):
    import keras_hub
    return {"greedy": "greedy", "top_k": keras_hub.samplers.TopKSampler(k=5, seed=1),
            "beam": keras_hub.samplers.BeamSampler(num_beams=2)}[name]


def hub_prompts(width):
    """PROMPTS right-padded to `width` columns (keras-hub's generate inputs)."""
    ids = np.zeros([len(PROMPTS), width], np.int32)
    for i, prompt in enumerate(PROMPTS):
        ids[i, :len(prompt)] = prompt
    return ids


@pytest.mark.parametrize("sampler", ["greedy", "top_k", "beam"])
def test_keras_hub_generate_names_the_rows_and_steps_of_the_decoder(sampler):
    """`TransformerXLCausalLM.generate` (keras-hub's samplers in an XLA
    loop): the rows and steps the decoder names, greedy; an error under the
    other samplers too, where keras-hub's samplers made ids of NaN."""
    model = poisoned_causal_lm(bias=3.0)
    model.compile(sampler=keras_hub_sampler(sampler))
    width = 4 + max(map(len, PROMPTS))
    ids = hub_prompts(width)
    with pytest.raises(NonFiniteLogProbsError) as caught:
        model.generate({"token_ids": ids, "padding_mask": ids > 0}, stop_token_ids=None)
    err = caught.value
    assert err.rows and str(err).startswith("stream(s) ")
    if sampler == "greedy":
        with pytest.raises(NonFiniteLogProbsError) as decoded:
            Decoder(model.core, mem_len=MEM_LEN).generate(PROMPTS, width, temperature=0)
        limit = {i: width - len(p) for i, p in enumerate(PROMPTS)}
        assert list(zip(err.rows, err.steps)) == [
            (row, step) for row, step in zip(decoded.value.rows, decoded.value.steps)
            if step < limit[row]]


def test_a_sampler_that_runs_no_loop_is_one_error_naming_it():
    """The keras-hub shim says what broke where a sampler did not run its
    loop through `run_loop` (another keras-hub), and leaves it as it was."""
    import keras_hub
    from txl_tf.errors import TxlError
    from txl_tf.keras_support.keras_hub_samplers import final_loop_vars
    sampler = keras_hub.samplers.GreedySampler()
    with final_loop_vars(sampler) as final:
        pass
    with pytest.raises(TxlError, match=r"GreedySampler did not run one decoding loop"):
        final.cache()
    assert "run_loop" not in vars(sampler)
