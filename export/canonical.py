"""One byte-identical graph for one computation (`canonical_graph`).

tf2onnx orders nodes and constants by iterating sets of objects and names
what it makes from process-wide counters, so two conversions of the same
function give graphs that compute the same thing in different node orders
under different names. The pass here gives each node and constant a key
computed from what it is and what it reads (never from a name), orders the
nodes topologically by those keys and names every internal tensor from its
place in that order.
"""
import hashlib
import heapq
import logging
import re

import onnx

_UNKNOWN_DIM = re.compile(r"unk__\d+")


def canonical_graph(model):
    """Renames and reorders `model`'s graph in place so that equal graphs
    serialize to equal bytes: nodes in a topological order with ties broken
    by content, internal tensors named `t{node}_{output}`, nodes
    `n{node}_{op}`, constants `c{k}` in content order (equal ones made one),
    tf2onnx's anonymous axes `unk__{k}` in order of use, no doc string
    (tf2onnx's names the traced function). The graph's inputs
    and outputs keep their names and order. A graph with subgraphs (Loop,
    If) is left as it is.

    Args:
        model: an ONNX `ModelProto` (tf2onnx's, weights as graph inputs).

    Returns:
        `model`.
    """
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for node in graph.node for a in node.attribute):
        logging.info("graph with subgraphs: its node order and names are tf2onnx's")
        return model
    kept = {value.name for value in list(graph.input) + list(graph.output)}
    key = {"": ""}
    for value in graph.input:
        key[value.name] = "input:" + value.name
    renamed = {name: name for name in kept}
    renamed[""] = ""
    constants = {}
    for tensor in graph.initializer:
        content = _digest(_without_name(tensor).SerializeToString())
        if tensor.name in kept:
            content = "kept:" + tensor.name
        key[tensor.name] = "const:" + content
        constants.setdefault(content, tensor)
    for k, content in enumerate(sorted(constants)):
        if constants[content].name not in kept:
            renamed[constants[content].name] = f"c{k}"
    for tensor in graph.initializer:
        renamed[tensor.name] = renamed[constants[key[tensor.name][len("const:"):]].name]

    nodes = list(graph.node)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    node_keys = [None] * len(nodes)

    def node_key(i):
        node = nodes[i]
        parts = [node.domain, node.op_type]
        parts += [_without_name(a).SerializeToString().hex() for a in
                  sorted(node.attribute, key=lambda a: a.name)]
        parts += [_tensor_key(name) for name in node.input]
        parts += [name if name in kept else "" for name in node.output]
        return _digest("\0".join(parts).encode())

    def _tensor_key(name):
        if name not in key:
            i = producer[name]
            key[name] = f"{node_key_of(i)}:{list(nodes[i].output).index(name)}"
        return key[name]

    def node_key_of(i):
        if node_keys[i] is None:
            node_keys[i] = node_key(i)
        return node_keys[i]

    for i in range(len(nodes)):  # the graph is in topological order: no deep recursion
        node_key_of(i)
    # Equal nodes (the same op on the same tensors) are one: which of them a
    # reader named would otherwise depend on the conversion's order.
    first = {}
    same = [first.setdefault(node_keys[i], i) for i in range(len(nodes))]
    readers = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        if same[i] != i:
            continue
        for source in {same[producer[name]] for name in node.input if name in producer}:
            readers[source].append(i)
            waiting[i] += 1
    ready = [(node_keys[i], i) for i in range(len(nodes)) if same[i] == i and not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in readers[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (node_keys[j], j))
    if len(order) != len(first):
        raise RuntimeError("the converted ONNX graph has a cycle")
    for place, i in enumerate(order):
        node = nodes[i]
        node.name = f"n{place}_{node.op_type}"
        for j, out in enumerate(node.output):
            if out and out not in kept:
                renamed[out] = f"t{place}_{j}"
    for i, node in enumerate(nodes):
        for out, kept_out in zip(node.output, nodes[same[i]].output):
            renamed.setdefault(out, renamed.get(kept_out, kept_out))
    for node in nodes:
        node.input[:] = [renamed[name] for name in node.input]
        node.output[:] = [renamed[name] for name in node.output]
        for attribute in node.attribute:
            if attribute.HasField("t"):
                attribute.t.name = ""
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)

    unique = sorted(constants.values(), key=lambda t: renamed[t.name])
    for tensor in unique:
        tensor.name = renamed[tensor.name]
    kept_constants = [onnx.TensorProto() for _ in unique]
    for copy, tensor in zip(kept_constants, unique):
        copy.CopyFrom(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept_constants)

    values = [v for v in graph.value_info if v.name in renamed]
    for value in values:
        value.name = renamed[value.name]
    values = sorted((_copy(v) for v in values), key=lambda v: v.name)
    del graph.value_info[:]
    graph.value_info.extend(values)
    _rename_unknown_dims(list(graph.input) + list(graph.output) + list(graph.value_info))
    graph.doc_string = ""  # tf2onnx's "converted from b'__inference_run_N'", N a counter
    return model


def _rename_unknown_dims(values):
    """Renames tf2onnx's `unk__N` axis names in order of first use."""
    names = {}
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if _UNKNOWN_DIM.fullmatch(dim.dim_param):
                dim.dim_param = names.setdefault(dim.dim_param, f"unk__{len(names)}")


def _without_name(proto):
    """A copy of `proto` (a TensorProto or AttributeProto's tensor) without its name
    where the name does not change what it computes."""
    copy = _copy(proto)
    if isinstance(copy, onnx.TensorProto):
        copy.name = ""
    elif copy.HasField("t"):
        copy.t.name = ""
    return copy


def _copy(proto):
    copy = type(proto)()
    copy.CopyFrom(proto)
    return copy


def _digest(data):
    return hashlib.sha256(data).hexdigest()
