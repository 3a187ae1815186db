"""Sizes that cannot fit are refused up front with the estimate and what is
available, in training, evaluation, export and the runtimes."""
import pytest

from job_helpers import write_text_corpus
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.checks import memory_budget
from txl_tf.checks.memory_budget import (GIB, MemoryBudgetError, available_bytes, check_fits,
                                         estimate_bytes, memory_bytes, parameter_count)
from txl_tf.errors import TxlError
from txl_tf.generation.flow import generate as generate_on


def test_parameter_count_is_the_models():
    for config in (TransformerXLConfig.preset("tiny"),
                   TransformerXLConfig.preset("tiny", n_token=300, cutoffs=[100, 200],
                                              div_val=2, d_embed=32)):
        core = TransformerXL(config)
        core(__import__("numpy").zeros([1, 2], "int32"), core.initial_memory(1))
        built = core.count_params()
        assert parameter_count(config) <= built <= 1.2 * parameter_count(config)


def test_the_estimate_refuses_what_cannot_fit_and_names_it():
    config = TransformerXLConfig.preset("small")
    parts = estimate_bytes(config, 16, 64, 64, training=True)
    assert parts["memory"] == 2 * 4 * 16 * 64 * 128 * 4
    fits = check_fits(config, 16, 64, 64, training=True, host_only=False, available=GIB)
    assert fits < GIB
    with pytest.raises(MemoryBudgetError, match=r"training \(batch 1, segment 64, memory "
                                                 r"2000000000\) needs at least [\d,.]+ GiB "
                                                 r"\(activations .*1\.0 GiB available"):
        check_fits(config, 1, 64, 2_000_000_000, training=True, what="training",
                   host_only=False, available=GIB)


def test_the_jobs_refuse_before_allocating_or_writing(jobs, tmp_path):
    write_text_corpus(tmp_path / "corpus.txt", 5_000)
    train = jobs.run("training.train", [
        f"--model_dir={tmp_path / 'run'}", "--dataset=text",
        f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
        "--preset=tiny", "--mem_len=2000000000", "--strategy=one_device"])
    assert train.returncode == 2
    assert train.stderr.startswith("error: a training step (batch 16, segment 16, memory "
                                   "2000000000) needs at least"), train.stderr
    assert len(train.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    from txl_tf.weights import save_pretrained
    from txl_tf.text import ByteTokenizer
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny")), tmp_path / "model",
                    ByteTokenizer())
    export = jobs.run("export", [f"--model_dir={tmp_path / 'model'}",
                                 f"--output_dir={tmp_path / 'out'}", "--mem_len=100000000"])
    assert export.returncode == 2 and "error: the exported graph's smallest step" in \
        export.stderr, export.stderr
    assert not (tmp_path / "out").exists()
    evaluate = jobs.run("training.evaluate", [
        f"--model_dir={tmp_path / 'model'}", "--dataset=text",
        f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
        "--mem_len=2000000000"])
    assert evaluate.returncode == 2 and "error: an evaluation step" in evaluate.stderr


def test_an_export_whose_parity_check_cannot_fit_is_refused_before_writing(jobs, tmp_path):
    """The smallest step fits, the parity check (batch 2, three reference
    memories kept) cannot: refused up front, naming --noverify, rather than
    growing until the kernel kills it. Sizes are relative to this machine."""
    from txl_tf.weights import save_pretrained
    config = TransformerXLConfig.preset("tiny")
    save_pretrained(TransformerXL(config), tmp_path / "model")
    mem_len = int(0.4 * available_bytes() / (2 * memory_bytes(config, 1, 1)))
    export = jobs.run("export", [f"--model_dir={tmp_path / 'model'}",
                                 f"--output_dir={tmp_path / 'out'}", f"--mem_len={mem_len}"])
    assert export.returncode == 2, export.stderr
    errors = [line for line in export.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: the parity check (--noverify skips it) (batch 2, segment 8, memory {mem_len}) "
        "needs at least"), export.stderr
    assert not (tmp_path / "out").exists()


def test_a_containers_limit_counts_as_what_is_available(tmp_path, monkeypatch):
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{3 * GIB}\n")
    usage.write_text(f"{GIB}\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        names = {"/sys/fs/cgroup/memory.max": limit, "/sys/fs/cgroup/memory.current": usage}
        return real_open(names.get(path, path), *args, **kwargs)
    monkeypatch.setattr(memory_budget, "open", fake_open, raising=False)
    monkeypatch.setattr(memory_budget, "_address_space_room", lambda: None)  # a `ulimit -v`
    assert available_bytes() == min(2 * GIB, _meminfo_available())
    limit.write_text("max\n")
    assert available_bytes() == _meminfo_available()


def _meminfo_available():
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def test_a_runtimes_initial_memory_is_checked(tmp_path):
    from export import export_onnx, open_runtime
    core = TransformerXL(TransformerXLConfig.preset("tiny"))
    export_onnx(core, str(tmp_path / "model.onnx"), 4)
    runtime = open_runtime(str(tmp_path / "model.onnx"), device="cpu")
    with pytest.raises(MemoryBudgetError, match=r"initial_memory \(batch 10000000000, memory "
                                                r"4\) needs at least"):
        runtime.initial_memory(10_000_000_000)


def test_an_address_space_limit_counts_as_what_is_available(monkeypatch):
    """`ulimit -v` (RLIMIT_AS): a job under it was told the machine's memory
    and then failed allocating (MemoryError, TensorFlow's OOM)."""
    import resource
    with open("/proc/self/status", encoding="ascii") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (size + GIB, resource.RLIM_INFINITY))
    assert 0.9 * GIB < available_bytes() <= GIB
    monkeypatch.setattr(memory_budget, "_cgroup_room", lambda: None)
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert available_bytes() == _meminfo_available()


class _NoBackend:
    """A backend that must not be used: the request is refused first."""
    n_token = 50


@pytest.mark.parametrize("rows", [1, 3])
def test_a_generation_whose_new_ids_cannot_fit_is_refused_before_reading(monkeypatch, rows):
    """The outputs `[B, max_new_tokens]` are allocated whole even when a stop
    id ends every row at once: 2**29 new ids (4 GiB) ended in a MemoryError
    after one chunk, or in TensorFlow's OOM."""
    from txl_tf.generation.flow import generate
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: GIB)
    count = GIB // 8 // rows + 1
    with pytest.raises(MemoryBudgetError, match=rf"^max_new_tokens {count:,} for {rows} rows? "
                                                rf"needs at least 1\.0 GiB \(the new ids and "
                                                rf"their log-probs, 8 bytes each\) and this "
                                                rf"machine has 1\.0 GiB available; ask for fewer"):
        generate(_NoBackend(), [[1, 2]] * rows, count, stop_ids=[1])


def test_a_resumed_generation_whose_new_ids_cannot_fit_is_refused(monkeypatch):
    import numpy as np
    from txl_tf.generation.flow import generate
    from txl_tf.generation.request import DecodeState
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: GIB)
    state = DecodeState(np.zeros([2, 50], np.float32), None, np.zeros([2, 50], np.bool_),
                        np.zeros(2, np.int64), np.zeros(2, np.bool_), None, 0)
    with pytest.raises(MemoryBudgetError, match=r"^max_new_tokens 67,108,865 for 2 rows"):
        generate(_NoBackend(), None, GIB // 16 + 1, resume=state)
    with pytest.raises(MemoryBudgetError, match=r"^max_new_tokens 67,108,865 for 2 rows"):
        generate(_NoBackend(), [[1], [2]], GIB // 16 + 1, resume=state)  # a next turn


def test_weights_and_stream_memories_that_cannot_fit_are_refused_before_they_are_made(
        monkeypatch):
    """`TransformerXL` of `n_token=2**31` and `TransformerXLLM` of
    `batch_size=10**7` or `mem_len=10**8` were TensorFlow's OOM (a traceback)
    while their variables were made; here the memory available is made a
    little more than a tiny model's weights."""
    from txl_tf import TransformerXLLM
    config = TransformerXLConfig.preset("tiny", n_token=50, mem_len=8, tgt_len=4)
    weights = parameter_count(config) * 4
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: weights + 1000)
    TransformerXL(config)
    with pytest.raises(MemoryBudgetError, match=r"^the model's weights \([\d,]+ parameters\) "
                                                r"needs at least .* lower n_token"):
        TransformerXL(config.replace(n_token=100))
    row = 2 * config.n_layer * config.mem_len * config.d_model * 4  # training + evaluation
    TransformerXLLM(config, batch_size=weights // row)
    with pytest.raises(MemoryBudgetError, match=rf"^the training and evaluation memories \(batch "
                                                rf"{weights // row + 1}, memory 8\) needs"):
        TransformerXLLM(config, batch_size=weights // row + 1)
    with pytest.raises(MemoryBudgetError, match=r"^the training and evaluation memories \(batch "
                                                r"1, memory 1000\) needs"):
        TransformerXLLM(config, batch_size=1, mem_len=1000)


def test_weights_are_counted_in_the_variables_dtype(monkeypatch):
    """A bfloat16 model's weights are half a float32 one's: one that fits was
    refused as if float32; a mixed-precision model's variables stay float32."""
    config = TransformerXLConfig.preset("tiny", n_token=50, mem_len=8, tgt_len=4)
    weights = parameter_count(config) * 4
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: int(0.6 * weights))
    core = TransformerXL(config, dtype="bfloat16")
    assert {v.dtype for v in core.weights} == {"bfloat16"}
    with pytest.raises(MemoryBudgetError, match=r"^the model's weights"):
        TransformerXL(config, dtype="mixed_bfloat16")


def test_document_batches_that_cannot_fit_are_refused_before_they_are_made(monkeypatch):
    """`document_dataset(docs, 2, segment_len=10**9)` of two 3-id documents
    was a MemoryError (22 GiB of padding); here the memory available is 1 MiB."""
    from txl_tf.data.documents import document_segments
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 2 ** 20)
    assert document_segments([[1, 2, 3]] * 2, 2, 2 ** 15)[0].shape == (1, 2, 2 ** 15)
    with pytest.raises(MemoryBudgetError, match=r"^the document batches \(1 steps of batch 2, "
                                                r"segment 1,000,000\) needs at least 22\.9 MiB "
                                                r"\(ids, labels and weights 22\.9 MiB\) and this "
                                                r"machine has 1\.0 MiB available; lower "
                                                r"the segment length or the batch size$"):
        document_segments([[1, 2, 3]] * 2, 2, 10 ** 6)


@pytest.mark.parametrize("block", [None, 300])
def test_the_document_layouts_check_counts_what_it_allocates(monkeypatch, block):
    """`_plan`'s check counted 13 bytes a slot while its per-segment int64
    temporaries came to about 56 more: a layout near the limit got a
    MemoryError, not the refusal. The bytes checked are tracemalloc's peak
    within 25%, the layout the same whatever the block of segments."""
    import tracemalloc

    import numpy as np

    from txl_tf.data import documents
    rng = np.random.default_rng(0)
    for count, longest in [(60, 900), (3000, 12)]:  # few long documents, many short
        docs = [rng.integers(0, 50, int(rng.integers(2, longest))) for _ in range(count)]
        whole = documents._plan(docs, 4, 3)[1]
        if block:
            monkeypatch.setattr(documents, "_SEGMENT_BLOCK", block)
        checked = []
        monkeypatch.setattr(documents, "check_bytes",
                            lambda parts, *a: checked.append(sum(parts.values())))
        tracemalloc.start()
        try:
            layout = documents._plan(docs, 4, 3)[1]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        monkeypatch.undo()
        assert 0.8 < peak / checked[0] < 1.25, (count, peak, checked)
        for a, b in zip(layout, whole):
            np.testing.assert_array_equal(a, b)


def test_the_compiled_decoders_buffer_counts_with_its_new_ids(monkeypatch):
    """`Decoder.generate` without `stream=` also fills a `[B, 2**k]` buffer
    of ids and log-probs (2**k >= max_new_tokens) in its compiled loop: a
    request whose outputs just fit passed the check and ended in
    TensorFlow's OOM. A bad `pad_id`, checked after the budget, shows that
    a request got past it."""
    from txl_tf.generation.decoder import Decoder
    decoder = Decoder(TransformerXL(TransformerXLConfig.preset("tiny", n_token=50)),
                      jit_compile=False)
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 2 ** 20)  # 1 MiB
    count = 2 ** 16 + 1  # 0.5 MiB of outputs, a buffer of 2**17 positions (1 MiB)
    assert decoder.loop_buffer(count) == 2 ** 17
    with pytest.raises(MemoryBudgetError, match=r"^max_new_tokens 65,537 for 1 row needs at "
                                                r"least 1\.5 MiB \(the new ids and their "
                                                r"log-probs, and the decode loop's buffer of "
                                                r"131,072, 8 bytes each\)"):
        decoder.generate([[1, 2]], count, pad_id=50)
    assert decoder.loop_buffer(count, stream=print, stream_every=8) == 8
    with pytest.raises(TxlError, match="^pad_id must be"):  # chunks of 8: it fits
        decoder.generate([[1, 2]], count, pad_id=50, stream=print)
    with pytest.raises(TxlError, match="^pad_id must be"):  # outputs alone: no buffer
        generate_on(_NoBackend(), [[1, 2]], count, pad_id=50)


def test_a_refusal_under_an_address_space_limit_names_the_process(monkeypatch):
    """Under `ulimit -v` the room is the process's, not the machine's: the
    refusal said "this machine has 1.0 GiB available"."""
    from txl_tf.checks.memory_budget import check_bytes, check_new_ids
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: GIB)
    monkeypatch.setattr(memory_budget, "_address_space_room", lambda: GIB)
    for check in (lambda: check_new_ids(1, GIB), lambda: check_bytes({"x": 2 * GIB}, "x", "less")):
        with pytest.raises(MemoryBudgetError, match=r" and this process can allocate 1\.0 GiB; "):
            check()
    monkeypatch.setattr(memory_budget, "_address_space_room", lambda: 4 * GIB)  # not the bound
    with pytest.raises(MemoryBudgetError, match=r" and this machine has 1\.0 GiB available; "):
        check_new_ids(1, GIB)
    monkeypatch.setattr(memory_budget, "_address_space_room", lambda: None)  # no limit
    with pytest.raises(MemoryBudgetError, match=r" and this machine has 1\.0 GiB available; "):
        check_bytes({"x": 2 * GIB}, "x", "less")
