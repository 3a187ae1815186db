"""The device step replayed as CUDA graphs (ONNX Runtime, `cuda_graph`).

A step of a device cache (`export.device_ring`) launches about a thousand
small kernels; replayed as a CUDA graph it costs much less (benchmarks/NOTES.md
§5). A captured graph is tied
to the buffers it was captured with, so the runtime keeps one `Resident`
per batch size: the cache's tensors, the step's ids, flags and outputs at
fixed addresses, bound once. The cache being stepped lives in those
buffers (its dict points at them); when another cache of that batch size
steps, the resident one gets its own buffers back, with its state, and the
new one is copied in (two device copies of the cache). So a decode loop
replays the same three graphs (the step, the ring's write, the copy of the
moved ring positions) token after token, and a server holds one captured pair per batch size, not one per
conversation. On the CPU provider the same fixed-buffer path runs without
a capture (that is how the tests exercise it).
"""
import itertools

import numpy as np

from export.device_ring import IN_PLACE, WRITE_INPUTS, bind_ring, ortvalue
from export.host_cache import CACHE_NAMES, STEP_OUTPUTS

# ONNX Runtime keys captured graphs by this id: never reuse one for other buffers.
_GRAPH_IDS = itertools.count(1)
_TYPES = {"tensor(float)": np.float32, "tensor(bool)": np.bool_, "tensor(int32)": np.int32}
MOVED = ("slot", "row_slot")


def copy_model(names=CACHE_NAMES):
    """An ONNX model copying each cache tensor in `names` to `copy_<name>`:
    bound to a destination buffer, a device-to-device copy."""
    from onnx import TensorProto, helper
    types = {"valid": TensorProto.BOOL, "slot": TensorProto.INT32,
             "row_slot": TensorProto.INT32}
    ranks = {"cache_mems": 4, "keys": 5, "values": 5, "valid": 2, "slot": 0, "row_slot": 1,
             "positions": 2}
    values = [(name, types.get(name, TensorProto.FLOAT), [None] * ranks[name])
              for name in names]
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [f"copy_{name}"]) for name, _, _ in values],
        "txl_cache_copy", [helper.make_tensor_value_info(*v) for v in values],
        [helper.make_tensor_value_info(f"copy_{n}", t, s) for n, t, s in values])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="txl_tf")
    model.ir_version = 8
    return model


def _empty_like(value, device):
    import onnxruntime as ort
    return ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), _TYPES[value.data_type()],
                                                     device, 0)


class Resident:
    """Fixed buffers for the device step of one batch size, and the cache
    that lives in them (see the module's docstring)."""

    def __init__(self, sessions, device, cache, n_token):
        import onnxruntime as ort
        self.sessions, self.device = sessions, device
        self.fixed = {name: _empty_like(cache[name], device) for name in CACHE_NAMES}
        layers, batch, _, d_model = cache["cache_mems"].shape()
        _, _, heads, d_head, _ = cache["keys"].shape()
        self.ids = ortvalue(np.zeros([batch], np.int32), device)
        self.stopped = ortvalue(np.zeros([batch], np.bool_), device)
        self.log_probs = ortvalue(np.zeros([batch, n_token], np.float32), device)
        self.token = {"token_mems": ortvalue(np.zeros([layers, batch, d_model], np.float32),
                                             device),
                      **{name: ortvalue(np.zeros([layers, batch, heads, d_head], np.float32),
                                        device) for name in ("token_keys", "token_values")}}
        # The ring positions a write moves on, then copied over the old ones:
        # written in place, the graph could read a position it already moved.
        self.moved = {name: _empty_like(cache[name], device) for name in MOVED}
        self.step_binding = self._bind_step()
        self.write_binding = self._bind_write()
        self.move_binding = self.sessions["move"].io_binding()
        for name in MOVED:
            self.move_binding.bind_ortvalue_input(name, self.moved[name])
            self.move_binding.bind_ortvalue_output(f"copy_{name}", self.fixed[name])
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(next(_GRAPH_IDS)))
        self.owner, self.own_buffers = None, None

    def _bind_step(self):
        binding = self.sessions["step"].io_binding()
        binding.bind_ortvalue_input("token_ids", self.ids)
        bind_ring(binding, self.fixed, self.device)
        binding.bind_ortvalue_output("log_probs", self.log_probs)
        for name in STEP_OUTPUTS[1:]:
            binding.bind_ortvalue_output(name, self.token[name])
        return binding

    def _bind_write(self):
        binding = self.sessions["write"].io_binding()
        inputs = {**{name: self.fixed[name] for name in WRITE_INPUTS if name in self.fixed},
                  **self.token, "stopped": self.stopped}
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name in IN_PLACE:
            binding.bind_ortvalue_output(f"new_{name}", self.fixed[name])
        for name in MOVED:
            binding.bind_ortvalue_output(f"new_{name}", self.moved[name])
        return binding

    def step(self, cache, ids, stopped):
        """The log-probs of one step of `cache` (advanced in place)."""
        if self.owner is not cache:
            self._take(cache)
        self.ids.update_inplace(np.asarray(ids, np.int32))
        self.stopped.update_inplace(np.asarray(stopped, np.bool_))
        self.sessions["step"].run_with_iobinding(self.step_binding, self.run_options)
        self.sessions["write"].run_with_iobinding(self.write_binding, self.run_options)
        self.sessions["move"].run_with_iobinding(self.move_binding, self.run_options)
        return self.log_probs.numpy()

    def _take(self, cache):
        """Moves `cache` into the fixed buffers, and the cache there back out."""
        if self.owner is not None:
            self._copy(self.fixed, self.own_buffers)
            self.owner.update(self.own_buffers)
        self._copy(cache, self.fixed)
        self.owner, self.own_buffers = cache, {name: cache[name] for name in CACHE_NAMES}
        cache.update(self.fixed)

    def _copy(self, source, target):
        binding = self.sessions["copy"].io_binding()
        for name in CACHE_NAMES:
            binding.bind_ortvalue_input(name, source[name])
            binding.bind_ortvalue_output(f"copy_{name}", target[name])
        self.sessions["copy"].run_with_iobinding(binding)
