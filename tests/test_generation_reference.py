"""Every way of generating against the obvious slow loop: the paper's forward
pass in numpy (`reference_numpy.py`) reading the prompt in segments of
`segment_len` cut from its end, then each new id alone, the memory carried and
cut to `mem_len`, greedy by argmax (lowest id within `TIE_TOLERANCE`).
The compiled `Decoder` (XLA and not), the exported runtimes (ONNX Runtime,
the SavedModel; on the decode cache and on `step_last`), a `SessionTable`, the
runtimes' decode verbs and keras-hub's `generate` give its ids and log-probs."""
import keras
import keras_hub
import numpy as np
import pytest
from reference_numpy import forward as reference_forward

from export import SessionTable, open_runtime
from export.job import run_export
from txl_tf import Decoder, TransformerXL, TransformerXLBackbone, TransformerXLCausalLM
from txl_tf import TransformerXLConfig
from txl_tf.generation.sampling_settings import TIE_TOLERANCE
from txl_tf.weights import save_pretrained
from txl_tf.weights.checkpoints import get_weights

N_TOKEN, MEM_LEN, SEGMENT = 40, 6, 4
# One id; shorter than, equal to and longer than the segment; equal to and
# longer than the memory; several segments past it.
LENGTHS = (1, 3, 4, 6, 7, 13)
BACKENDS = ("decoder", "decoder_no_xla", "onnx", "onnx_step_last", "saved_model",
            "saved_model_step_last")


@pytest.fixture(scope="module")
def core():
    keras.utils.set_random_seed(0)
    return TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.2,
                                                    mem_len=MEM_LEN, tgt_len=SEGMENT))


@pytest.fixture(scope="module")
def exported(core, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    save_pretrained(core, root / "model")
    run_export(str(root / "out"), str(root / "model"), mem_len=MEM_LEN,
               formats=["onnx", "saved_model"], verify=False)
    return str(root / "out")


@pytest.fixture(scope="module")
def backends(core, exported):
    found = {"decoder": Decoder(core, MEM_LEN, SEGMENT),
             "decoder_no_xla": Decoder(core, MEM_LEN, SEGMENT, jit_compile=False)}
    for kind in ("onnx", "saved_model"):
        found[kind] = open_runtime(exported, backend=kind, device="cpu")
        plain = open_runtime(exported, backend=kind, device="cpu")
        plain.use_decode_cache = False  # the host loop on `step_last`
        found[kind + "_step_last"] = plain
    return found


class Reference:
    """The slow loop on the numpy transcription of the paper's forward pass."""

    def __init__(self, core, mem_len=MEM_LEN, segment_len=SEGMENT):
        self.weights = get_weights(core)
        self.config = core.config.replace(mem_len=mem_len)
        self.segment_len = segment_len

    def read(self, ids, mems=None):
        """Log-probs after each id `[T, V]` and the memory after them."""
        log_probs, mems = reference_forward(self.weights, self.config,
                                            np.asarray(ids).reshape(-1, 1), mems)
        return log_probs[:, 0], mems

    def prompt(self, prompt, mems=None):
        """Reads a prompt in segments cut from its end, the short one first."""
        ends = list(range(len(prompt), 0, -self.segment_len))[::-1]
        for begin, end in zip([0] + ends[:-1], ends):
            log_probs, mems = self.read(prompt[begin:end], mems)
        return log_probs[-1], mems

    def greedy(self, prompt, n, mems=None):
        """`(ids, their log-probs, memory after them, log-probs after them)`."""
        log_probs, mems = self.prompt(prompt, mems)
        ids, chosen = [], []
        for _ in range(n):
            token = int(np.flatnonzero(log_probs >= log_probs.max() - TIE_TOLERANCE)[0])
            ids.append(token)
            chosen.append(log_probs[token])
            log_probs, mems = self.read([token], mems)
            log_probs = log_probs[-1]
        return np.array(ids, np.int32), np.array(chosen), mems, log_probs

    def forced(self, prompt, ids):
        """`(the log-prob of each of ids after prompt and the ids before it,
        the memory after them)`."""
        log_probs, mems = self.prompt(prompt)
        chosen = []
        for token in ids:
            chosen.append(log_probs[token])
            log_probs, mems = self.read([token], mems)
            log_probs = log_probs[-1]
        return np.array(chosen), mems


@pytest.fixture(scope="module")
def reference(core):
    return Reference(core)


def prompts_of(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, N_TOKEN, length)) for length in lengths]


@pytest.mark.parametrize("name", BACKENDS)
def test_greedy_ids_and_log_probs_are_the_slow_loops_in_a_batch_and_alone(name, backends,
                                                                           reference):
    prompts = prompts_of()
    backend = backends[name]
    out = backend.generate(prompts, 12, temperature=0)
    assert out.ids.shape == (len(prompts), 12) and (out.lengths == 12).all()
    for row, prompt in enumerate(prompts):
        ids, chosen, _, _ = reference.greedy(prompt, 12)
        np.testing.assert_array_equal(out.ids[row], ids, err_msg=f"prompt of {len(prompt)}")
        np.testing.assert_allclose(out.log_probs[row], chosen, atol=1e-5)
        alone = backend.generate([prompt], 12, temperature=0)
        np.testing.assert_array_equal(alone.ids[0], ids, err_msg=f"alone, {len(prompt)}")


@pytest.mark.parametrize("name", BACKENDS)
def test_no_new_ids_and_one_new_id(name, backends, reference):
    prompts = prompts_of()
    for n in (0, 1):
        out = backends[name].generate(prompts, n, temperature=0)
        assert out.ids.shape == out.log_probs.shape == (len(prompts), n)
        np.testing.assert_array_equal(out.lengths, n)
        for row, prompt in enumerate(prompts):
            np.testing.assert_array_equal(out.ids[row], reference.greedy(prompt, n)[0])


@pytest.mark.parametrize("name", BACKENDS)
def test_resume_and_a_next_turn_continue_as_the_slow_loop(name, backends, reference):
    prompts, turns = prompts_of(), prompts_of((2, 1, 5, 3, 9, 1), seed=1)
    backend = backends[name]
    first = backend.generate(prompts, 4, temperature=0)
    more = backend.generate(None, 6, resume=first.state)
    on_memory = backend.generate(turns, 5, temperature=0, memory=first.memory)
    on_state = backend.generate(turns, 5, temperature=0, resume=first.state)
    for row, prompt in enumerate(prompts):
        ids, _, mems, _ = reference.greedy(prompt, 10)
        np.testing.assert_array_equal(np.concatenate([first.ids[row], more.ids[row]]), ids)
        _, _, mems, _ = reference.greedy(prompt, 4)
        turn, chosen, _, _ = reference.greedy(turns[row], 5, mems)
        np.testing.assert_array_equal(on_memory.ids[row], turn)
        np.testing.assert_array_equal(on_state.ids[row], turn)
        np.testing.assert_allclose(on_state.log_probs[row], chosen, atol=1e-5)


@pytest.mark.parametrize("name", BACKENDS)
def test_stop_ids_mid_batch_pad_the_row_and_its_memory_holds_the_stop_id(name, backends,
                                                                         reference):
    prompts = prompts_of()
    free = [reference.greedy(prompt, 10)[0] for prompt in prompts]
    stop = int(free[1][2])  # the second row's third id
    out = backends[name].generate(prompts, 10, temperature=0, stop_ids=[stop], pad_id=39)
    after = backends[name].generate([[1, 2]] * len(prompts), 3, temperature=0,
                                    memory=out.memory)
    assert 0 < out.lengths.min() < out.lengths.max() == 10  # rows stopped mid-batch
    for row, prompt in enumerate(prompts):
        hits = np.flatnonzero(free[row] == stop)
        length = hits[0] + 1 if hits.size else 10
        assert out.lengths[row] == length
        np.testing.assert_array_equal(out.ids[row, :length], free[row][:length])
        assert (out.ids[row, length:] == 39).all() and (out.log_probs[row, length:] == 0).all()
        _, _, mems, _ = reference.greedy(prompt, length)  # the stop id read, then frozen
        np.testing.assert_array_equal(after.ids[row], reference.greedy([1, 2], 3, mems)[0])


SAMPLED = dict(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.3, seed=7)


def test_a_seed_gives_the_same_ids_twice_and_on_every_backend(backends, reference):
    prompts = prompts_of()
    ids = {name: b.generate(prompts, 10, **SAMPLED) for name, b in backends.items()}
    again = backends["decoder"].generate(prompts, 10, **SAMPLED)
    np.testing.assert_array_equal(again.ids, ids["decoder"].ids)
    for name, out in ids.items():
        np.testing.assert_array_equal(out.ids, ids["decoder"].ids, err_msg=name)
    # The log-probs returned are the model's, not the tempered or penalized ones.
    for row, prompt in enumerate(prompts):
        np.testing.assert_allclose(ids["onnx"].log_probs[row],
                                   reference.forced(prompt, ids["onnx"].ids[row])[0],
                                   atol=1e-5)
    assert (backends["decoder"].generate(prompts, 10, **{**SAMPLED, "seed": 8}).ids
            != ids["decoder"].ids).any()


@pytest.mark.parametrize("name", ["decoder", "onnx", "saved_model_step_last"])
def test_sampler_edges_that_are_greedy_or_unlimited(name, backends):
    prompts, backend = prompts_of(), backends[name]
    greedy = backend.generate(prompts, 10, temperature=0).ids
    for edge in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-3)):
        np.testing.assert_array_equal(backend.generate(prompts, 10, seed=3, **edge).ids, greedy,
                                      err_msg=str(edge))
    np.testing.assert_array_equal(backend.generate(prompts, 10, seed=3, top_p=1.0).ids,
                                  backend.generate(prompts, 10, seed=3).ids)


@pytest.mark.parametrize("name", ["decoder", "onnx", "onnx_step_last", "saved_model"])
def test_session_table_rows_equal_each_alone_and_a_reset_reads_afresh(name, backends,
                                                                      reference):
    prompts, backend = prompts_of(), backends[name]
    settings = [dict(temperature=0), dict(temperature=1.0, seed=4),
                dict(temperature=0.7, top_k=3, seed=9),
                dict(temperature=1.2, top_p=0.8, seed=1, repetition_penalty=1.3),
                dict(temperature=0, stop_ids=[2, 26]), dict(temperature=1.0, seed=2)]
    alone = [backend.generate([p], 9, **s) for p, s in zip(prompts, settings)]
    table = SessionTable(backend, max_batch=4)
    for i, (prompt, setting) in enumerate(zip(prompts, settings)):
        table.open(i, prompt, 9, **setting)
    for _ in range(3):
        table.step()
    table.reset(0, [7, 8, 9, 10, 11], 5)
    table.run()
    out = [table.close(i) for i in range(len(prompts))]
    for i in range(1, len(prompts)):
        length = alone[i].lengths[0]
        np.testing.assert_array_equal(out[i].ids[0], alone[i].ids[0, :length], err_msg=str(i))
        np.testing.assert_allclose(out[i].log_probs[0], alone[i].log_probs[0, :length],
                                   atol=1e-5)
    expected = np.concatenate([reference.greedy(prompts[0], 3)[0],
                               reference.greedy([7, 8, 9, 10, 11], 5)[0]])
    np.testing.assert_array_equal(out[0].ids[0], expected)
    # A session opened on a memory reads its prompt on it.
    table.open("m", [3, 4], 6, temperature=0, memory=alone[5].memory)
    table.run()
    _, mems = reference.forced(prompts[5], alone[5].ids[0])
    np.testing.assert_array_equal(table.close("m").ids[0], reference.greedy([3, 4], 6, mems)[0])


@pytest.mark.parametrize("name", ["onnx", "saved_model"])
def test_step_and_score_carry_the_memory_as_the_slow_loop(name, backends, reference):
    runtime = backends[name]
    rng = np.random.default_rng(2)
    ids, targets = rng.integers(0, N_TOKEN, (2, 2, 12))
    memory, mems = None, [None, None]
    for begin, end in ((0, 4), (4, 7), (7, 12)):  # past the memory of 6
        log_probs, _ = runtime.step(ids[:, begin:end], memory)
        nll, memory = runtime.score(ids[:, begin:end], targets[:, begin:end], memory)
        for row in range(2):
            expected, mems[row] = reference.read(ids[row, begin:end], mems[row])
            np.testing.assert_allclose(log_probs[row], expected, atol=1e-5)
            np.testing.assert_allclose(
                nll[row], -expected[np.arange(end - begin), targets[row, begin:end]], atol=1e-5)


@pytest.mark.parametrize("name", ["onnx", "saved_model"])
def test_decode_verbs_with_a_row_stopped_a_while_are_the_slow_loop(name, backends, reference):
    runtime = backends[name]
    prompts = np.random.default_rng(3).integers(0, N_TOKEN, (2, 5))
    log_probs, memory = runtime.step(prompts)
    cache = runtime.decode_init(memory)
    mems = [reference.read(prompt)[1] for prompt in prompts]
    ids = log_probs[:, -1].argmax(-1)
    for t in range(10):  # past the ring of 7 slots; row 1 stopped at steps 2 to 4
        stopped = np.array([False, 2 <= t < 5])
        log_probs, cache = runtime.decode_step(ids, cache, stopped=stopped)
        for row in np.flatnonzero(~stopped):
            expected, mems[row] = reference.read([ids[row]], mems[row])
            np.testing.assert_allclose(log_probs[row], expected[-1], atol=1e-5)
            ids[row] = log_probs[row].argmax()
    turn = np.array([[5, 6, 7], [8, 9, 10]])
    log_probs, cache = runtime.decode_read(turn, cache)
    memory = runtime.cache_memory(cache)
    held, valid = (np.asarray(part) for part in memory)
    assert valid.all()
    for row in range(2):
        expected, mems[row] = reference.read(turn[row], mems[row])
        np.testing.assert_allclose(log_probs[row], expected[-1], atol=1e-5)
        np.testing.assert_allclose(held[:, row], np.stack([m[:, 0] for m in mems[row]]),
                                   atol=1e-5)


def padded(prompts, width):
    ids = np.zeros([len(prompts), width], np.int32)
    mask = np.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, :len(prompt)], mask[i, :len(prompt)] = prompt, 1
    return {"token_ids": ids, "padding_mask": mask}


@pytest.fixture(scope="module")
def causal_lm(core):
    """A causal LM of the core's weights with a memory and segment of its own."""
    lm = TransformerXLCausalLM(TransformerXLBackbone(**core.config.to_dict()), mem_len=3,
                               segment_len=2)
    lm.backbone.transformer.set_weights(core.get_weights())
    return lm


@pytest.mark.parametrize("sampler", ["greedy", "top_k_1", "one_beam"])
def test_keras_hub_greedy_samplers_are_the_slow_loop_on_ragged_prompts(sampler, causal_lm,
                                                                       core):
    causal_lm.compile(sampler={"greedy": "greedy",
                               "top_k_1": keras_hub.samplers.TopKSampler(k=1, seed=1),
                               "one_beam": keras_hub.samplers.BeamSampler(num_beams=1)}[sampler])
    reference = Reference(core, mem_len=3, segment_len=2)
    prompts, width = prompts_of((1, 3, 4, 7)), 14
    out = causal_lm.generate(padded(prompts, width), stop_token_ids=None)["token_ids"]
    for row, prompt in enumerate(prompts):
        expected = reference.greedy(prompt, width - len(prompt))[0]
        np.testing.assert_array_equal(out[row], list(prompt) + list(expected), err_msg=str(row))


def test_keras_hub_widths_that_leave_no_new_id_or_one(causal_lm, core):
    causal_lm.compile(sampler="greedy")
    prompt = prompts_of((7,))[0]
    expected = Reference(core, mem_len=3, segment_len=2).greedy(prompt, 1)[0]
    for extra in (0, 1):
        out = causal_lm.generate(padded([prompt], len(prompt) + extra),
                                 stop_token_ids=None)
        np.testing.assert_array_equal(out["token_ids"][0], list(prompt) + list(expected[:extra]))
        assert out["padding_mask"][0].all()


VARIANTS = {
    "adaptive": dict(cutoffs=[10, 25], div_val=2, d_embed=32),
    "pre_lnorm_untied": dict(pre_lnorm=True, cutoffs=[20], tie_weight=False,
                             tie_projs=[False, False], d_embed=16),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mem_len, segment_len", [(0, 4), (1, 1), (3, 16)])
def test_decoder_memories_and_segments_of_any_size_are_the_slow_loop(variant, mem_len,
                                                                     segment_len):
    keras.utils.set_random_seed(1)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.2,
                                                    mem_len=MEM_LEN, tgt_len=SEGMENT,
                                                    **VARIANTS[variant]))
    reference = Reference(core, mem_len, segment_len)
    prompts = prompts_of((1, 5, 9))
    decoder = Decoder(core, mem_len=mem_len, segment_len=segment_len)
    out = decoder.generate(prompts, 9, temperature=0)
    for row, prompt in enumerate(prompts):
        ids, chosen, _, _ = reference.greedy(prompt, 9)
        np.testing.assert_array_equal(out.ids[row], ids, err_msg=f"prompt of {len(prompt)}")
        np.testing.assert_allclose(out.log_probs[row], chosen, atol=1e-5)
        np.testing.assert_array_equal(decoder.generate([prompt], 9, temperature=0).ids[0], ids)


@pytest.mark.parametrize("mem_len, segment_len", [(6, 4), (3, 16), (3, 2)])
def test_same_length_decoding_is_the_cores_slow_loop(mem_len, segment_len):
    """Under `same_length` the core's fresh memory is `mem_len` empty slots
    (docs/keras-hub.md), not the growing memory of the numpy loop: the slow
    loop here is the plain core, read segment by segment then id by id."""
    keras.utils.set_random_seed(1)
    core = TransformerXL(TransformerXLConfig.preset(
        "tiny", n_token=N_TOKEN, init_std=0.2, mem_len=MEM_LEN, tgt_len=SEGMENT, untie_r=True,
        same_length=True, clamp_len=3))
    prompts = prompts_of((1, 5, 9))
    out = Decoder(core, mem_len=mem_len, segment_len=segment_len).generate(
        prompts, 9, temperature=0)
    for row, prompt in enumerate(prompts):
        memory = core.initial_memory(1, mem_len=mem_len)
        ends = list(range(len(prompt), 0, -segment_len))[::-1]
        for begin, end in zip([0] + ends[:-1], ends):
            log_probs, memory = core(np.array([prompt[begin:end]]), memory)
        for t in range(9):
            last = log_probs.numpy()[0, -1]
            token = int(np.flatnonzero(last >= last.max() - TIE_TOLERANCE)[0])
            assert out.ids[row, t] == token, (row, t)
            np.testing.assert_allclose(out.log_probs[row, t], last[token], atol=1e-5)
            log_probs, memory = core(np.array([[token]]), memory)


def test_a_zero_filled_start_is_the_slow_loop_from_zero_states():
    """`zero_filled_memory` (imported TF weights): the slow loop starts from
    `mem_len` attended zero states, as the paper's TF code does."""
    keras.utils.set_random_seed(3)
    cfg = TransformerXLConfig.preset("tiny", n_token=N_TOKEN, init_std=0.2, mem_len=MEM_LEN,
                                     tgt_len=SEGMENT, zero_filled_memory=True)
    lm = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    lm.compile(sampler="greedy")
    reference = Reference(lm.core)
    zeros = [np.zeros((MEM_LEN, 1, cfg.d_model))] * cfg.n_layer
    prompts, width = prompts_of((1, 3, 4, 7, 9)), 18
    decoded = Decoder(lm.core).generate(prompts, 8, temperature=0)
    out = lm.generate(padded(prompts, width), stop_token_ids=None)["token_ids"]
    for row, prompt in enumerate(prompts):
        ids, chosen, _, _ = reference.greedy(prompt, width - len(prompt), zeros)
        np.testing.assert_array_equal(decoded.ids[row], ids[:8], err_msg=f"decoder, {row}")
        np.testing.assert_allclose(decoded.log_probs[row], chosen[:8], atol=1e-5)
        np.testing.assert_array_equal(out[row, len(prompt):], ids, err_msg=f"keras-hub, {row}")
