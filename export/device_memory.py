"""Memory that stays where the runtime computes: the small ONNX graphs with
which `export.onnx_runtime.OnnxRuntime` takes rows of memories, joins them
and scores targets on its device, so that a memory (OrtValues in a
`RuntimeMemory`) handed from call to call never crosses to the host, and a
score brings only the negative log-likelihoods there, not the log-probs.
Built with `onnx.helper` at run time (as `export.device_cache`'s graphs).
"""
import threading

import numpy as np

from export.device_cache import NUMPY_TYPES, empty_like, replay_run_options, small_model as _model


def _memory_values(prefix="", suffix=""):
    from onnx import TensorProto, helper
    return [helper.make_tensor_value_info(f"{prefix}mems{suffix}", TensorProto.FLOAT,
                                          [None] * 4),
            helper.make_tensor_value_info(f"{prefix}mem_mask{suffix}", TensorProto.BOOL,
                                          [None] * 2)]


def memory_take_model():
    """Inputs `mems` `[L, B, M, d]`, `mem_mask` `[B, M]`, `rows` int64
    `[k]`; outputs `taken_mems`, `taken_mem_mask`: those rows, in order."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Gather", ["mems", "rows"], ["taken_mems"], axis=1),
             helper.make_node("Gather", ["mem_mask", "rows"], ["taken_mem_mask"], axis=0)]
    return _model(nodes, "txl_memory_take",
                  _memory_values() + [helper.make_tensor_value_info("rows", TensorProto.INT64,
                                                                    [None])],
                  _memory_values("taken_"))


def memory_concat_model(count):
    """Inputs `mems_i`, `mem_mask_i` for i < `count`; outputs `mems`,
    `mem_mask`: their rows, one memory after the other."""
    from onnx import helper
    nodes = [helper.make_node("Concat", [f"mems_{i}" for i in range(count)], ["mems"], axis=1),
             helper.make_node("Concat", [f"mem_mask_{i}" for i in range(count)], ["mem_mask"],
                              axis=0)]
    inputs = [value for i in range(count) for value in _memory_values(suffix=f"_{i}")]
    return _model(nodes, "txl_memory_concat", inputs, _memory_values())


def nll_model():
    """Inputs `log_probs` `[B, T, V]`, `targets` int32 `[B, T]`; output
    `nll` `[B, T]`, each target's negative log-probability."""
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Constant", [], ["last"], value=helper.make_tensor(
                 "last", TensorProto.INT64, [1], [-1])),
             helper.make_node("Cast", ["targets"], ["targets_64"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["targets_64", "last"], ["index"]),
             helper.make_node("GatherElements", ["log_probs", "index"], ["picked"], axis=2),
             helper.make_node("Squeeze", ["picked", "last"], ["log_prob"]),
             helper.make_node("Neg", ["log_prob"], ["nll"])]
    return _model(nodes, "txl_nll",
                  [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, [None] * 3),
                   helper.make_tensor_value_info("targets", TensorProto.INT32, [None] * 2)],
                  [helper.make_tensor_value_info("nll", TensorProto.FLOAT, [None] * 2)])


def memory_copy_model():
    """Inputs `mems`, `mem_mask`; outputs `copy_mems`, `copy_mem_mask`: bound
    to other buffers, a copy of a memory on its device."""
    from onnx import helper
    return _model([helper.make_node("Identity", [name], [f"copy_{name}"])
                   for name in ("mems", "mem_mask")],
                  "txl_memory_copy", _memory_values(), _memory_values("copy_"))


class FixedSegment:
    """`model.onnx` on a session of one `(batch, seq_len)` (its free
    dimensions fixed) run over fixed buffers bound once: the ids, the memory
    and its mask in, the log-probs, the new memory and its mask out. What a
    CUDA graph replays (a captured graph is tied to its buffers); on the CPU
    provider the same path runs without a capture.

    Each `run` copies the caller's memory into the input buffers and the new
    memory out of the output buffers into fresh ones on the device (the copy
    graph `copy_session`, of `memory_copy_model`), so a memory handed back
    is never overwritten by the next run; the ids are written in place.
    Its buffers serve one run at a time: a caller holds `lock` from `run`
    (or `load`) until it has read the log-probs (`OnnxRuntime` does).

    Args:
        session: the fixed-shape session (CUDA graphs on where they replay).
        copy_session: a session of `memory_copy_model()`.
        device: the OrtValues' device ("cpu", "cuda").
        shape: `(batch, seq_len)` the session is fixed to.
        lock: the `lock` (a `threading.Lock` or `RLock`) to share with other
            runs (the runtime's, for sessions replaying CUDA graphs); None:
            one of its own.
    """

    def __init__(self, session, copy_session, device, shape, lock=None):
        import onnxruntime as ort
        self.session, self.copy_session, self.device = session, copy_session, device
        batch, length = shape
        sizes = {"batch": batch, "seq_len": length}

        def buffer(value):
            dims = [sizes.get(dim, dim) for dim in value.shape]
            return ort.OrtValue.ortvalue_from_shape_and_type(dims, NUMPY_TYPES[value.type],
                                                             device, 0)
        self.inputs = {v.name: buffer(v) for v in session.get_inputs()}
        self.outputs = {v.name: buffer(v) for v in session.get_outputs()}
        self.binding = session.io_binding()
        for name, value in self.inputs.items():
            self.binding.bind_ortvalue_input(name, value)
        for name, value in self.outputs.items():
            self.binding.bind_ortvalue_output(name, value)
        self.run_options = replay_run_options()
        self.lock = lock or threading.Lock()

    def run(self, ids, mems, mem_mask):
        """`(log-probs, new memory)` of the segment `ids` (numpy `[batch,
        seq_len]`) on the memory `(mems, mem_mask)` (OrtValues). The
        log-probs are the fixed output buffer (the next run's too); the new
        memory is `(mems, mem_mask)` OrtValues of its own on the device."""
        self.load(mems, mem_mask)
        self.replay(ids)
        new = [self.outputs[name] for name in ("new_mems", "new_mem_mask")]
        fresh = [empty_like(value, self.device) for value in new]
        self._copy(new, fresh)
        return self.outputs["log_probs"], fresh

    def load(self, mems, mem_mask):
        """Copies the memory `(mems, mem_mask)` (OrtValues) into the input buffers."""
        self._copy((mems, mem_mask), (self.inputs["mems"], self.inputs["mem_mask"]))

    def replay(self, ids):
        """Runs the session (a replay, once captured) on `ids` and the memory
        in the input buffers; its outputs are in `outputs`."""
        self.inputs["token_ids"].update_inplace(np.asarray(ids, np.int32))
        self.session.run_with_iobinding(self.binding, self.run_options)

    def feed_back(self):
        """Copies the last run's new memory into the input buffers: a loop
        that carries the memory on the device without copying it out."""
        self.load(self.outputs["new_mems"], self.outputs["new_mem_mask"])

    def _copy(self, source, target):
        binding = self.copy_session.io_binding()
        for name, value, into in zip(("mems", "mem_mask"), source, target):
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(f"copy_{name}", into)
        self.copy_session.run_with_iobinding(binding)
