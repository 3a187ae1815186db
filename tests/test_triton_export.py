"""The Triton model repository: its config parsed by tritonclient's model-config
protobuf and held to the ONNX graph's interface; its batch-major model run in
onnxruntime as Triton's sequence batcher would, against the plain export and
the Keras core. (No Triton server runs here.)"""
import os
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from export import ExportError, export_onnx, open_runtime, run_export
from txl_tf import TransformerXLConfig
from txl_tf.weights import save_pretrained
from export import staging, triton
from export.parity import ParityError, core_outputs, random_segments
from export.triton import (CONFIG_FILE, INITIAL_STATE_DIR, cached_config, check_cached_model,
                           check_triton_model, model_file, sequence_log_probs,
                           sequence_outputs, triton_model_config, write_triton_repository)
from test_export_parity import random_core

MEM_LEN = 8
# ONNX element types → Triton data types, for the three the interface uses.
TRITON_TYPE = {onnx.TensorProto.INT32: model_config_pb2.TYPE_INT32,
               onnx.TensorProto.FLOAT: model_config_pb2.TYPE_FP32,
               onnx.TensorProto.BOOL: model_config_pb2.TYPE_BOOL}


@pytest.fixture(scope="module")
def core():
    return random_core()


@pytest.fixture(scope="module")
def exported(core, tmp_path_factory):
    """The repository (max batch 4) and the plain ONNX export of the same core."""
    out = tmp_path_factory.mktemp("triton")
    files = write_triton_repository(core, str(out / "repo"), MEM_LEN, max_batch_size=4)
    export_onnx(core, str(out / "model.onnx"), MEM_LEN)
    return out, files


def parse_config(path):
    with open(path, encoding="utf-8") as f:
        return text_format.Parse(f.read(), model_config_pb2.ModelConfig())


def onnx_interface(path):
    """`{name: (Triton type, dims)}` of the graph's inputs and outputs, the
    leading `batch` axis checked and dropped, named axes as -1."""
    graph = onnx.load(path, load_external_data=False).graph
    interface = {}
    for value in list(graph.input) + list(graph.output):
        tensor = value.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        assert dims[0] == "batch", f"{value.name}: batch is not the first axis ({dims})"
        interface[value.name] = (TRITON_TYPE[tensor.elem_type],
                                 [-1 if isinstance(d, str) else d for d in dims[1:]])
    return interface


def test_repository_layout(exported):
    out, files = exported
    repo = out / "repo"
    assert sorted(os.path.relpath(p, repo) for p in files) == [
        "txl/1/model.onnx", "txl/config.pbtxt", "txl_cached/1/model.onnx",
        "txl_cached/config.pbtxt"]
    assert sorted(os.listdir(repo / "txl")) == ["1", "config.pbtxt"]


def test_config_parses_and_matches_the_onnx_graph(exported, core):
    out, _ = exported
    config = parse_config(out / "repo" / "txl" / "config.pbtxt")
    interface = onnx_interface(model_file(str(out / "repo")))
    cfg = core.config
    assert (config.name, config.backend, config.max_batch_size) == ("txl", "onnxruntime", 4)
    # Inputs and outputs: what the ONNX graph declares, batch axis left out.
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("token_ids", *interface["token_ids"])]
    assert interface["token_ids"] == (model_config_pb2.TYPE_INT32, [-1])
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("log_probs", *interface["log_probs"])]
    assert interface["log_probs"][1] == [-1, cfg.n_token]
    # The memory is implicit state, batch-major in the graph, fixed geometry.
    batching = config.sequence_batching
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    assert batching.WhichOneof("strategy_choice") == "oldest"
    assert batching.oldest.max_candidate_sequences >= config.max_batch_size
    states = {s.input_name: s for s in batching.state}
    assert sorted((s.input_name, s.output_name) for s in batching.state) == [
        ("mem_mask", "new_mem_mask"), ("mems", "new_mems")]
    assert list(states["mems"].dims) == [cfg.n_layer, MEM_LEN, cfg.d_model]
    assert list(states["mem_mask"].dims) == [MEM_LEN]
    for state in batching.state:
        assert interface[state.input_name] == (state.data_type, list(state.dims))
        assert interface[state.output_name] == (state.data_type, list(state.dims))
        assert len(state.initial_state) == 1
        start = state.initial_state[0]
        assert start.name and start.data_type == state.data_type
        assert list(start.dims) == list(state.dims)
        # Zeros: an all-False mask is the empty memory (mems zero too).
        assert start.WhichOneof("state_data") == "zero_data" and start.zero_data
    assert states["mem_mask"].data_type == model_config_pb2.TYPE_BOOL
    # The onnxruntime backend counts the graph's inputs: config inputs, control
    # inputs and states. The graph has no START/READY: the initial state does it.
    assert not batching.control_input
    assert set(interface) == ({i.name for i in config.input} | set(states) |
                              {s.output_name for s in batching.state} |
                              {o.name for o in config.output})


def test_config_options_reach_the_parsed_config(core):
    cfg = core.config
    text = triton_model_config(cfg, 5, model_name="lm", log_probs="last", max_batch_size=2,
                               max_candidate_sequences=10, expose_memory=True)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert (config.name, config.max_batch_size) == ("lm", 2)
    assert config.sequence_batching.oldest.max_candidate_sequences == 10
    outputs = {o.name: list(o.dims) for o in config.output}
    assert outputs == {"log_probs": [cfg.n_token], "new_mems": [cfg.n_layer, 5, cfg.d_model],
                       "new_mem_mask": [5]}


@pytest.mark.parametrize("options, message", [
    ({"mem_len": 0}, "mem_len >= 1"),
    ({"max_batch_size": 0}, "max_batch_size must be >= 1"),
    ({"max_batch_size": 8, "max_candidate_sequences": 4}, "at least max_batch_size"),
    # config.pbtxt's int32 fields: a repository Triton could not load
    ({"max_batch_size": 2 ** 31}, "max_batch_size must be at most 2147483647"),
    ({"max_batch_size": 2 ** 29}, "max_candidate_sequences must be at most 2147483647"),
    ({"model_name": "a/b"}, "plain folder name"),
    # config.pbtxt's `name: "..."` would not parse, or name another folder
    ({"model_name": 'my "best" lm'}, "no quote, backslash"),
    ({"model_name": "a\\b"}, "no quote, backslash"),
    ({"model_name": "two\nlines"}, "no quote, backslash"),
    ({"log_probs": "first"}, "log_probs must be one of"),
    # were not checked here: written into config.pbtxt as given
    ({"max_queue_delay_microseconds": -5}, "max_queue_delay_microseconds must be >= 0"),
    ({"max_sequence_idle_microseconds": -1}, "max_sequence_idle_microseconds must be >= 0"),
    # were int()'d: 2.5 written as 2, "4" and True taken, inf/NaN int()'s own errors
    ({"max_batch_size": 2.5}, r"^max_batch_size must be an integer, got 2\.5$"),
    ({"max_batch_size": float("inf")}, r"^max_batch_size must be an integer, got inf$"),
    ({"max_batch_size": "4"}, r"^max_batch_size must be an integer, got '4'$"),
    ({"max_batch_size": True}, r"^max_batch_size must be an integer, got True$"),
    ({"max_candidate_sequences": 20.5}, r"^max_candidate_sequences must be an integer"),
    ({"max_queue_delay_microseconds": float("nan")}, r"^max_queue_delay_microseconds must be an"),
])
def test_bad_options_are_refused(core, options, message):
    options = {"mem_len": 4, **options}
    with pytest.raises(ValueError, match=message):
        triton_model_config(core.config, **options)


def test_model_matches_the_plain_export_and_the_core(exported, core):
    out, _ = exported
    segments = random_segments(core.config.n_token, 3, 5, n_segments=2, seed=3)
    plain = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    mems = np.zeros([core.config.n_layer, 3, MEM_LEN, core.config.d_model], np.float32)
    mask = np.zeros([3, MEM_LEN], bool)
    batch_major = sequence_outputs(model_file(str(out / "repo")), segments)
    for ids, (log_probs, new_mems, new_mask) in zip(segments, batch_major):
        lp, mems, mask = plain.run(None, {"token_ids": ids, "mems": mems, "mem_mask": mask})
        # sequence_outputs transposed the batch-major new_mems back: same numbers.
        np.testing.assert_allclose(log_probs, lp, atol=1e-5, rtol=0)
        np.testing.assert_allclose(new_mems, mems, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(new_mask, mask)
    assert batch_major[1][2].any()  # the second segment read a non-empty memory
    reference = core_outputs(core, segments, MEM_LEN)
    diff = check_triton_model(reference, model_file(str(out / "repo")), segments)
    assert diff["log_probs"] < 1e-4 and diff["mem_mask_equal"]
    # Streams batched by Triton's sequence batcher get what each gets alone.
    alone = sequence_outputs(model_file(str(out / "repo")), [s[1:2] for s in segments])
    for (lp_batch, _, _), (lp_alone, _, _) in zip(batch_major, alone):
        np.testing.assert_allclose(lp_batch[1:2], lp_alone, atol=1e-5, rtol=0)
    with pytest.raises(ParityError, match="Triton"):
        check_triton_model(core_outputs(core, segments[::-1], MEM_LEN),
                           model_file(str(out / "repo")), segments)


def test_open_runtime_refuses_the_batch_major_model(exported):
    out, _ = exported
    with pytest.raises(ValueError, match="Triton repository"):
        open_runtime(model_file(str(out / "repo")), device="cpu")


def test_zero_filled_start_is_a_data_file_of_true(core, tmp_path):
    files = write_triton_repository(core, str(tmp_path), 4, model_name="zf", zero_filled=True,
                                    max_batch_size=2)
    config = parse_config(tmp_path / "zf" / "config.pbtxt")
    start = {s.input_name: s.initial_state[0] for s in config.sequence_batching.state}
    assert start["mems"].zero_data
    assert start["mem_mask"].WhichOneof("state_data") == "data_file"
    data = tmp_path / "zf" / "initial_state" / start["mem_mask"].data_file
    assert str(data) in files and data.read_bytes() == b"\x01" * 4  # TYPE_BOOL: 1 byte
    assert not (tmp_path / "zf_cached").exists()  # a zero memory's keys are not zeros
    segments = random_segments(core.config.n_token, 2, 3, n_segments=2, seed=1)
    check_triton_model(core_outputs(core, segments, 4, zero_filled=True),
                       model_file(str(tmp_path), "zf"), segments)


def test_export_job_writes_and_checks_the_repository(core, tmp_path):
    save_pretrained(core, str(tmp_path / "model"))
    out = tmp_path / "out"
    report = run_export(str(out), model_dir=str(tmp_path / "model"), formats=["triton"],
                        mem_len=4, log_probs="last",
                        triton_options={"model_name": "lm", "max_batch_size": 8})
    assert report["files"] == ["config.json", "triton/lm/1/model.onnx",
                               "triton/lm/config.pbtxt", "triton/lm_cached/1/model.onnx",
                               "triton/lm_cached/config.pbtxt", "export_report.json"]
    assert set(report["parity"]) == {"triton", "triton_cached"}
    assert report["parity"]["triton"]["log_probs"] < 1e-4
    assert report["parity"]["triton_cached"]["log_probs"] < 1e-4
    config = parse_config(out / "triton" / "lm" / "config.pbtxt")
    assert config.max_batch_size == 8
    assert onnx_interface(str(out / "triton" / "lm" / "1" / "model.onnx"))["log_probs"] == (
        model_config_pb2.TYPE_FP32, [core.config.n_token])
    with pytest.raises(ExportError, match="mem_len >= 1"):
        run_export(str(tmp_path / "none"), model_dir=str(tmp_path / "model"),
                   formats=["onnx", "triton"], mem_len=0)
    assert not (tmp_path / "none").exists()


def test_a_re_export_into_the_repository_leaves_no_file_of_the_one_before(core, tmp_path):
    """A repository holds several models, so one is written into it again:
    the cached model of the first export (other settings, maybe other
    weights) stayed beside a zero-filled re-export, which has none, and
    Triton served it."""
    repo = tmp_path / "repo"
    write_triton_repository(core, str(repo), 4, cached=True)
    (repo / "txl" / "1" / "model.onnx.data").write_bytes(b"an older export's weights")
    (repo / "other").mkdir()  # another model of the repository
    written = write_triton_repository(core, str(repo), 4, zero_filled=True)
    files = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file())
    assert files == sorted(os.path.relpath(p, repo) for p in written) == [
        "txl/1/model.onnx", "txl/config.pbtxt", "txl/initial_state/mem_mask_all_true"]
    assert sorted(os.listdir(repo)) == ["other", "txl"]


def _write_generation(repo, generation, monkeypatch, zero_filled=False):
    """`write_triton_repository` with each model file holding `generation`
    (no conversion: only the folders' replacement is under test)."""
    def export(core, path, *args, **kwargs):
        with open(path, "w") as f:
            f.write(generation)
        return [path]
    monkeypatch.setattr(triton, "export_onnx", export)
    monkeypatch.setattr(triton, "export_cached_onnx", export)
    core = types.SimpleNamespace(config=TransformerXLConfig.preset("tiny"))
    return write_triton_repository(core, str(repo), 4, zero_filled=zero_filled)


def _generations(repo):
    """`{model folder: its generation}`, each folder checked whole."""
    seen = {}
    for name in sorted(os.listdir(repo)):
        if not name.startswith("."):
            assert os.listdir(repo / name / "1") == ["model.onnx"]
            assert (repo / name / CONFIG_FILE).is_file()
            seen[name] = (repo / name / "1" / "model.onnx").read_text()
    return seen


@pytest.mark.parametrize("zero_filled", [False, True])
def test_a_killed_write_never_pairs_an_old_model_with_a_new_one(tmp_path, monkeypatch,
                                                                killed_at_file_operation,
                                                                zero_filled):
    """Each model folder was swapped in on its own, the cached one first, and
    an older cached model deleted after: a kill between left the new cached
    model beside the old step model, or an old cached model beside a new
    zero-filled one. At every kill point the models Triton sees are of one
    export; the next call finishes the killed one's replacement or undoes it."""
    new = {"txl": "new"} if zero_filled else {"txl": "new", "txl_cached": "new"}
    for k in range(1, 20):
        repo = tmp_path / str(k)
        _write_generation(repo, "old", monkeypatch)
        done = killed_at_file_operation(
            lambda: _write_generation(repo, "new", monkeypatch, zero_filled), k)
        seen = _generations(repo)
        assert set(seen) <= {"txl", "txl_cached"} and len(set(seen.values())) <= 1, (k, seen)
        with monkeypatch.context() as patch:
            patch.setattr(staging, "process_alive", lambda pid: False)  # the writer is gone
            staging.finish_stale(str(repo / "txl"))
        assert _generations(repo) in ({"txl": "old", "txl_cached": "old"}, new), k
        assert sorted(os.listdir(repo)) == sorted(_generations(repo)), k  # no leftover
        if done:
            break
    assert done and k > 3, k


def test_a_write_interrupted_in_this_process_is_finished_before_the_next(
        tmp_path, monkeypatch, killed_at_file_operation):
    """A write stopped after its commit (Ctrl-C) in a process that goes on:
    its leftover was left for a later process, which put its models in place
    of the newer ones written since."""
    repo = tmp_path / "repo"
    _write_generation(repo, "old", monkeypatch)
    assert not killed_at_file_operation(lambda: _write_generation(repo, "new", monkeypatch), 3)
    _write_generation(repo, "next", monkeypatch)
    with monkeypatch.context() as patch:
        patch.setattr(staging, "process_alive", lambda pid: False)  # a later process
        staging.finish_stale(str(repo / "txl"))
    assert _generations(repo) == {"txl": "next", "txl_cached": "next"}
    assert sorted(os.listdir(repo)) == ["txl", "txl_cached"]


def test_export_job_takes_the_repositorys_cached_option(core, tmp_path):
    """`triton_options` are `write_triton_repository`'s: `cached=False` was
    refused as an unknown option of the config."""
    save_pretrained(core, str(tmp_path / "model"))
    report = run_export(str(tmp_path / "out"), model_dir=str(tmp_path / "model"),
                        formats=["triton"], mem_len=4, verify=False,
                        triton_options={"cached": False})
    assert report["files"] == ["config.json", "triton/txl/1/model.onnx",
                               "triton/txl/config.pbtxt", "export_report.json"]


def test_the_cached_models_config_parses_and_matches_its_graph(exported, core):
    out, _ = exported
    cfg = core.config
    config = parse_config(out / "repo" / "txl_cached" / "config.pbtxt")
    interface = onnx_interface(model_file(str(out / "repo"), "txl_cached"))
    assert (config.name, config.backend, config.max_batch_size) == ("txl_cached",
                                                                    "onnxruntime", 4)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("token_ids", model_config_pb2.TYPE_INT32, [-1])] == [
        ("token_ids", *interface["token_ids"])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        ("log_probs", *interface["log_probs"])]
    batching = config.sequence_batching
    names = [f"{kind}_{i}" for kind in ("keys", "values") for i in range(cfg.n_layer)]
    assert [(s.input_name, s.output_name) for s in batching.state] == [
        (n, f"new_{n}") for n in names + ["mem_mask"]]
    for state in batching.state:
        dims = [MEM_LEN] if state.input_name == "mem_mask" else [cfg.n_head, MEM_LEN,
                                                                 cfg.d_head]
        assert list(state.dims) == dims
        assert interface[state.input_name] == interface[state.output_name] == (
            state.data_type, dims)
        start = state.initial_state[0]
        assert start.WhichOneof("state_data") == "zero_data" and list(start.dims) == dims
    assert set(interface) == ({"token_ids", "log_probs"} | {s.input_name for s in batching.state}
                              | {s.output_name for s in batching.state})
    # Its metadata said `decode_cache_layout: keys_as_columns`, the decode
    # graphs' [d_head, S] keys; its keys are [n_head, M, d_head] rows.
    graph = onnx.load(model_file(str(out / "repo"), "txl_cached"), load_external_data=False)
    meta = {p.key: p.value for p in graph.metadata_props}
    assert (meta["memory_layout"], meta["decode_cache_layout"]) == ("keys_values",
                                                                    "keys_as_rows")
    assert meta["inputs"].split(",") == [i.name for i in graph.graph.input]
    assert meta["outputs"].split(",") == [o.name for o in graph.graph.output]
    exposed = text_format.Parse(cached_config(cfg, 5, "c", "last", 2, expose_memory=True),
                                model_config_pb2.ModelConfig())
    assert {o.name: list(o.dims) for o in exposed.output}["new_mem_mask"] == [5]


def test_the_cached_model_reads_what_the_core_reads(exported, core):
    """Segments of 5 ids, then one-id requests (a decode): the memory (8)
    fills and slides; log-probs as the core's, and streams batched by
    Triton get what each gets alone."""
    out, _ = exported
    path = model_file(str(out / "repo"), "txl_cached")
    segments = (random_segments(core.config.n_token, 3, 5, n_segments=2, seed=3)
                + random_segments(core.config.n_token, 3, 1, n_segments=4, seed=4))
    reference = core_outputs(core, segments, MEM_LEN)
    assert check_cached_model(reference, path, segments)["log_probs"] < 1e-4
    alone = sequence_log_probs(path, [s[1:2] for s in segments])
    for batch, one in zip(sequence_log_probs(path, segments), alone):
        np.testing.assert_allclose(batch[1:2], one, atol=1e-5, rtol=0)
    with pytest.raises(ParityError, match="cached model"):
        check_cached_model(core_outputs(core, segments[::-1], MEM_LEN), path, segments)


def test_the_cached_models_check_fails_on_a_nan(monkeypatch):
    """A NaN in the cached model's log-probs fails its parity check (it was
    a difference of 0)."""
    import export.triton as triton
    want = np.zeros([2, 3, 5], np.float32)
    got = want.copy()
    got[0, 1, 2] = np.nan
    monkeypatch.setattr(triton, "sequence_log_probs", lambda path, segments: [got])
    with pytest.raises(ParityError, match="cached model differs .* inf"):
        check_cached_model([(want, None, None)], "unused.onnx", [None])


@pytest.mark.parametrize("tol", [float("nan"), float("inf")])
def test_the_repositorys_checks_refuse_a_tolerance_that_passes_everything(monkeypatch, tol):
    """tol=NaN passed any difference (`diff > nan` is False), as
    `export.parity`'s checks did."""
    import export.triton as triton
    want = np.zeros([2, 3, 5], np.float32)
    monkeypatch.setattr(triton, "sequence_log_probs", lambda path, segments: [want + 1])
    monkeypatch.setattr(triton, "sequence_outputs", lambda path, segments: [(want + 1, want, want)])
    for check in (check_cached_model, check_triton_model):
        with pytest.raises(ValueError, match=r"^tol must be a finite number"):
            check([(want, want, want)], "unused.onnx", [None], tol=tol)


def random_repository_case(seed):
    """A small random config (one head or several, one layer or two) and
    random repository options; seed 0 is zero-filled (no cached model)."""
    rng = np.random.default_rng(seed)
    n_head = int(rng.choice([1, 2]))
    config = TransformerXLConfig(
        n_token=int(rng.choice([13, 30])), n_layer=int(rng.integers(1, 3)), d_model=8,
        n_head=n_head, d_head=int(rng.choice([3, 4])), d_inner=12, dropout=0.0, tgt_len=3,
        mem_len=3, untie_r=bool(rng.random() < 0.5), same_length=bool(rng.random() < 0.5))
    max_batch_size = int(rng.integers(1, 4))
    options = dict(mem_len=int(rng.integers(1, 5)), log_probs=str(rng.choice(["all", "last"])),
                   zero_filled=seed == 0, max_batch_size=max_batch_size,
                   max_candidate_sequences=max_batch_size + int(rng.integers(0, 3)),
                   expose_memory=bool(rng.random() < 0.5))
    return config, options


def check_against_the_graph(folder, name, options, config, rng):
    """Every field of `folder/name/config.pbtxt` and of the graph's metadata
    against the ONNX graph (declared interface, and the shapes a run at a
    random batch and length gives)."""
    config_pb = parse_config(os.path.join(folder, name, CONFIG_FILE))
    path = model_file(folder, name)
    assert (config_pb.name, config_pb.backend, config_pb.platform) == (name, "onnxruntime", "")
    assert config_pb.default_model_filename in ("", "model.onnx") and os.path.isfile(path)
    assert config_pb.max_batch_size == options["max_batch_size"]
    interface = onnx_interface(path)  # every axis 0 is "batch": Triton batches there
    batching = config_pb.sequence_batching
    assert batching.oldest.max_candidate_sequences == options["max_candidate_sequences"]
    named = [(i.name, i.data_type, list(i.dims)) for i in config_pb.input] + [
        (o.name, o.data_type, list(o.dims)) for o in config_pb.output]
    for state in batching.state:
        named += [(n, state.data_type, list(state.dims))
                  for n in (state.input_name, state.output_name)]
        (start,) = state.initial_state
        assert (start.data_type, list(start.dims)) == (state.data_type, list(state.dims))
        if start.WhichOneof("state_data") == "data_file":
            data = os.path.join(folder, name, INITIAL_STATE_DIR, start.data_file)
            assert state.data_type == model_config_pb2.TYPE_BOOL
            assert np.fromfile(data, np.uint8).tolist() == [1] * int(np.prod(state.dims))
    for tensor, data_type, dims in named:
        assert interface[tensor] == (data_type, dims), tensor
    assert not batching.control_input  # the graph's inputs are the config's and the states
    graph = onnx.load(path, load_external_data=False)
    inputs = [i.name for i in graph.graph.input]
    assert set(inputs) == {i.name for i in config_pb.input} | {s.input_name for s in
                                                                batching.state}
    # The metadata: each field it states is true of this graph.
    meta = {p.key: p.value for p in graph.metadata_props}
    outputs = [o.name for o in graph.graph.output]
    assert meta["inputs"].split(",") == inputs and meta["outputs"].split(",") == outputs
    assert TransformerXLConfig.from_json(meta["txl_tf.config"]) == config
    assert (meta["n_token"], meta["vocab_size"], meta["token_ids_dtype"]) == (
        str(config.n_token),) * 2 + ("int32",)
    assert interface["token_ids"][0] == model_config_pb2.TYPE_INT32
    assert interface["log_probs"][1] == ([-1] if meta["log_probs"] == "all" else []) + [
        config.n_token]
    starts = {s.input_name: s.initial_state[0] for s in batching.state}
    assert meta["zero_filled_memory"] == str(
        starts["mem_mask"].WhichOneof("state_data") == "data_file").lower()
    mem_len = int(meta["mem_len"])
    assert interface["mem_mask"][1] == [mem_len]
    if meta["memory_layout"] == "batch_major":
        assert interface["mems"][1] == [int(meta["n_layer"]), mem_len, int(meta["d_model"])]
    else:
        assert meta["memory_layout"] == "keys_values"
        by_layout = {"keys_as_rows": [config.n_head, mem_len, config.d_head],
                     "keys_as_columns": [config.n_head, config.d_head, mem_len]}
        for i in range(int(meta["n_layer"])):
            assert interface[f"keys_{i}"][1] == by_layout[meta["decode_cache_layout"]]
    # A run at a random batch and length gives the shapes the config states.
    batch, length = int(rng.integers(1, config_pb.max_batch_size + 1)), int(rng.integers(1, 5))
    numpy_type = {model_config_pb2.TYPE_FP32: np.float32, model_config_pb2.TYPE_BOOL: np.bool_}
    feeds = {s.input_name: np.zeros([batch, *s.dims], numpy_type[s.data_type])
             for s in batching.state}
    feeds["token_ids"] = rng.integers(0, config.n_token, (batch, length), dtype=np.int32)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = dict(zip(outputs, session.run(None, feeds)))
    for tensor, _, dims in named:
        if tensor in got:
            assert list(got[tensor].shape) == [batch] + [length if d == -1 else d
                                                         for d in dims], tensor


@pytest.mark.parametrize("seed", [0, 1])
def test_random_repositories_say_what_their_graphs_are(tmp_path, seed):
    """Seeded random configs and options: every config.pbtxt and metadata
    field of each model is held to its graph, and both models to the core."""
    config, options = random_repository_case(seed)
    core = random_core(seed, **config.to_dict())
    rng = np.random.default_rng(seed)
    folder = str(tmp_path)
    write_triton_repository(core, folder, **options)
    names = sorted(os.listdir(folder))
    assert names == (["txl"] if options["zero_filled"] else ["txl", "txl_cached"])
    for name in names:
        check_against_the_graph(folder, name, options, core.config, rng)
    segments = [rng.integers(0, config.n_token, (options["max_batch_size"], n), dtype=np.int32)
                for n in (2, 1, 3)]
    reference = core_outputs(core, segments, options["mem_len"], options["log_probs"],
                             options["zero_filled"])
    check_triton_model(reference, model_file(folder), segments)
    if "txl_cached" in names:
        check_cached_model(reference, model_file(folder, "txl_cached"), segments)
