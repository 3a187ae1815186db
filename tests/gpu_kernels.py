"""Whether every op of a traced graph finds a kernel on a GPU, decided on a
CPU from TensorFlow's kernel registry (which lists the GPU's kernels, and
the XLA compilation kernels once an XLA function has run in the process).

`sites(function)` walks a concrete function and every function it reaches
(calls, while loops, conds, custom gradients) and gives each op node with
whether it is XLA-compiled: inside a function called with
`_XlaMustCompile` (what `jit_compile=True` puts on the call), everything
below it. The rule for the nodes that are not ops is TensorFlow's own
(`RecursiveCompilabilityChecker::IsCompilableNode`,
tensorflow/compiler/jit/compilability_check_util.cc): a function call
(`PartitionedCall`, `StatefulPartitionedCall`, an op named by a library
function) is its body, not a node; a function's arguments (`Placeholder`s
of its graph, `_Arg` when it runs) are feeds; every other node needs a
kernel, found as `FindKernelDef` finds it (`has_kernel` asks it), and the
functions in a node's attributes (`While`'s body, `If`'s branches) are
checked as well. (`HasXLAKernel` there also refuses a string `Const`, but
only when auto-clustering asks: `jit_compile=True` compiles one, an
`Assert`'s message.)

`missing(sites, device)` lists the nodes without a kernel on `device`
(`XLA_GPU_JIT`, `XLA_CPU_JIT`, `GPU`); `host_memory(sites)` the tensors
that a GPU kernel keeps in host memory (`KernelDef.host_memory_arg`), and
`crossings(sites)` the tensors that go between host and GPU memory.
"""
import functools
import inspect
from typing import NamedTuple

import tensorflow as tf
from tensorflow.core.framework import kernel_def_pb2
from tensorflow.python.framework import kernels, op_def_registry
from tensorflow.python.util import _pywrap_kernel_registry

XLA_GPU, XLA_CPU, GPU = "XLA_GPU_JIT", "XLA_CPU_JIT", "GPU"
_CALLS = ("PartitionedCall", "StatefulPartitionedCall")
_ON_HOST = ("int32", "string", "resource")  # a call's tensors of these dtypes


class Site(NamedTuple):
    """One op node of a walked graph."""

    function: str  # the function (graph) it is in
    node: tf.compat.v1.NodeDef  # with its op's default attrs filled in
    compiled: bool  # inside an XLA-compiled function
    inputs: tuple  # (dtype name, shape as a tuple, None where unknown) per input
    outputs: tuple  # the same per output
    sources: tuple  # (node name, output index) in `function` of each input

    @property
    def op(self):
        return self.node.op

    def describe(self):
        """`op{attr=type,...}` with the node's type attrs."""
        return f"{self.op}{{{','.join(f'{k}={v}' for k, v in type_attrs(self.node))}}}"


@functools.lru_cache(maxsize=None)
def register_xla_kernels():
    """Runs one XLA function: TensorFlow registers the `XLA_*_JIT` kernels
    then (the first compilation), and only then does the registry list them."""
    tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1.0))


def type_attrs(node):
    """Sorted `(attr, type name)` of the node's type and type-list attrs."""
    out = []
    for name, value in sorted(node.attr.items()):
        if name.startswith("_"):
            continue
        if value.WhichOneof("value") == "type":
            out.append((name, tf.dtypes.as_dtype(value.type).name))
        elif value.WhichOneof("value") == "list" and value.list.type:
            out.append((name, "[" + ",".join(tf.dtypes.as_dtype(t).name
                                             for t in value.list.type) + "]"))
    return tuple(out)


def _with_defaults(node_def):
    node = tf.compat.v1.NodeDef()
    node.CopyFrom(node_def)
    op_def = op_def_registry.get(node.op)
    for attr in op_def.attr if op_def else ():
        if attr.name not in node.attr and attr.HasField("default_value"):
            node.attr[attr.name].CopyFrom(attr.default_value)
    return node


def _tensor(t):
    dims = t.shape.as_list() if t.shape.rank is not None else None
    return t.dtype.name, None if dims is None else tuple(dims)


def _called(node):
    """The names of the functions a node's attrs hold (`f`, `body`, `branches`...)."""
    for value in node.attr.values():
        if value.WhichOneof("value") == "func":
            yield value.func.name
        elif value.WhichOneof("value") == "list":
            yield from (f.name for f in value.list.func)


def sites(function, compiled=False):
    """Every op node (a `Site`) of a concrete function and of the functions
    it reaches; `compiled`: the function itself is XLA-compiled (it is
    where it was made with `jit_compile=True`)."""
    graphs = {}

    def collect(graph):
        if not hasattr(graph, "_functions"):
            raise AssertionError(f"{type(graph).__name__} has no `_functions` (TensorFlow's "
                                 "private library of the functions a graph calls): the walk "
                                 "needs another way to reach them")
        for name, atomic in graph._functions.items():
            if name not in graphs:
                graphs[name] = atomic
                collect(atomic.graph)

    def graph_of(name):
        if name not in graphs:
            raise KeyError(f"function {name} is not in the traced graphs' libraries")
        graph = graphs[name].graph
        collect(graph)
        return graph

    found, seen = [], set()

    def walk(graph, name, compiled):
        if (name, compiled) in seen:
            return
        seen.add((name, compiled))
        collect(graph)
        feeds = {t.op.name for t in graph.inputs}
        for op in graph.get_operations():
            node = _with_defaults(op.node_def)
            if op.type == "Placeholder" and op.name in feeds:
                continue  # an argument (a feed, an `_Arg` when it runs)
            inner = compiled or ("_XlaMustCompile" in node.attr and
                                 node.attr["_XlaMustCompile"].b)
            if op.type in _CALLS or op.type in graphs:  # a call: its body
                for called in ([op.type] if op.type in graphs else list(_called(node))):
                    walk(graph_of(called), tf.compat.as_str(called), inner)
                continue
            found.append(Site(name, node, compiled, tuple(_tensor(t) for t in op.inputs),
                              tuple(_tensor(t) for t in op.outputs),
                              tuple((t.op.name, t.value_index) for t in op.inputs)))
            for called in _called(node):
                walk(graph_of(called), tf.compat.as_str(called), compiled)

    walk(function.graph, tf.compat.as_str(function.name), compiled)
    return found


def has_kernel(node, device):
    """Whether TensorFlow's `FindKernelDef` finds a kernel of `node` on `device`
    (a device type)."""
    if device.endswith("_JIT") and node.op == "SymbolicGradient":
        return False  # a call, which XLA compiles as its body (never in TF 2's graphs)
    return _found(node, device)


def _found(node, device):
    placed = tf.compat.v1.NodeDef()
    placed.CopyFrom(node)
    placed.device = f"/device:{device}:0"
    return bool(_pywrap_kernel_registry.TryFindKernelClass(placed.SerializeToString()))


@functools.lru_cache(maxsize=None)
def _kernel_defs(op, device):
    return tuple(k.SerializeToString() for k in kernels.get_registered_kernels_for_op(op).kernel
                 if k.device_type == device and not k.label)


def _accepts(kernel, node):
    """Whether the node's attrs are among those each constraint allows
    (types, type lists, strings)."""
    for constraint in kernel.constraint:
        if constraint.name not in node.attr:
            return False
        allowed, value = constraint.allowed_values.list, node.attr[constraint.name]
        kind = value.WhichOneof("value")
        if kind == "s":
            ok = value.s in allowed.s
        else:
            ok = all(t in allowed.type for t in (value.list.type if kind == "list" else
                                                 [value.type]))
        if not ok:
            return False
    return True


def kernel_def(node, device):
    """The `KernelDef` TensorFlow picks for `node` on `device` (its
    registrations whose type constraints accept the node's attrs, the
    highest priority; those of `DEFAULT` where the device has none, as
    `FindKernelRegistration` does for a device that runs kernels), or None.
    Checked against `has_kernel`."""
    chosen = None
    for kinds in ((device,), () if device.endswith("_JIT") else ("DEFAULT",)):
        for kind in kinds:
            for raw in _kernel_defs(node.op, kind):
                kernel = kernel_def_pb2.KernelDef.FromString(raw)
                if _accepts(kernel, node) and (chosen is None or
                                               kernel.priority > chosen.priority):
                    chosen = kernel
        if chosen is not None:
            break
    if (chosen is not None) != _found(node, device):
        raise AssertionError(f"the registry and FindKernelDef disagree on {node.op} on {device}")
    return chosen


def missing(found, device, compiled=None):
    """The sites (of those with `compiled` as given, all where None) without
    a kernel on `device`."""
    return [s for s in found if (compiled is None or s.compiled == compiled)
            and not has_kernel(s.node, device)]


def _arg_counts(args, node):
    for arg in args:
        if arg.number_attr:
            yield arg.name, node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            yield arg.name, len(node.attr[arg.type_list_attr].list.type)
        else:
            yield arg.name, 1


def _host_args(site, device):
    """`({input index}, {output index})` of the site's tensors in host memory
    on `device`: all where it has no kernel there (it runs on the CPU),
    its kernel's `host_memory_arg`s, strings and resources; a functional
    op's (`While`, `If`) as a call's."""
    n_in, n_out = len(site.inputs), len(site.outputs)
    if next(_called(site.node), None) is not None:  # `While`, `If`: see `crossings`
        return tuple({i for i, (dtype, _) in enumerate(tensors) if dtype in _ON_HOST}
                     for tensors in (site.inputs, site.outputs))
    kernel = kernel_def(site.node, device)
    if kernel is None:
        return set(range(n_in)), set(range(n_out))
    host = [set(), set()]
    op_def = op_def_registry.get(site.op)
    for side, args in enumerate((op_def.input_arg, op_def.output_arg)):
        index = 0
        for name, count in _arg_counts(args, site.node):
            if name in kernel.host_memory_arg:
                host[side].update(range(index, index + count))
            index += count
    for side, tensors in enumerate((site.inputs, site.outputs)):
        host[side].update(i for i, (dtype, _) in enumerate(tensors)
                          if dtype in ("string", "resource"))
    return host[0], host[1]


def host_memory(found, device=GPU):
    """`(site, "in"/"out", index, dtype, shape)` for each tensor of a
    not-compiled site that its `device` kernel keeps in host memory (or all
    of a site without a kernel there)."""
    out = []
    for site in found:
        if site.compiled:
            continue
        host_in, host_out = _host_args(site, device)
        out += [(site, "in", i) + site.inputs[i] for i in sorted(host_in)]
        out += [(site, "out", i) + site.outputs[i] for i in sorted(host_out)]
    return out


def crossings(found, device=GPU):
    """`(site, input index, dtype, shape, direction)` for each input of a
    not-compiled site that crosses the bus: read from host memory by a
    device kernel ("to device"), or from device memory by a host one ("to
    host": the step waits for it). A function's arguments, the results of
    the calls in it and the tensors of its functional ops (which TensorFlow
    lowers to `Enter`, `Switch`, `Merge`, `Exit`, whose int32 kernels of a
    GPU are the host's) are where TensorFlow puts a call's (its
    `MTypeFromDType`: int32 in host memory, others in the device's). One
    entry per reading input: TensorFlow copies a tensor once per device,
    however many of its kernels there read it."""
    sites_by_name = {(s.function, s.node.name): s for s in found}
    host = {}
    out = []
    for site in found:
        if site.compiled:
            continue
        host_in, _ = _host_args(site, device)
        for i, (source, index) in enumerate(site.sources):
            producer = sites_by_name.get((site.function, source))
            if producer is None:  # an argument, or a call's result
                from_host = site.inputs[i][0] in _ON_HOST
            else:
                key = (producer.function, source)
                if key not in host:
                    host[key] = _host_args(producer, device)[1]
                from_host = index in host[key]
            if from_host != (i in host_in):
                out.append((site, i) + site.inputs[i] +
                           ("to device" if from_host else "to host",))
    return out


def is_large(shape, limit=8):
    """Whether a tensor of `shape` is more than a shape vector: rank 2 or
    more, an unknown size, or more than `limit` elements."""
    if shape is None or None in shape:
        return True
    size = 1
    for dim in shape:
        size *= dim
    return len(shape) >= 2 or size > limit


def summary(found):
    """`{op{types}: count}` of the sites, sorted."""
    counts = {}
    for site in found:
        counts[site.describe()] = counts.get(site.describe(), 0) + 1
    return dict(sorted(counts.items()))


def keras_step(model, data, kind="train"):
    """The concrete function Keras runs for a `kind` ("train", "test")
    step of `model` on the batches of `data` (a `tf.data.Dataset`): its
    `make_<kind>_function()`'s loop over an iterator, traced (not run), with
    the step inside it, XLA-compiled where the model's `jit_compile` says.
    Keras 3.15 keeps that `tf.function` in the made function's closure
    (`TensorFlowTrainer._make_function`)."""
    getattr(model, f"make_{kind}_function")()
    made = getattr(model, f"{kind}_function")
    made = getattr(made, "function", made)  # `txl_tf.keras_support.placement.on_device`
    loop = inspect.getclosurevars(made).nonlocals.get("multi_step_on_iterator")
    if loop is None:
        raise AssertionError(f"make_{kind}_function() keeps no `multi_step_on_iterator` in its "
                             "closure (Keras 3.15's `TensorFlowTrainer._make_function`): find "
                             "where this Keras keeps the step's tf.function")
    return loop.get_concrete_function(iter(data))


def concrete_functions(function):
    """The concrete functions a `tf.function` has traced so far."""
    function = getattr(function, "function", function)  # `on_device`
    return function._list_all_concrete_functions()
