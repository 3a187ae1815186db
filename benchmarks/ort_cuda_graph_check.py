r"""Whether ONNX Runtime can replay a decode step as one CUDA graph, and the
step's time without one (GPU only; TensorFlow not needed).

    python -m benchmarks.ort_cuda_graph_check --step_graph=EXPORT_DIR/decode_step.onnx

Binds every input and output of `decode_step` to fixed GPU buffers (random
cache, batch 1 and 16) and times 50 runs with CUDA graphs off, then asks
for them (`enable_cuda_graph`, also with the batch axis fixed). ONNX
Runtime captures a graph only when no node needs a copy between the host
and the GPU: exports made before the step used a scalar zero and a gather
for the position table were refused; since, `enwik8_base`'s step replays
in 1.7 ms instead of 6.6 on an H100 (benchmarks/README.md).
"""
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

SPEC = (option("string", "step_graph", None, "An export's decode_step.onnx."),)

TYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
         "tensor(int64)": np.int64}


def _bound(session, batch):
    """An IO binding of every input (random, ids 5, flags on, slot 3) and output on the GPU."""
    import onnxruntime as ort
    binding, kept = session.io_binding(), []
    rng = np.random.default_rng(0)
    for arg in session.get_inputs():
        shape = [batch if isinstance(d, str) or d is None else d for d in arg.shape]
        dtype = TYPES[arg.type]
        value = (np.array(3, np.int32) if arg.name == "slot" else np.ones(shape, np.bool_)
                 if dtype == np.bool_ else np.full(shape, 5, dtype) if dtype != np.float32
                 else rng.normal(size=shape).astype(np.float32))
        kept.append(ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
        binding.bind_ortvalue_input(arg.name, kept[-1])
    for arg in session.get_outputs():
        shape = [batch if isinstance(d, str) or d is None else d for d in arg.shape]
        kept.append(ort.OrtValue.ortvalue_from_shape_and_type(shape, TYPES[arg.type], "cuda", 0))
        binding.bind_ortvalue_output(arg.name, kept[-1])
    return binding, kept


def check(path, batch, cuda_graph, fixed_batch):
    """One line: the median ms per step, or why the session or run failed."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if fixed_batch:
        options.add_free_dimension_override_by_name("batch", batch)
    label = f"batch {batch}, cuda graph {cuda_graph}, batch axis fixed {fixed_batch}"
    try:
        session = ort.InferenceSession(path, options, providers=[(
            "CUDAExecutionProvider", {"enable_cuda_graph": str(int(cuda_graph)),
                                      "use_tf32": "0"})])
        binding, _kept = _bound(session, batch)
        for _ in range(3):  # the first run captures
            session.run_with_iobinding(binding)
    except Exception as error:  # onnxruntime's own error types
        return f"{label}: refused: {' '.join(str(error).split())[:300]}"
    times = []
    for _ in range(50):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append(time.perf_counter() - start)
    return f"{label}: {statistics.median(times) * 1e3:.3f} ms per step"


def main(argv):
    o = values(SPEC)
    if not o["step_graph"]:
        raise TxlError("--step_graph is required (an export's decode_step.onnx)")
    for batch in (1, 16):
        for graph, fixed in ((False, False), (True, False), (True, True)):
            print(check(o["step_graph"], batch, graph, fixed), flush=True)


if __name__ == "__main__":
    cli.run(main, SPEC)
