"""The exported decode step stays a graph of few nodes: at batch 1 on a GPU
a step costs about its kernel launches, and each node is at least one
(`benchmarks/inference.py`, `--part=decode_nodes`; the table in benchmarks/README.md)."""
import pytest

from benchmarks.inference import export_step, kernels, node_counts, per_layer
from txl_tf import TransformerXLConfig

CONFIG = TransformerXLConfig.preset("tiny", mem_len=5)
# What a layer adds to the step after ONNX Runtime's optimizations: 34 nodes,
# 20 of them kernels (71 and 58 before the step was written for few nodes; 31
# and 23 before its residual adds went into the layer norms, for 4 more views;
# 35 and 21 before the query with v came from the projection's bias).
MAX_NODES_PER_LAYER = 34
MAX_KERNELS_PER_LAYER = 20


@pytest.fixture(scope="module")
def step_nodes(tmp_path_factory):
    """The optimized decode step's nodes by op type, with 2 and 3 layers."""
    folder = tmp_path_factory.mktemp("decode_step_nodes")
    return [node_counts(export_step(CONFIG.replace(n_layer=n), CONFIG.mem_len,
                                    str(folder / str(n))), "all") for n in (2, 3)]


@pytest.fixture(scope="module")
def layer_nodes(step_nodes):
    """The nodes one layer adds to the optimized decode step, by op type."""
    return per_layer(*step_nodes)


def test_a_layer_adds_few_nodes_to_the_decode_step(layer_nodes):
    assert sum(layer_nodes.values()) <= MAX_NODES_PER_LAYER, layer_nodes
    assert kernels(layer_nodes) <= MAX_KERNELS_PER_LAYER, layer_nodes


# The 2-layer step's kernels at CONFIG (60 with the reduction of its ids'
# check, 63 when an empty batch was flagged from the ids' Size, 59 before the
# embedding's scale went into its table).
MAX_STEP_KERNELS = 58


def test_the_steps_id_check_reads_no_shape_and_adds_few_kernels(step_nodes):
    """The step, which a GPU may replay per token, checks its ids elementwise:
    no Size or Shape (ONNX Runtime's CUDA provider keeps their value on the
    host: a copy back each step, which no CUDA graph captures) and no
    reduction."""
    assert not {"Size", "Shape", "ReduceMax"} & set(step_nodes[0]), step_nodes[0]
    assert kernels(step_nodes[0]) <= MAX_STEP_KERNELS, step_nodes[0]


def test_the_step_projects_once_and_its_residual_layer_norms_fuse(layer_nodes):
    # One matmul for the token's query, key and value (Gemm: u and v its
    # bias), one for the first feed-forward layer (FusedGemm: its bias and the
    # ReLU); the second's bias is its layer norm's (SkipLayerNormalization's
    # bias input): a MatMul, where a Gemm's bias is a cuBLAS call of its own
    # on CUDA.
    assert layer_nodes["Gemm"] + layer_nodes["FusedGemm"] == 2, layer_nodes
    # Each residual add and its layer norm: one SkipLayerNormalization.
    assert layer_nodes["SkipLayerNormalization"] == 2, layer_nodes
    assert layer_nodes["LayerNormalization"] == 0, layer_nodes


def test_the_queries_with_u_and_v_come_from_the_projection(layer_nodes):
    # The scale and both biases are in the one projection (its weights and
    # bias): no Mul or Add on a query. The Adds left: the relative term onto
    # the content scores, the hidden slots' -1e30 (one BiasSoftmax with the
    # softmax on a GPU) and the new position's value onto the ring's.
    assert layer_nodes["Add"] == 3, layer_nodes
    # The one Mul: the new position's weight times its value.
    assert layer_nodes["Mul"] == 1, layer_nodes


def test_the_step_orders_its_slots_once(step_nodes):
    # Each slot's row in the tables written twice over (positions,
    # visibility by distance): one Sub, no floor mod (tf2onnx's: Sub, Div,
    # Mul, Sub; the step took 6 Subs and 2 Divs when the positions had a mod
    # of their own).
    assert (step_nodes[0]["Sub"], step_nodes[0]["Div"]) == (1, 0), step_nodes[0]


@pytest.mark.parametrize("same_length,convention,gathers", [
    (False, "tf", 3), (True, "tf", 3), (True, "pytorch", 4)])
def test_the_step_gathers_a_visibility_by_distance_only_where_one_hides_a_key(
        tmp_path, same_length, convention, gathers):
    # The ids' guard, the embedding, the positions; and the visibility by
    # distance (with its And) only where a query after a full memory does
    # not see all of it.
    config = CONFIG.replace(n_layer=2, same_length=same_length,
                            same_length_convention=convention)
    counts = node_counts(export_step(config, CONFIG.mem_len, str(tmp_path)), "all")
    assert (counts["Gather"], counts["And"]) == (gathers, gathers - 3), counts


# `decode_token`, the step that writes its rings in place: per layer the
# step's kernels less the new position's stand-ins (its score's matmul and
# Where, its weight's matmul and Where, the Mul and Add onto the values),
# plus the two writes (one ScatterElements each for the key and the value).
MAX_TOKEN_KERNELS_PER_LAYER = 16


@pytest.fixture(scope="module")
def token_graphs(tmp_path_factory):
    """The optimized `decode_token` graphs with 2 and 3 layers."""
    from benchmarks.inference import optimized_graph
    folder = tmp_path_factory.mktemp("decode_token_nodes")
    return [optimized_graph(export_step(CONFIG.replace(n_layer=n), CONFIG.mem_len,
                                        str(folder / str(n)), interface="decode_token"),
                            "all", load_weights=False) for n in (2, 3)]


def _counts(graph):
    import collections
    return collections.Counter(node.op_type for node in graph.graph.node)


def test_the_token_step_writes_each_ring_once_in_place_and_reads_it_there(token_graphs):
    layer = per_layer(*(_counts(g) for g in token_graphs))
    assert kernels(layer) <= MAX_TOKEN_KERNELS_PER_LAYER, layer
    assert layer["ScatterElements"] == 2 and layer["Where"] == 0, layer
    # q·r, its positions, the scores, the values, the output projection, the
    # second feed-forward layer (its bias in its layer norm)
    assert layer["MatMul"] + layer["FusedMatMul"] == 6, layer
    graph = token_graphs[1].graph
    outputs = {o.name for o in graph.output}
    scatters = [n for n in graph.node if n.op_type == "ScatterElements"]
    # Every ring, the layer inputs and the flags: written by the scatter
    # itself into the graph's output, which a runtime binds to the ring's
    # buffer (no copy after it).
    assert len(scatters) == 2 * 3 + 2 and all(n.output[0] in outputs for n in scatters)
    # No ScatterND (it copies its shape from the host each run) and no shape
    # arithmetic (ONNX Runtime would run it on the CPU: no CUDA graph).
    counts = _counts(token_graphs[1])
    assert not {"ScatterND", "Shape", "Slice", "Range", "ConstantOfShape"} & set(counts), counts
    # Each input written in place is read by its write alone: a node reading
    # it could run after the write and see the new token (the flags, keys and
    # values are read through the written tensors).
    for name in ("valid", "cache_mems", "keys_0", "keys_2", "values_1"):
        readers = [n for n in graph.node if name in n.input]
        assert [n.op_type for n in readers] == ["ScatterElements"] and \
            readers[0].input[0] == name and readers[0].output[0] == f"new_{name}", name


def test_the_token_step_reads_the_flags_it_wrote(token_graphs):
    # Each row sees its own slot through the flags the step wrote first: no
    # comparison with the ring's slot and no Or with it (2 kernels a step).
    counts = _counts(token_graphs[1])
    assert counts["Equal"] == 0 and counts["Or"] == 0, counts


def test_the_token_step_is_fewer_kernels_than_the_step_and_the_write(step_nodes, token_graphs,
                                                                      tmp_path):
    from export.device_cache import ring_write_model
    path = tmp_path / "write.onnx"
    path.write_bytes(ring_write_model(CONFIG.mem_len + 1).SerializeToString())
    write = kernels(node_counts(str(path), "all"))
    assert kernels(_counts(token_graphs[1])) < kernels(step_nodes[1]) + write


# `decode_token`'s kernels as the CPU provider optimizes it, by op type, pinned
# (a change that adds one fails here). A layer: the joint projection (Gemm, u
# and v its bias) and its Split; the position scores (the query through `r`,
# then against the positions: MatMul, FusedMatMul); the key's and the value's
# writes; the content scores, the scores' sum and the hidden slots' add
# before the softmax (CUDA: one BiasSoftmax); the weighted values and the
# output projection; the two residual layer norms; the feed-forward's first
# layer (FusedGemm; CUDA: a Gemm and a Relu) and its second, a MatMul whose
# bias is its layer norm's (a Gemm's bias is a cuBLAS call of its own on
# CUDA). The same count on CUDA, where each Gemm with a bias is two launches.
TOKEN_LAYER_KERNELS = {"Gemm": 1, "FusedGemm": 1, "Split": 1, "MatMul": 5, "FusedMatMul": 1,
                       "ScatterElements": 2, "Add": 2, "Softmax": 1,
                       "SkipLayerNormalization": 2}
# Outside the layers (2 layers): the embedding's gather, from its table
# scaled at load (a Mul after it before); the positions in slot order (Sub,
# Gather); each row's slot (Where) and the writes' coordinates (2 Adds); the
# flags written (Not, ScatterElements) and read as the hidden slots' bias
# (Where); the layer inputs written (Concat, ScatterElements); the output
# (Gemm, LogSoftmax); the next slots (Gather, Where).
TOKEN_STEP_KERNELS = {"Gather": 3, "Sub": 1, "Where": 3, "Add": 2, "Not": 1,
                      "ScatterElements": 2, "Concat": 1, "Gemm": 1, "LogSoftmax": 1}


def test_the_token_steps_kernels_are_the_pinned_ones(token_graphs):
    from benchmarks.inference import VIEW_OPS
    counts = [_counts(g) for g in token_graphs]
    layer = per_layer(*counts)
    assert {op: n for op, n in layer.items() if op not in VIEW_OPS} == TOKEN_LAYER_KERNELS, layer
    outside = {op: n - 2 * layer[op] for op, n in counts[0].items() if op not in VIEW_OPS}
    assert {op: n for op, n in outside.items() if n} == TOKEN_STEP_KERNELS, outside



def test_an_adaptive_inputs_bins_cast_no_ids_in_the_onnx_step(tmp_path):
    """The adaptive input's bins do their index math in the ids' own int32
    in the ONNX graphs (ONNX Runtime keeps int32 on the GPU; TensorFlow's
    graphs use int64: tests/test_gpu_kernels.py): no Cast to int64, a
    kernel, in the token step (its bins' Casts are their masks, to float)."""
    import onnx

    from benchmarks.inference import optimized_graph
    config = CONFIG.replace(n_token=256, cutoffs=[60, 120, 200], div_val=2)
    graph = optimized_graph(export_step(config, config.mem_len, str(tmp_path),
                                        interface="decode_token"), "all", load_weights=False)
    to = [onnx.TensorProto.DataType.Name(a.i) for n in graph.graph.node if n.op_type == "Cast"
          for a in n.attribute if a.name == "to"]
    assert to and "INT64" not in to, to
