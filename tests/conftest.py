"""Test-wide setup: the TF backend, quiet logs, and two logical CPU devices;
the job runner, the garbage collected after a test that leaves a tf.data
iterator alive, and folders built once per test run.

Splitting the CPU into two logical devices must happen before TensorFlow
initialises its devices, so it is done here, when pytest first imports the
test package; tests of `tf.distribute` then build a 2-replica
MirroredStrategy on `/cpu:0` and `/cpu:1`. Other tests use the default
device and are unaffected.
"""
import gc
import os
import shutil
import weakref

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA's compiled code without LLVM's optimizing passes (its HLO passes still
# run): the tests' tiny models compile in less time than the passes take, and
# the jobs they start inherit it. Benchmarks run with XLA's default.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import pytest  # noqa: E402
# txl_tf first: TensorFlow's import below then drops its start-up noise, as a user's does.
import txl_tf  # noqa: E402,F401
import tensorflow as tf  # noqa: E402

from cli_runner import ForkedJobs  # noqa: E402
from job_helpers import job_env  # noqa: E402

# Exact float32 comparisons: no TF32 matmuls when a test runs on an Ampere+ GPU.
tf.config.experimental.enable_tensor_float_32_execution(False)
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

# Seconds each module took (its tests summed, `pytest --durations=0` on a
# 2-core AVX-512 machine; docs/testing.md). `make test` hands whole modules to its two
# workers in this order (`--dist loadscope --no-loadscope-reorder`), the
# longest first, so that no long module is left running alone at the end.
# Modules not listed (under 8 s) follow in their usual order.
MODULE_SECONDS = {
    "test_model": 71, "test_classifier": 62, "test_bad_inputs": 54, "test_decoder": 53,
    "test_generation_reference": 60, "test_export_parity": 52, "test_export_job": 51,
    "test_lora_int8": 46, "test_interrupts": 44,
    "test_memory_reach": 44, "test_transformer_xl_causal_lm": 42, "test_classifier_export": 38,
    "test_gpu_check": 36, "test_training_resume": 36, "test_training_errors": 36,
    "test_training_classify": 34, "test_transformer_xl_presets": 28, "test_decode_cache_export": 26,
    "test_docs": 26, "test_training_logs": 25, "test_triton_export": 24, "test_learning": 23,
    "test_evaluate": 21, "test_training_recl": 20, "test_keras_workflows": 20,
    "test_training_generate": 19, "test_causal_lm_streams": 19, "test_sessions": 19,
    "test_gpu_kernels": 25,
    "test_training_run_record": 18, "test_training_multiworker": 16, "test_stream": 16,
    "test_keras_api": 16,
    "test_cache_precision": 33,
    "test_loss_scaling": 16, "test_cache_dtype": 15, "test_kv_cache": 15, "test_convert": 15,
    "test_demo": 14, "test_export_runtime": 14, "test_write_failures": 13,
    "test_onnx_without_tensorflow": 10, "test_core": 10, "test_attention_types": 10,
    "test_training_mirrored": 9, "test_process_state": 8,
}


def pytest_collection_modifyitems(items):
    """The longest modules first (a stable sort: each module's tests stay
    together and in their order)."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.stem, 0))


@pytest.fixture(scope="module", autouse=True)
def frozen_survivors():
    """Collects, then moves every object left into the collector's permanent
    generation (`gc.freeze`), as each module starts: what the imports made
    (some 400,000 objects: TensorFlow, Keras, onnxruntime) and what earlier
    modules left alive (traced graphs Keras and TensorFlow keep). Every full
    collection walked them all again, and Keras collects after each variable
    a layer drops (`Layer.__delattr__`, a dozen a `quantize`),
    `collect_abandoned_iterators` after a test: a quantized model's test
    spent most of its time there. Frozen objects are
    still freed when their count drops; only cycles among them are kept."""
    gc.collect()
    gc.freeze()


# tf.data iterators made since the last test ended and not yet freed
# (`collect_abandoned_iterators`). A `MirroredStrategy`'s multi-device
# iterator holds one per device, so it is seen too.
_fresh_iterators = weakref.WeakSet()


def _track_new_iterators():
    """Adds every tf.data iterator made from now on to `_fresh_iterators`."""
    from tensorflow.python.data.ops.iterator_ops import OwnedIterator
    made = OwnedIterator.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        _fresh_iterators.add(self)
    OwnedIterator.__init__ = init


_track_new_iterators()


@pytest.fixture(autouse=True)
def collect_abandoned_iterators():
    """Collects the garbage after a test that left a tf.data iterator alive.

    Keras's `fit`, `evaluate` and `predict` drop their iterator in a reference
    cycle when they raise, and a `MirroredStrategy`'s distributed iterator
    lives in one too. Destroying an iterator waits for a thread of the
    iterator, a wait that grows with the time it lived: left to a later
    collection, it blocked whatever test ran then for up to a minute
    (benchmarks/NOTES.md §10). Collected at once, the wait is short; a test
    whose iterators are freed as it goes costs no collection."""
    yield
    if _fresh_iterators:
        gc.collect()
        _fresh_iterators.clear()


@pytest.fixture(scope="session")
def jobs():
    """Runs job command lines with the libraries imported once per test
    worker (`tests.cli_runner`): `jobs.run(module, args, check)` is
    `run_job(module, args, check=check)` without a fresh interpreter. Tests
    that signal a job, run two at once, or look at a fresh interpreter's
    start-up use `run_job`."""
    runner = ForkedJobs(job_env(), timeout=600)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """`built_once(name, build)`: the folder `name` that `build(folder)`
    fills, built by the first test worker of the run that asks for it and
    read by the others (an export several modules check)."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is a subfolder of the run's.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name, build):
        import fcntl  # POSIX, as the job runner's fork
        folder = shared / name
        with open(shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not folder.is_dir():
                partial = shared / f"{name}.partial"
                shutil.rmtree(partial, ignore_errors=True)  # a failed build's
                partial.mkdir()
                build(partial)
                partial.rename(folder)
        return folder
    return get


@pytest.fixture
def host_copies(monkeypatch):
    """The shapes of the OrtValues copied to numpy (`OrtValue.numpy`) while
    the test runs: a list the test may clear (the device tests count what
    crosses to the host)."""
    import onnxruntime as ort
    shapes, numpy = [], ort.OrtValue.numpy

    def counted(value):
        shapes.append(tuple(value.shape()))
        return numpy(value)
    monkeypatch.setattr(ort.OrtValue, "numpy", counted)
    return shapes


@pytest.fixture
def cuda_that_does_not_load(monkeypatch):
    """onnxruntime listing a CUDA provider that does not load (onnxruntime-gpu
    without a GPU or its CUDA libraries), with `cuda_loads` asked afresh;
    skipped where this onnxruntime's CUDA provider loads (nothing falls back)."""
    import onnxruntime as ort

    from export import onnx_runtime
    if onnx_runtime.cuda_built() and onnx_runtime.cuda_loads():
        pytest.skip("this onnxruntime's CUDA provider loads: nothing falls back")
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    onnx_runtime.cuda_loads.cache_clear()
    yield
    onnx_runtime.cuda_loads.cache_clear()


@pytest.fixture
def killed_at_file_operation(monkeypatch):
    """`run(save, k, also=())`: calls `save()` as if SIGKILLed just before its
    k-th `os.rename`, `os.replace` or `os.remove` (or call of one of `also`,
    `(owner, attribute name)` pairs, e.g. `(keras.Model, "save_weights")`): a
    `KeyboardInterrupt` there, and no clean-up of `txl_tf.app.files.stage`'s
    temporaries, as a kill runs none; returns whether `save` finished first."""
    from txl_tf.app import files

    def run(save, k, also=()):
        calls = {"n": 0}
        real = {(owner, name): getattr(owner, name)
                for owner, name in [(os, "rename"), (os, "replace"), (os, "remove"), *also]}

        def counted(*args, _call, **kwargs):
            calls["n"] += 1
            if calls["n"] == k:
                raise KeyboardInterrupt("killed")
            return _call(*args, **kwargs)
        with monkeypatch.context() as patch:
            patch.setattr(files.Staged, "discard", lambda self: None)
            for (owner, name), call in real.items():
                patch.setattr(owner, name, lambda *a, _call=call, **kw: counted(*a, _call=_call,
                                                                                **kw))
            try:
                save()
            except KeyboardInterrupt:
                return False
        return True
    return run
