"""One byte-identical graph for one computation (`canonical_graph`).

tf2onnx orders nodes and constants by iterating sets of objects and names
what it makes from process-wide counters, so two conversions of the same
function give graphs that compute the same thing in different node orders
under different names. The pass here gives each node and constant a key
computed from what it is and what it reads (never from a name), orders the
nodes topologically by those keys and names every internal tensor from its
place in that order (in Loop and If bodies too).
"""
import hashlib
import heapq
import re

import onnx

_UNKNOWN_DIM = re.compile(r"unk__\d+")
# Two of these on the same inputs draw twice (Dropout with its training_mode
# on), as does a Loop or If whose body holds one: never made one.
_RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
               "Multinomial", "Bernoulli", "Dropout"}


def canonical_graph(model):
    """Renames and reorders `model`'s graph in place so that equal graphs
    serialize to equal bytes: nodes in a topological order with ties broken
    by content, internal tensors named `t{node}_{output}`, nodes
    `n{node}_{op}`, constants `c{k}` in content order (equal ones made one,
    and equal nodes too, unless they draw: random ops, Dropout, a Loop or
    If whose body holds one), a subgraph's names under its node's
    (`n{node}/...`), tf2onnx's anonymous axes `unk__{k}` in order of use, no
    doc string (tf2onnx's names the traced function). The graph's inputs
    and outputs keep their names and order.

    Args:
        model: an ONNX `ModelProto` (tf2onnx's, weights as graph inputs);
            its graphs in topological order, as ONNX requires.

    Returns:
        `model`.
    """
    graph = model.graph
    kept = {value.name for value in list(graph.input) + list(graph.output)}
    _, apply, _ = _scope(graph, {"": ""}, kept)
    apply("", {name: name for name in kept} | {"": ""})
    _rename_unknown_dims(_values(graph))
    return model


def _scope(graph, outer, kept):
    """Keys the values and nodes of `graph` (`outer`: the keys of the names
    of the scopes around it; `kept`: the top graph's interface names, empty
    inside a subgraph).

    Returns:
        `(key, apply, draws)`: the graph's key, `apply(prefix, renamed)` that
        renames (its names prefixed, `renamed` mapping the outer scopes'
        names) and reorders it in place, and whether it holds a random op.
    """
    key = dict(outer)
    for i, value in enumerate(graph.input):
        key[value.name] = (f"input:{value.name}" if kept else
                           f"input:{i}:{_digest(_type_bytes(value.type))}")
    content_of, constants, graph_draws = {}, {}, False
    for tensor in graph.initializer:
        content = ("kept:" + tensor.name if tensor.name in kept else
                   _digest(_without_name(tensor).SerializeToString()))
        key[tensor.name] = "const:" + content
        content_of[tensor.name] = content
        constants.setdefault(content, tensor)

    nodes = list(graph.node)
    node_keys, subgraphs, drawn = [], [], {}
    for node in nodes:
        attributes, inner, draws = [], [], node.op_type in _RANDOM_OPS
        for attribute in sorted(node.attribute, key=lambda a: a.name):
            for k, sub in enumerate(_subgraphs(attribute)):
                sub_key, sub_apply, sub_draws = _scope(sub, key, set())
                attributes.append((attribute.name, sub_key))
                inner.append((sub, sub_apply, attribute.name + (f"_{k}" if k else "")))
                draws = draws or sub_draws
            if not _subgraphs(attribute):
                attributes.append(_without_name(attribute).SerializeToString())
        try:
            inputs = [key[name] for name in node.input]
        except KeyError as err:
            raise RuntimeError(f"ONNX node {node.name!r} reads {err.args[0]!r} before it is "
                               "made (the graph is not in topological order)") from None
        # An output is its name when the graph's, else whether it is made at all.
        outputs = [name if name in kept else bool(name) for name in node.output]
        node_key = _digest(repr((node.domain, node.op_type, attributes, inputs,
                                 outputs)).encode())
        if draws:
            drawn[node_key] = drawn.get(node_key, -1) + 1
            node_key = _digest(f"{node_key}:{drawn[node_key]}".encode())
            graph_draws = True
        node_keys.append(node_key)
        subgraphs.append(inner)
        for j, out in enumerate(node.output):
            if out:
                key[out] = f"{node_key}:{j}"

    # Equal nodes (the same op on the same tensors) are one: which of them a
    # reader named would otherwise depend on the conversion's order.
    first = {}
    same = [first.setdefault(node_key, i) for i, node_key in enumerate(node_keys)]
    producer = {out: same[i] for i, node in enumerate(nodes) for out in node.output if out}
    readers = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        if same[i] == i:
            for source in {producer[name] for name in _reads(node) if name in producer}:
                if source != i:
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
    graph_key = _digest(repr(([key[value.name] for value in graph.input],
                              [node_keys[i] for i in order],
                              [key.get(value.name, value.name) for value in graph.output]
                              )).encode())

    def apply(prefix, outer_renamed):
        renamed = dict(outer_renamed)
        for i, value in enumerate(graph.input):
            renamed.setdefault(value.name, f"{prefix}in{i}")
        for k, content in enumerate(sorted(constants)):
            renamed.setdefault(constants[content].name, f"{prefix}c{k}")
        for name, content in content_of.items():
            renamed[name] = renamed[constants[content].name]
        for place, i in enumerate(order):
            nodes[i].name = f"{prefix}n{place}_{nodes[i].op_type}"
            for j, out in enumerate(nodes[i].output):
                if out and out not in kept:
                    renamed[out] = f"{prefix}t{place}_{j}"
        for i, node in enumerate(nodes):
            for out, kept_out in zip(node.output, nodes[same[i]].output):
                renamed.setdefault(out, renamed.get(kept_out, kept_out))
        for place, i in enumerate(order):
            for sub, sub_apply, name in subgraphs[i]:
                sub.name = f"{nodes[i].name}/{name}"  # tf2onnx's has a counter
                sub_apply(f"{nodes[i].name}/", renamed)
        for node in nodes:
            node.input[:] = [renamed[name] for name in node.input]
            node.output[:] = [renamed[name] for name in node.output]
            if not node.domain:  # tf2onnx sets "" on some nodes, not on others
                node.ClearField("domain")
            node.ClearField("doc_string")
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    attribute.t.name = ""
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
        for value in list(graph.input) + list(graph.output):
            value.name = renamed.get(value.name, value.name)

        unique = sorted(constants.values(), key=lambda t: renamed[t.name])
        for tensor in unique:
            tensor.name = renamed[tensor.name]
        copies = [_copy(tensor) for tensor in unique]
        del graph.initializer[:]
        graph.initializer.extend(copies)

        values = {}  # one per name (an equal node's went with it), whatever their order
        for value in sorted(graph.value_info, key=lambda v: _type_bytes(v.type)):
            name = renamed.get(value.name)
            if name is not None and name not in values:
                values[name] = _copy(value)
                values[name].name = name
        del graph.value_info[:]
        graph.value_info.extend(values[name] for name in sorted(values))
        graph.doc_string = ""  # tf2onnx's "converted from b'__inference_run_N'", N a counter
    return graph_key, apply, graph_draws


def _reads(node):
    """The names `node` reads: its inputs and its subgraphs' outer names."""
    names = set(node.input)
    for attribute in node.attribute:
        for sub in _subgraphs(attribute):
            made = {v.name for v in sub.input} | {t.name for t in sub.initializer} | {
                out for n in sub.node for out in n.output}
            names |= {name for n in sub.node for name in _reads(n)} - made
    return names


def _subgraphs(attribute):
    """The graphs `attribute` holds (a Loop's body, an If's branches)."""
    if attribute.type == onnx.AttributeProto.GRAPH:
        return [attribute.g]
    return list(attribute.graphs)


def _type_bytes(value_type):
    """`value_type` (a TypeProto) serialized without tf2onnx's axis names."""
    copy = _copy(value_type)
    for dim in copy.tensor_type.shape.dim:
        if _UNKNOWN_DIM.fullmatch(dim.dim_param):
            dim.dim_param = ""
    return copy.SerializeToString()


def _values(graph):
    """The inputs, outputs and value infos of `graph` and of its subgraphs."""
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    for node in graph.node:
        for attribute in node.attribute:
            for sub in _subgraphs(attribute):
                values += _values(sub)
    return values


def _rename_unknown_dims(values):
    """Renames tf2onnx's `unk__N` axis names in order of first use."""
    names = {}
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if _UNKNOWN_DIM.fullmatch(dim.dim_param):
                dim.dim_param = names.setdefault(dim.dim_param, f"unk__{len(names)}")


def _without_name(proto):
    """A copy of `proto` (a TensorProto, or an AttributeProto's tensor)
    without the name that does not change what it computes."""
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
