"""onnxruntime's `symbolic_shape_infer` (run before TensorRT, and by many
graph tools) on every graph an export writes or a runtime builds: it
completes, and each output's axes come out as the graph declares them
(named axes, sizes), or as its inputs' for the small device graphs, never
as names the tool makes up or as wrong axes (docs/export-and-serving.md,
"Other ONNX runtimes and tools")."""
import onnx
import pytest
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference as infer

from export.device_cache import copy_model, ring_memory_model, ring_write_model
from export.triton import write_triton_repository
from test_decode_cache_export import export_of_config

LM_GRAPHS = ["model.onnx", "decode_init.onnx", "decode_step.onnx", "decode_read.onnx",
             "decode_token.onnx", "triton/txl/1/model.onnx", "triton/txl_cached/1/model.onnx"]


@pytest.fixture(scope="module")
def lm_graphs(built_once, tmp_path_factory):
    """The shared export's folder and a Triton repository of its core:
    `{name: path}` of each graph in `LM_GRAPHS`."""
    core, out = export_of_config(built_once)
    repo = tmp_path_factory.mktemp("shapes") / "triton"
    write_triton_repository(core, str(repo), 5)
    return {name: (repo.parent if name.startswith("triton/") else out) / name
            for name in LM_GRAPHS}


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """The tool saves a graph it could not finish into the working folder."""
    monkeypatch.chdir(tmp_path)


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def inferred_outputs(model):
    """Each output's axes as the tool infers them (one name or size each)."""
    done = infer.infer_shapes(model, auto_merge=True)
    return {o.name: dims(o) for o in done.graph.output}


def check_declared(model):
    declared = {o.name: dims(o) for o in model.graph.output}
    assert all(all(d) for d in declared.values()), declared  # every axis named or sized
    assert inferred_outputs(model) == declared


@pytest.mark.parametrize("name", LM_GRAPHS)
def test_every_lm_graph_infers_its_declared_shapes(lm_graphs, name):
    check_declared(onnx.load(str(lm_graphs[name])))


def test_the_device_graphs_infer_their_inputs_shapes():
    """The ring's write, its memory and the cache copy (built at run time,
    axes undeclared): each output's axes follow its inputs'."""
    write = inferred_outputs(ring_write_model(6))
    assert write["new_cache_mems"] == [f"cache_mems_d{i}" for i in range(4)]
    assert write["new_keys"] == [f"keys_d{i}" for i in range(5)]
    assert write["new_valid"] == ["valid_d0", "valid_d1"]
    assert len(write["new_row_slot"]) == 1 and write["new_slot"] == []  # rows: any input's
    memory = inferred_outputs(ring_memory_model(6))
    rows = memory["mem_mask"][0]
    assert rows in ("valid_d0", "row_slot_d0") and memory["mem_mask"] == [rows, 5]
    assert memory["mems"] == ["cache_mems_d0", rows, 5, "cache_mems_d3"]
    copied = inferred_outputs(copy_model())
    assert copied["copy_keys"] == [f"keys_d{i}" for i in range(5)]
    assert copied["copy_slot"] == []
