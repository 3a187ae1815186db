"""ONNX Runtime backend: CUDA when available, CPU otherwise; IO binding keeps
the memory, and on CUDA the decode cache (`export.device_cache`), on the
device between calls. Needs numpy and onnxruntime, not TensorFlow."""
import contextlib
import ctypes
import functools
import logging
import os
import threading
from collections import OrderedDict

import numpy as np

from export.decode_cache import (CHANGING_NAMES, aligned_empty, host_cache, ring_positions,
                                 step_feeds, write_token)
from export.device_cache import (MOVED, DeviceCache, Resident, copy_model, device_step,
                                 device_token_step, is_ortvalue, on_device, ortvalue,
                                 ring_memory_model, ring_write_model, run_on_device,
                                 with_cache_dtype)
from export.device_memory import (FixedSegment, memory_concat_model, memory_copy_model,
                                  memory_take_model, nll_model)
from export.slab import DeviceSlab, put_row, slab_put_model, slab_take_model, take_device_rows
from export.metadata import DECODE_FILES, DECODE_TOKEN_FILE, ExportInfo, external_data_file
from export.runtime import Runtime, RuntimeMemory, _to_numpy, _unpack, shape_and_dtype
from txl_tf.app.deprecation import warn_deprecated
from txl_tf.app.nvidia_driver import nvidia_driver
from txl_tf.errors import ModelDirError, TxlError

# The project's records go to these modules' loggers, never to the root logger
# (whose `logging.info` would configure logging for the user's whole process).
log = logging.getLogger(__name__)

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
# On the CPU, "auto" fixes one shape only, one token of one stream (a second
# copy of the weights where they are not shared), for models up to this
# size, where per-node overhead matters (`OnnxRuntime`'s `fixed_shapes`).
SINGLE_STREAM_MAX_BYTES = 256 * 2 ** 20
# The fixed-shape sessions a runtime keeps (the least recently used goes),
# and the shapes seen once it remembers (a shape's second call opens one).
FIXED_SHAPES_KEPT = 4
SHAPES_REMEMBERED = 64
# The session config entry that marks options holding a fixed shape's overrides.
FIXED_SHAPE_ENTRY = "txl_tf.fixed_shape"
# What `low_memory` sessions leave out: constant folding would store a folded
# copy of each weight a graph transposes (the tied output embedding:
# `Transpose(embedding)`, 439 MB at wt103_base), one per session; unfolded,
# ONNX Runtime fuses the transpose into the matmul (`FusedMatMul`, transB),
# which reads the shared weight as it is.
UNFOLDED = ("ConstantFolding",)
# What the float16 decode graphs (`--decode_dtype=float16`) open without:
# ONNX Runtime's CPU layout transformer (NCHWc, for convolutions; there are
# none) crashes on `decode_read` (1.31). They fold their weights even with
# `low_memory`: float16 copies of them are their point.
FLOAT16_DECODE_DISABLED = ("NchwcTransformer",)


def choose_providers(device="auto"):
    """Execution providers for `device` in `auto | cuda | gpu | cpu`, with the
    reason when CUDA was asked for but is not available, or is listed but
    does not load (`cuda_loads`)."""
    import onnxruntime as ort
    if device not in ("auto", "cuda", "gpu", "cpu"):
        raise TxlError(f"device must be auto, cuda, gpu or cpu, got {device!r}")
    if device == "cpu":
        return [CPU], None
    if not cuda_built():
        gpu = ("; this machine has NVIDIA's GPU driver: onnxruntime-gpu (the gpu extra) in "
               "place of onnxruntime runs there" if nvidia_driver() else "")
        return [CPU], (f"{CUDA} is not available in this onnxruntime "
                       f"({ort.get_available_providers()}); using {CPU}{gpu}")
    if not cuda_loads():
        return [CPU], cuda_load_failure(CPU)
    return [CUDA, CPU], None


def cuda_built():
    """Whether this onnxruntime lists the CUDA provider (onnxruntime-gpu),
    loading or not (`cuda_loads`).

    Returns:
        bool."""
    import onnxruntime as ort
    return CUDA in ort.get_available_providers()


@functools.lru_cache(maxsize=None)
def cuda_loads():
    """Whether onnxruntime's CUDA provider, listed wherever it was built
    (`cuda_built`), also loads here (its CUDA libraries found, a GPU seen):
    a one-node session on it, once a process, onnxruntime's own words on a
    failure silenced (`cuda_load_failure` says it in one line). Leaves
    onnxruntime's process-wide logger at its default level (warnings).

    Returns:
        bool; True without the onnx package (which builds the graph): a
        runtime then finds out at its first session."""
    import onnxruntime as ort
    try:
        from onnx import TensorProto, helper
    except ImportError:
        return True
    from export.device_cache import small_model
    value = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in "xy"]
    model = small_model([helper.make_node("Identity", ["x"], ["y"])], "cuda_loads",
                        value[:1], value[1:])
    ort.set_default_logger_severity(4)  # fatal only
    try:
        # enable_fallback=0: a provider that loads and then cannot start (a driver without a
        # GPU) raises, where onnxruntime's Python would print its own banner on stdout
        session = ort.InferenceSession(model.SerializeToString(), providers=[CUDA, CPU],
                                       enable_fallback=0)
        return session.get_providers()[0] == CUDA
    except Exception:  # onnxruntime's own types (its Fail, RuntimeError)
        return False
    finally:
        ort.set_default_logger_severity(2)  # onnxruntime's default: warnings


def provider_entries(names, tf32=False, cuda_graph=False):
    """`providers` for a session of the execution providers `names`: CUDA
    with TF32 matmuls off unless `tf32`. TF32 (ONNX Runtime's default on
    Ampere and later GPUs) rounds float32 matmul inputs to 10 bits and moves
    log-probs by ~1e-3; off, the H100 agreed with the CPU within 4e-6 at
    enwik8_base and wt103_base, at the same decode speed
    (`benchmarks.long_memory --part=cuda_parity`, benchmarks/README.md)."""
    cuda = {"use_tf32": str(int(bool(tf32)))}
    if cuda_graph:
        cuda["enable_cuda_graph"] = "1"
    return [(name, cuda) if name == CUDA else name for name in names]


def shared_weights(path, providers):
    """On the CPU, where the graphs of the export at `path` read one external
    data file (`model.onnx.data`): that file mapped once, as
    `{initializer name: OrtValue}` views of each weight of every graph;
    else `{}`. Handed to every session (`with_shared_weights`), they make
    all of a runtime's sessions read one copy of the weights in memory.
    The values must outlive the sessions. Without the onnx package (which
    reads where each weight lies) also `{}`: each session loads its own copy."""
    import onnxruntime as ort
    data_path = external_data_file(path)
    if CUDA in providers or not os.path.isfile(data_path):
        return {}
    try:
        import onnx  # noqa: F401  (external_weights reads the graphs without their weights)
    except ImportError:
        log.warning("the onnx package is not installed: each ONNX Runtime session "
                    "loads its own copy of the weights (pip install onnx to share one)")
        return {}
    from google.protobuf.message import DecodeError
    try:
        data = np.memmap(data_path, np.uint8, mode="r")
    except ValueError as err:  # an empty file
        raise ModelDirError(f"cannot read the ONNX weights {data_path}: {err}") from None
    values = {}
    for graph in [path] + list((decode_files(path) or {}).values()):
        try:  # a truncated or corrupt file is a ModelDirError, as `open_session` makes it
            weights = list(external_weights(graph, data_path))
        except (DecodeError, ValueError) as err:
            raise ModelDirError(f"cannot open the ONNX model {graph}: {err}") from None
        for name, dtype, dims, offset, length in weights:
            if offset + length > data.size:
                raise ModelDirError(f"cannot open the ONNX model {graph}: its weight {name} "
                                    f"ends at byte {offset + length} of {data_path}, which "
                                    f"holds {data.size} (a truncated file?)")
            if name not in values:
                array = data[offset:offset + length].view(dtype).reshape(dims)
                values[name] = ort.OrtValue.ortvalue_from_numpy(array)
    return values


def with_shared_weights(options, values):
    """`options` (an `onnxruntime.SessionOptions`, or None for new ones)
    whose sessions read the `shared_weights` `values` as they are: no packed
    copy per session (`session.disable_prepacking`), and no CPU arena, which
    would keep the peak of `decode_init` (the size of the cache) for the
    runtime's life."""
    import onnxruntime as ort
    options = options or ort.SessionOptions()
    if values:
        for name, value in values.items():
            options.add_initializer(name, value)
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.enable_cpu_mem_arena = False
    return options


def external_weights(graph_path, data_path):
    """`(name, numpy dtype, dims, offset, length)` of each initializer of the
    ONNX file `graph_path` stored in `data_path` (the graph is read without
    its weights)."""
    import onnx
    from google.protobuf.message import DecodeError
    try:
        model = onnx.load(graph_path, load_external_data=False)
    except (DecodeError, OSError) as err:  # a graph cut short or not ONNX
        raise ModelDirError(f"cannot read the ONNX graph {graph_path}: {err}") from None
    folder = os.path.dirname(os.path.abspath(graph_path))
    for tensor in model.graph.initializer:
        info = {entry.key: entry.value for entry in tensor.external_data}
        if tensor.data_location != onnx.TensorProto.EXTERNAL or \
                os.path.join(folder, info.get("location", "")) != os.path.abspath(data_path):
            continue
        yield (tensor.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type),
               list(tensor.dims), int(info.get("offset", 0)), int(info["length"]))


def cuda_load_failure(provider):
    """The warning for CUDA listed by this onnxruntime but not loaded.

    Args:
        provider: where the session runs instead.
    Returns:
        str: one line naming the CUDA version onnxruntime was built for
        (onnxruntime-gpu 1.31: 13.0), whose libraries the loader must find."""
    try:
        from onnxruntime.capi import build_and_package_info
        built = f"a CUDA {build_and_package_info.cuda_version} build"
    except (ImportError, AttributeError):
        built = "its CUDA build"
    return (f"{CUDA} failed to load: this onnxruntime is {built} and needs that CUDA's "
            "libraries (cuBLAS, cuDNN, ...) where the loader finds them (LD_LIBRARY_PATH, or "
            f"onnxruntime.preload_dlls() for the nvidia-* wheels); running on {provider}")


def _check_graph_against(info, session, path):
    """Raises `ModelDirError` where the graph's declared inputs and outputs
    are not what its metadata (`info`) says: edited or copied metadata would
    check ids against another vocabulary, promise another log_probs shape, or
    size memories the graph then refuses."""
    cfg = info.config
    expected = {"mems": [cfg.n_layer, None, info.mem_len, cfg.d_model],
                "mem_mask": [None, info.mem_len],
                "log_probs": [None, None, cfg.n_token] if info.log_probs == "all"
                else [None, cfg.n_token]}
    declared = {a.name: a.shape for a in session.get_inputs() + session.get_outputs()}
    for name, dims in expected.items():
        shape = declared.get(name)
        if shape is None or len(shape) != len(dims) or any(
                isinstance(s, int) and d is not None and s != d for s, d in zip(shape, dims)):
            wanted = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
            raise ModelDirError(f"{path}: its metadata makes {name} {wanted}, the graph declares "
                                f"{shape if shape is not None else 'no such tensor'}: the "
                                "metadata is not this graph's")


def open_session(path, session_options=None, providers=None, disabled_optimizers=()):
    """An `onnxruntime.InferenceSession` of a path (or a serialized model),
    without the graph optimizers named in `disabled_optimizers`; a missing,
    truncated or corrupt file, or a session the providers cannot build, is a
    `ModelDirError` naming it (never onnxruntime's traceback)."""
    import onnxruntime as ort
    try:
        return ort.InferenceSession(path, sess_options=session_options, providers=providers,
                                    **({"disabled_optimizers": list(disabled_optimizers)}
                                       if disabled_optimizers else {}))
    except Exception as err:  # onnxruntime's own types (Fail, InvalidProtobuf, ...)
        if not type(err).__module__.startswith("onnxruntime"):
            raise
        reason = " ".join(str(err).split())
        name = "built in memory" if isinstance(path, bytes) else path
        raise ModelDirError(f"cannot open the ONNX model {name}: {reason}") from None


class OnnxRuntime(Runtime):
    """Runs `model.onnx` with onnxruntime.

    With `io_binding=True` (default) inputs and the memory are bound as
    OrtValues on the session's device and the new memory is left there;
    only the log-probs are copied to the host.

    `fixed_shapes` (`"auto"`, True, `"one_token"`, False): a `step` or
    `score` of a `(batch, seq_len)` seen before runs on a session of
    `model.onnx` with those two axes fixed (ONNX Runtime's free-dimension
    overrides), opened at the second call of that shape (a one-off prompt
    pays nothing); `FIXED_SHAPES_KEPT` (4) are kept, the least recently
    used closed. ONNX Runtime then folds the graph's shape arithmetic (the
    `small` preset keeps 301 of 596 nodes; docs/generation.md) and every
    value crossing between host and device; outputs are identical.
    `"one_token"` fixes `[1, 1]` only (decoding one stream; what
    `single_stream=True`, deprecated, did). They read the
    shared mapped weights (`shared_weights`) where there are some (CPU, an
    export with `model.onnx.data`: no copy, matmuls on unpacked weights);
    elsewhere (CUDA, weights inside `model.onnx`) each holds its own copy.
    `"auto"`: True on CUDA (where each node is a launch, and the fixed
    buffers replay as a CUDA graph, below); on the CPU, where a segment
    gained little from it (benchmarks/README.md), `"one_token"` for models
    up to `SINGLE_STREAM_MAX_BYTES` (256 MiB), else False. With
    `session_options`, whose overrides would be every shape's, at most
    `"one_token"` (its overrides added to them once the main session and
    the decode graphs are open).

    Weights in memory (CPU, an export whose graphs read one
    `model.onnx.data`): the two hot paths, the step (`model.onnx`) and the
    decode step, pack their own copies for ONNX Runtime's fastest matmuls;
    every other session (`decode_init`, `decode_read`, the fixed-shape
    steps) reads one shared, mapped copy (`shared_weights`). `low_memory=True`
    shares it with the hot paths too: one copy in all, and slower matmuls
    on the unpacked weights (benchmarks/NOTES.md §4, "Runtime memory"); its
    sessions fold no constants (`UNFOLDED`), which would copy the weights a
    graph transposes.

    `session_options`: an `onnxruntime.SessionOptions` for every session,
    as given (no shared weights; `fixed_shapes` at most `"one_token"`).

    `device_cache` (`"auto"`, True, False): `decode_init` keeps the decode
    cache in OrtValues on the session's device and each step writes its
    token there in place (`export.device_cache`), and a `SessionTable`
    keeps its slab there (`export.slab.DeviceSlab`); `"auto"` does so on CUDA,
    where a numpy cache would cross the bus at every step. True on the CPU
    provider runs the device code there (for tests and diagnosis; the host
    cache is faster on the CPU).

    `cuda_graph` (`"auto"`, True, False): device steps replay CUDA graphs
    over fixed buffers, one set per batch size (`export.device_cache`),
    and so do the fixed-shape segments (`export.device_memory.FixedSegment`,
    on the device path: CUDA, or `device_cache=True`); `"auto"` does so
    with the cache on CUDA (far faster per token: measured at ec22188,
    benchmarks/NOTES.md §5). An export whose step or segment cannot be captured runs it
    without them, with a warning.

    `tf32` (default False): on CUDA, let float32 matmuls use TF32 tensor
    cores (ONNX Runtime's own default), which moves log-probs by ~1e-3;
    off, the GPU agrees with the CPU to float32 round-off.
    """

    backend = "onnxruntime"

    def __init__(self, path, device="auto", io_binding=True, session_options=None,
                 fixed_shapes="auto", device_cache="auto", tf32=False, cuda_graph="auto",
                 low_memory=False, single_stream=None):
        names, reason = choose_providers(device)
        providers = provider_entries(names, tf32)
        if reason and (device != "auto" or cuda_built() or nvidia_driver()):
            # asked for, onnxruntime-gpu that cannot load it, or a GPU it cannot use
            log.warning("%s", reason)
        if single_stream is not None:  # fixed_shapes's old name, for one token of one stream
            warn_deprecated("OnnxRuntime.single_stream",
                            "fixed_shapes ('one_token' for single_stream=True)")
            fixed_shapes = "one_token" if single_stream is True else single_stream
        for name, value in (("device_cache", device_cache), ("cuda_graph", cuda_graph)):
            if value not in ("auto", True, False):
                raise TxlError(f"{name} must be 'auto', True or False, got {value!r}")
        if fixed_shapes not in ("auto", True, "one_token", False):
            raise TxlError("fixed_shapes must be 'auto', True, 'one_token' or False, got "
                           f"{fixed_shapes!r}")
        if session_options and fixed_shape_of(session_options):
            raise TxlError("these session_options hold the axes another runtime fixed to "
                           f"[{fixed_shape_of(session_options)}] for its one-token session: "
                           "give each runtime options of its own")
        # The session openers below hold no reference to `self`: a runtime in a
        # reference cycle would keep its sessions until a garbage collection.
        # Sessions opened later read the files then: they must be the ones
        # read now (recorded before they are read: a re-export meanwhile is seen).
        files = self._files = _FilesOpened(path)
        weights = self._shared_weights = {} if session_options else shared_weights(path, names)
        shared = (lambda: session_options) if session_options else \
            (lambda: with_shared_weights(None, weights))
        # The hot paths (the step, the decode step) pack their own copy unless `low_memory`.
        packed = shared if low_memory or session_options else lambda: None
        # `low_memory` sessions fold no weight into a copy of their own.
        unfolded = self._unfolded = UNFOLDED if low_memory and weights else ()
        self.session = open_session(path, packed(), providers, self._unfolded)
        # `fixed_shapes`: {shape: session, or `FixedSegment` on the device path}, oldest first.
        self._fixed, self._seen = OrderedDict(), OrderedDict()
        self._caller_options = bool(session_options)  # the fixed shape's overrides go into them
        self._open_fixed_session = files.checked(lambda shape, graphs: _fixed_shape_session(
            path, shared(), provider_entries(names, tf32, cuda_graph=graphs), shape, unfolded))
        try:
            info = ExportInfo(self.session.get_modelmeta().custom_metadata_map)
        except TxlError as error:
            raise ModelDirError(f"{path}: {error}") from None
        super().__init__(info)
        _check_graph_against(info, self.session, path)
        self.provider = self.session.get_providers()[0]
        if CUDA in names and self.provider != CUDA:  # it loaded for `cuda_loads`, not here
            log.warning("%s", cuda_load_failure(self.provider))
        self.device = "cuda" if self.provider == CUDA else "cpu"
        self.io_binding = bool(io_binding)
        if fixed_shapes == "auto":
            fixed_shapes = True if self.device == "cuda" and not session_options else \
                "one_token" if _model_bytes(path) <= SINGLE_STREAM_MAX_BYTES else False
        elif fixed_shapes is True and session_options:
            raise TxlError("fixed_shapes=True needs the runtime's own session options (each "
                           "shape's axes are fixed in them); with session_options, "
                           "fixed_shapes='one_token' fixes [1, 1] in them")
        self.fixed_shapes = fixed_shapes
        self._outputs = [o.name for o in self.session.get_outputs()]
        decode_paths = self._decode_paths = decode_files(path)
        decode_disabled = self._unfolded if info.decode_dtype == "float32" else \
            FLOAT16_DECODE_DISABLED
        token_path = self._token_path = token_file(path) if decode_paths else None
        if token_path:
            decode_paths = {**decode_paths, "decode_token": token_path}
        files.add(decode_paths)
        # Each decode graph's session, opened at its first use (a device
        # cache steps through decode_token, a host cache through decode_step).
        self._decode_sessions, self._decode_graph_names = {}, tuple(decode_paths or ())
        self._open_decode = files.checked(lambda name: open_session(
            decode_paths[name], packed() if name in ("decode_step", "decode_token") else shared(),
            providers, decode_disabled))
        self.device_cache = self._keeps_cache_on_device(device_cache)
        self.cuda_graph = self._replays_graphs(cuda_graph)
        self._segment_graphs = True  # until ONNX Runtime refuses to capture a segment
        ring, on_cuda = self.mem_len + 1, self.device == "cuda"
        self._open_replay = files.checked(lambda token=True: open_replay_sessions(
            decode_paths["decode_step"], ring, info.cache_dtype, packed(),
            provider_entries(names, tf32, cuda_graph=on_cuda), providers,
            token_path if token else None, decode_disabled))
        self._replay_sessions, self._residents = None, {}
        # What threads share: the sessions opened on first use, `_fixed` and
        # `_seen` (the bookkeeping, held briefly); `_replay_lock`: the
        # `Resident`s' buffers, which device caches take turns in, and on CUDA
        # every run of a session that replays CUDA graphs (`_replay_lock_of`).
        self._lock = threading.RLock()
        self._replay_lock = threading.RLock()
        # The small graphs of `export.device_cache`, `slab`, `device_memory`.
        self._open_model = lambda model: open_session(model.SerializeToString(), shared(),
                                                      providers)
        self._small_graphs = {}
        log.info("onnxruntime session on %s (providers %s)", self.provider,
                 self.session.get_providers())

    def describe(self):
        return (super().describe() + f" provider={self.provider} io_binding={self.io_binding}"
                f" fixed_shapes={self.fixed_shapes} decode_cache={self.use_decode_cache}"
                f" device_cache={self.device_cache} cuda_graph={self.cuda_graph}")

    def _replays_graphs(self, wanted):
        """Whether device steps replay CUDA graphs (`export.device_cache`): by
        default with the cache on CUDA; True elsewhere runs the same
        fixed-buffer path without a capture."""
        if wanted is True and not self.device_cache:
            raise TxlError("cuda_graph=True needs the decode cache on the device "
                           "(device_cache=True)")
        return bool(self.device_cache and (wanted is True or
                                           (wanted == "auto" and self.device == "cuda")))

    def _keeps_cache_on_device(self, wanted):
        """Whether `decode_init` keeps the cache in OrtValues on the session's
        device (`export.device_cache`): by default on CUDA, where a host
        cache would cross the bus at every step; needs IO binding and onnx."""
        if wanted is False or (wanted == "auto" and self.device != "cuda"):
            return False
        if not self.io_binding:
            if wanted is True:
                raise TxlError("device_cache=True needs io_binding=True")
            return False
        try:
            import onnx  # noqa: F401  (builds the ring's write graph)
        except ImportError:
            if wanted is True:
                raise TxlError("device_cache=True needs the onnx package (pip install onnx)")
            log.warning("the onnx package is not installed: the decode cache stays in "
                        "host memory and crosses the bus at every step")
            return False
        return True

    @property
    def has_decode_cache(self):
        return self._usable_decode_graphs(self._decode_paths is not None)

    def _fixed_for(self, shape, open_now=False):
        """The fixed-shape session of `shape` (`fixed_shapes`), a
        `FixedSegment` over it on the device path, or None where the main
        session runs it: a shape's first call (unless `open_now`) only
        remembers it, its second opens it."""
        shape = tuple(int(n) for n in shape)
        if not (self.fixed_shapes is True or
                (self.fixed_shapes == "one_token" and shape == (1, 1))):
            return None
        with self._lock:
            if shape in self._fixed:
                self._fixed.move_to_end(shape)
                return self._fixed[shape]
            if shape not in self._seen and not open_now:
                self._seen[shape] = True
                if len(self._seen) > SHAPES_REMEMBERED:
                    self._seen.popitem(last=False)
                return None
        # Opened without the lock (other shapes' calls go on meanwhile); a
        # thread that opened the same shape first wins.
        fixed = self._open_fixed(shape)
        with self._lock:
            self._seen.pop(shape, None)
            if shape not in self._fixed:
                while len(self._fixed) >= FIXED_SHAPES_KEPT:
                    self._fixed.popitem(last=False)
                self._fixed[shape] = fixed
            self._fixed.move_to_end(shape)
            return self._fixed[shape]

    def _open_fixed(self, shape):
        """A session of `shape`; on the device path a `FixedSegment` over
        one, replayed as a CUDA graph where `cuda_graph` is on (without,
        with a warning, where ONNX Runtime cannot capture it)."""
        if self._caller_options and self.has_decode_cache:
            # The overrides stay in the caller's options: the graphs opened
            # later with them (a `batch` axis) would be fixed to this shape.
            for name in self._decode_graph_names:
                self._decode_session(name)
            self._replay()
        if not self._memory_on_device:
            return self._open_fixed_session(shape, False)
        session = None
        if self.cuda_graph and self._segment_graphs:
            try:
                session = self._open_fixed_session(shape, self.device == "cuda")
            except ModelDirError as error:  # a node left to the CPU: no capture
                log.warning("segments run without CUDA graphs: %s", error)
                self._segment_graphs = False
        captured = session is not None and self.device == "cuda"
        session = session or self._open_fixed_session(shape, False)
        return FixedSegment(session, self._small_graph("copy_memory", memory_copy_model),
                            self.device, shape, lock=self._replay_lock_of(captured))

    def _replay_lock_of(self, captured):
        """The lock of the runs of a session that replays CUDA graphs
        (`captured`), or None. ONNX Runtime keeps each session's captured
        graphs and its count of runs before a capture unguarded, and a
        capture forbids other threads' CUDA calls meanwhile: on CUDA such
        runs take turns, one runtime-wide lock (`_replay_lock`)."""
        return self._replay_lock if captured else None

    # ------------------------------------------------------------ conversion
    def _ortvalue(self, array):
        return ortvalue(array, self.device)

    def _to_backend(self, mems, mem_mask):
        if self.io_binding:
            return RuntimeMemory(self._ortvalue(mems), self._ortvalue(mem_mask))
        return RuntimeMemory(mems, mem_mask)

    def _native(self, mems, mem_mask):
        is_ort = [hasattr(v, "data_type") for v in (mems, mem_mask)]
        if self.io_binding:
            return tuple(v if ort_value else self._ortvalue(_host(v))
                         for v, ort_value in zip((mems, mem_mask), is_ort))
        return tuple(v.numpy() if ort_value else _host(v)
                     for v, ort_value in zip((mems, mem_mask), is_ort))

    # ------------------------------------------------------------------- run
    def _step(self, ids, mems, mem_mask):
        if not self.io_binding:
            session = self._fixed_for(ids.shape) or self.session
            out = dict(zip(self._outputs, session.run(
                None, {"token_ids": ids, "mems": mems, "mem_mask": mem_mask})))
            return out["log_probs"], RuntimeMemory(out["new_mems"], out["new_mem_mask"])
        return self._bound_step(ids, mems, mem_mask)

    def _bound_step(self, ids, mems, mem_mask, read=None):
        """`(log-probs, new memory)` of a step with IO binding: the new
        memory is left on the session's device; the log-probs are numpy, or
        what `read(log-probs OrtValue on the device)` makes of them, called
        while a `FixedSegment`'s buffers (which its next run overwrites, from
        any thread) are still held."""
        fixed = self._fixed_for(ids.shape)
        if isinstance(fixed, FixedSegment):
            with fixed.lock:
                log_probs, memory = fixed.run(ids, mems, mem_mask)
                # On the host, an array of its own: `_to_numpy` copies the CPU's view of
                # the buffer (the next run's too), not a device's numpy(), already a copy.
                return (_to_numpy(log_probs) if read is None else read(log_probs),
                        RuntimeMemory(*memory))
        session = fixed or self.session
        binding = session.io_binding()
        binding.bind_ortvalue_input("token_ids", self._ortvalue(ids))
        binding.bind_ortvalue_input("mems", mems)
        binding.bind_ortvalue_input("mem_mask", mem_mask)
        binding.bind_output("log_probs", "cpu" if read is None else self.device, 0)
        binding.bind_output("new_mems", self.device, 0)
        binding.bind_output("new_mem_mask", self.device, 0)
        session.run_with_iobinding(binding)
        log_probs, new_mems, new_mem_mask = binding.get_outputs()
        return (log_probs.numpy() if read is None else read(log_probs),
                RuntimeMemory(new_mems, new_mem_mask))

    # ------------------------------------------------- memory on the device
    @property
    def _memory_on_device(self):
        """Whether memories are taken, joined and scored with small graphs
        where they are (`export.device_memory`): on a device other than the
        CPU, and where the device path is forced (`device_cache=True`); on
        the CPU numpy does it, without a session run."""
        return self.io_binding and (self.device != "cpu" or self.device_cache)

    def _small_graph(self, key, build):
        """The session of the small graph `build()`, opened once per `key`."""
        session = self._small_graphs.get(key)
        if session is None:
            with self._lock:
                if key not in self._small_graphs:
                    self._small_graphs[key] = self._open_model(
                        with_cache_dtype(build(), self.info.cache_dtype))
                session = self._small_graphs[key]
        return session

    def _score(self, ids, targets, mems, mem_mask):
        """The log-probs stay on the device; only the nll come to the host."""
        if not self._memory_on_device or self.log_probs_mode != "all":
            return super()._score(ids, targets, mems, mem_mask)
        nll_session = self._small_graph("nll", nll_model)

        def nll_of(log_probs):
            nll = np.empty(targets.shape, np.float32)
            run_on_device(nll_session, self.device, {"log_probs": log_probs, "targets": targets},
                          into={"nll": nll})
            return nll
        return self._bound_step(ids, mems, mem_mask, read=nll_of)

    def _take_memory(self, memory, rows):
        parts = self._device_parts([memory])
        if parts is None:
            return super()._take_memory(memory, rows)
        out = run_on_device(self._small_graph("take_memory", memory_take_model), self.device,
                            {"mems": parts[0][0], "mem_mask": parts[0][1],
                             "rows": np.asarray(rows, np.int64)})
        return RuntimeMemory(out["taken_mems"], out["taken_mem_mask"])

    def _split_memory(self, memory):
        parts = self._device_parts([memory])
        if parts is None:
            return super()._split_memory(memory)
        return [self._take_memory(memory, [row])
                for row in range(shape_and_dtype(parts[0][1])[0][0])]

    def _concat_memories(self, memories):
        """On the device, with one join graph per power of two: the first
        2^k memories (the most a graph can take) are joined into one, which
        takes their place, until one is left. So a runtime opens at most
        log2(batch) + 1 of them, whatever counts it joins; 2 (or 4, 8, ...)
        memories are one run, as with a graph per count."""
        parts = self._device_parts(memories)
        if parts is None:
            return super()._concat_memories(memories)
        while True:
            count = 1 << (len(parts).bit_length() - 1)
            out = run_on_device(
                self._small_graph(("concat", count), lambda: memory_concat_model(count)),
                self.device, {name: value for i, (mems, mem_mask) in enumerate(parts[:count])
                              for name, value in ((f"mems_{i}", mems),
                                                  (f"mem_mask_{i}", mem_mask))})
            if count == len(parts):
                return RuntimeMemory(out["mems"], out["mem_mask"])
            parts = [(out["mems"], out["mem_mask"])] + parts[count:]

    def _device_parts(self, memories):
        """`[(mems, mem_mask)]` of `memories` when they are all OrtValues and
        memories are handled on the device, else None (through the host)."""
        if not self._memory_on_device:
            return None
        parts = [_unpack(memory) for memory in memories]
        return parts if all(is_ortvalue(v) for part in parts for v in part) else None

    # ------------------------------------------------- the cached decode interface
    def _decode_session(self, name):
        session = self._decode_sessions.get(name)
        if session is None:
            with self._lock:
                if name not in self._decode_sessions:
                    self._decode_sessions[name] = self._open_decode(name)
                session = self._decode_sessions[name]
        return session

    def _decode_run(self, name, inputs, into=None):
        """`{output: numpy}` of a decode graph. With IO binding the inputs
        are bound as OrtValues: on the CPU each reads its numpy array in
        place (the cache's layer views are not copied). Outputs named in
        `into` end up in those numpy arrays (on the CPU, contiguous ones are
        written there by the graph: no copy)."""
        session = self._decode_session(name)
        names = [o.name for o in session.get_outputs()]
        into = into or {}
        if not self.io_binding:
            out = dict(zip(names, session.run(None, inputs)))
        else:
            binding = session.io_binding()
            # The OrtValues must outlive the run: the binding does not keep them.
            bound = {key: self._ortvalue(value) for key, value in inputs.items()}
            for key, value in bound.items():
                binding.bind_ortvalue_input(key, value)
            for key in names:
                if key in into and self.device == "cpu" and into[key].flags.c_contiguous:
                    array = into[key]
                    binding.bind_output(key, "cpu", 0, array.dtype, list(array.shape),
                                        array.ctypes.data)
                else:
                    binding.bind_output(key, "cpu")
            session.run_with_iobinding(binding)
            out = dict(zip(names, (v.numpy() for v in binding.get_outputs())))
        for key, array in into.items():
            if not np.may_share_memory(out[key], array):
                array[...] = out[key]
            out[key] = array
        return out

    def _decode_init(self, mems, mem_mask):
        if self.device_cache:
            return DeviceCache(run_on_device(self._decode_session("decode_init"), self.device,
                                             {"mems": mems, "mem_mask": mem_mask}))
        cache = host_cache(self._decode_run("decode_init", {"mems": _host(mems),
                                                            "mem_mask": _host(mem_mask)}))
        return_freed_memory()
        return cache

    def _decode_read(self, ids, cache):
        if on_device(cache):
            log_probs = np.empty([ids.shape[0], self.n_token], np.float32)
            session = self._decode_session("decode_read")
            with self._holding(cache):
                out = run_on_device(session, self.device, {"token_ids": ids, **cache},
                                    {"log_probs": log_probs})
            new = {name: out[f"new_{name}"] for name in CHANGING_NAMES}
            return log_probs, DeviceCache({**new, "positions": cache["positions"]})
        # The new cache is written straight into fresh aligned buffers.
        new = {name: aligned_empty(value.shape, value.dtype) for name, value in cache.items()
               if name != "positions"}
        out = self._decode_run("decode_read", {"token_ids": np.asarray(ids, np.int32), **cache},
                               into={f"new_{name}": value for name, value in new.items()})
        # `positions` never changes: the new cache shares the old one's.
        return out["log_probs"], {**new, "positions": cache["positions"]}

    def _decode_step(self, ids, stopped, cache):
        if on_device(cache):
            return self._device_step(ids, stopped, cache)
        out = self._decode_run("decode_step", {"token_ids": np.asarray(ids, np.int32),
                                               **step_feeds(cache)})
        write_token(cache, out, stopped)
        return out["log_probs"]

    # ------------------------------------------- the decode cache on the device
    def _device_step(self, ids, stopped, cache):
        """One step of a device cache; a `DeviceCache`'s ring positions, where
        the host knows them, move on with it (no read of the device)."""
        with self._holding(cache):
            known = cache.known_positions() if isinstance(cache, DeviceCache) else None
            # Positions moved on from checked ones lie in the ring too.
            checked = known is not None and cache.positions_checked()
            if known is not None:  # (unknown until the step returns: an interrupted
                cache.remember(None)  # one may have moved the ring on the device)
            if self._replay() is not None:
                log_probs = self._resident(cache).step(cache, ids, stopped)
            elif self._token_path:
                log_probs = device_token_step(self._decode_session("decode_token"), self.device,
                                              ids, stopped, cache, self.n_token)
            else:
                log_probs = device_step(self._decode_session("decode_step"),
                                        self._ring_writer(), self.device, ids, stopped, cache,
                                        self.n_token)
            if isinstance(cache, DeviceCache):
                cache.remember(None if known is None else
                               known.advanced(stopped, self.mem_len + 1), checked)
        return log_probs

    def _resident(self, cache):
        """The `Resident` of the cache's batch size (made at its first step)."""
        batch = cache["valid"].shape()[0]
        resident = self._residents.get(batch)  # (made once: no lock to find it)
        if resident is not None:
            return resident
        with self._lock:
            if batch not in self._residents:
                self._residents[batch] = Resident(self._replay_sessions, self.device, cache,
                                                  self.n_token)
            return self._residents[batch]

    def _holding(self, cache):
        """The lock to hold while reading or writing a device cache's tensors
        where steps run over a `Resident`'s fixed buffers (`cuda_graph`): a
        step of another cache of its batch size, from any thread, moves it
        out of them (its dict then names other buffers, holding the same
        state); one lock for all sizes, as on CUDA their steps replay the
        same sessions' graphs (`_replay_lock_of`). Elsewhere none: a
        cache's tensors are its own."""
        if not (self.cuda_graph and on_device(cache)):
            return contextlib.nullcontext()
        return self._replay_lock

    def _ring_positions(self, cache):
        """A `DeviceCache`'s positions as the host knows them; read from the
        device (once: then known) where it does not."""
        with self._holding(cache):
            known = cache.known_positions() if isinstance(cache, DeviceCache) else None
            if known is None:
                known = super()._ring_positions(cache)
                if isinstance(cache, DeviceCache):
                    cache.remember(known)
        return known

    def _realign(self, cache, rows, positions):
        """A device cache's rows are rotated on the device: each row taken
        out and put back, its ring moved onto the shared slot, in place."""
        if not on_device(cache):
            return super()._realign(cache, rows, positions)
        size = self.mem_len + 1
        take = self._small_graph("take_slab_rows", slab_take_model)
        put = self._small_graph("put_slab_row", lambda: slab_put_model(size))
        with self._holding(cache):
            checked = isinstance(cache, DeviceCache) and cache.positions_checked() and \
                cache.known_positions() is positions
            if isinstance(cache, DeviceCache):  # (unknown while rows are rotated)
                cache.remember(None)
            for row in rows.tolist():
                put_row(put, self.device, cache,
                        take_device_rows(take, self.device, cache, [row]), row,
                        (positions.slot - int(positions.row_slot[row])) % size)
            if isinstance(cache, DeviceCache):
                cache.remember(positions.realigned(rows), checked)

    def _replay(self):
        """The sessions CUDA graphs replay (`open_replay_sessions`), or None
        where they are off or the export's step cannot be captured."""
        if self.cuda_graph and self._replay_sessions is None:
            with self._lock:
                if self.cuda_graph and self._replay_sessions is None:
                    try:
                        self._replay_sessions = self._open_replay_any()
                    except ModelDirError as error:  # an export whose step cannot be captured
                        log.warning("decode steps run without CUDA graphs: %s (re-export "
                                    "the model to replay them)", error)
                        self.cuda_graph = False
        return self._replay_sessions if self.cuda_graph else None

    def _open_replay_any(self):
        """The replayed sessions: `decode_token`'s where it is captured, else
        the step's and the ring's write's (`ModelDirError` where neither is)."""
        if self._token_path:
            try:
                return self._open_replay()
            except ModelDirError as error:
                log.warning("decode_token is not captured as a CUDA graph (%s): replaying the "
                            "step and the ring's write", error)
        return self._open_replay(token=False)

    def _ring_writer(self):
        return self._small_graph("write", lambda: ring_write_model(self.mem_len + 1))

    def _cache_slab(self, capacity):
        """With the cache on the device, a `DeviceSlab` whose steps run over
        fixed buffers (replayed as CUDA graphs where they are on), else the
        host's `CacheSlab`."""
        if not self.device_cache:
            return super()._cache_slab(capacity)
        steps = self._replay() or self._fixed_step_sessions()
        size = self.mem_len + 1
        sessions = {**{name: steps[name] for name in ("step", "write", "move", "token")
                       if name in steps},
                    "put": self._small_graph("put_slab_row", lambda: slab_put_model(size)),
                    "take": self._small_graph("take_slab_rows", slab_take_model)}
        return DeviceSlab(capacity, sessions, self.device, self.n_token,
                          lock=self._replay_lock_of(self.cuda_graph and self.device == "cuda"))

    def _fixed_step_sessions(self):
        """`FixedStep`'s sessions without CUDA graphs: `decode_token` where
        the export has it, else the step and the ring's write; the move."""
        steps = {"token": self._decode_session("decode_token")} if self._token_path else {
            "step": self._decode_session("decode_step"), "write": self._ring_writer()}
        return {**steps, "move": self._small_graph("move", lambda: copy_model(MOVED))}

    def cache_memory(self, cache):
        """The memory a decode cache holds; a device cache's is computed on
        the device and stays there (`device_cache.ring_memory_model`)."""
        if not on_device(cache):
            return super().cache_memory(cache)
        self._check_cache(cache)
        session = self._small_graph("memory", lambda: ring_memory_model(self.mem_len + 1))
        with self._holding(cache):
            out = run_on_device(session, self.device, {
                name: cache[name] for name in ("cache_mems", "valid", "row_slot")})
        return RuntimeMemory(out["mems"], out["mem_mask"])

    def _writable(self, cache):
        return on_device(cache) or super()._writable(cache)

    def _copy_cache(self, cache):
        return self._same_place(cache, super()._copy_cache)

    def _take_cache(self, cache, rows):
        return self._same_place(cache, lambda host: super(OnnxRuntime, self)._take_cache(
            host, rows))

    def _concat_caches(self, caches):
        if not any(on_device(c) for c in caches):
            return super()._concat_caches(caches)
        return self._to_device(super()._concat_caches([self._host_copy(c) for c in caches]))

    def _same_place(self, cache, host_op):
        """`host_op` of `cache`, through the host for a device cache (which
        comes back on the device)."""
        if not on_device(cache):
            return host_op(cache)
        return self._to_device(host_op(self._host_copy(cache)))

    def _host_copy(self, cache):
        """A host cache of `cache` (a device cache's read under `_holding`)."""
        with self._holding(cache):
            return host_cache({name: _host(value) for name, value in cache.items()})

    def _to_device(self, cache):
        """A `DeviceCache` of the host cache `cache` (its positions known)."""
        return DeviceCache({name: self._ortvalue(value) for name, value in cache.items()},
                           ring_positions(cache["slot"], cache["row_slot"]))


class _FilesOpened:
    """The export's files as a runtime opened them (inode, size, mtime):
    the sessions it opens later (decode graphs, fixed shapes) read the files
    again, and a re-export into the folder since (a notebook's cell run
    again) would mix two exports' graphs and weights, silently where their
    geometry agrees."""

    def __init__(self, path):
        self.folder = os.path.dirname(os.path.abspath(path))
        self.stamps = {}
        self.add({"model": path, "weights": external_data_file(path)})

    def add(self, paths):
        """Records `paths` (`{name: path}`, or None), those that exist."""
        for p in (paths or {}).values():
            if os.path.exists(p):
                self.stamps[p] = _stamp(p)

    def check(self):
        """Raises `TxlError` when a recorded file changed or went (not a
        `ModelDirError`, which a failed CUDA graph capture is)."""
        for p, stamp in self.stamps.items():
            try:
                now = _stamp(p)
            except OSError:
                now = None
            if now != stamp:
                raise TxlError(
                    f"the export in {self.folder} changed after this runtime opened it "
                    f"({os.path.basename(p)} was {'replaced' if now else 'removed'}: exported "
                    "again?); open it again with export.open_runtime")

    def checked(self, open_function):
        """`open_function`, run after `check`."""
        def opened(*args, **kwargs):
            self.check()
            return open_function(*args, **kwargs)
        return opened


def _stamp(path):
    status = os.stat(path)
    return status.st_ino, status.st_size, status.st_mtime_ns


def decode_files(path):
    """`{"decode_init": path, "decode_step": path}` of the decode graphs
    written beside `path` (`export_decode_onnx`), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    paths = {name: os.path.join(folder, file) for name, file in DECODE_FILES.items()}
    return paths if all(os.path.isfile(p) for p in paths.values()) else None


def token_file(path):
    """The `decode_token` graph written beside `path`, or None (an export
    made before it, or with `interfaces` that left it out)."""
    token = os.path.join(os.path.dirname(os.path.abspath(path)), DECODE_TOKEN_FILE)
    return token if os.path.isfile(token) else None


def _model_bytes(path):
    """The model file's size plus its external data file's, if any."""
    data = external_data_file(path)
    return os.path.getsize(path) + (os.path.getsize(data) if os.path.exists(data) else 0)


def _fixed_shape_session(path, options, providers, shape, disabled_optimizers=()):
    """A session of `path` with its dynamic `batch` and `seq_len` axes fixed
    to `shape` in `options` (which no other session may use)."""
    for axis, size in zip(("batch", "seq_len"), shape):
        options.add_free_dimension_override_by_name(axis, int(size))
    options.add_session_config_entry(FIXED_SHAPE_ENTRY, ", ".join(str(int(n)) for n in shape))
    return open_session(path, options, providers, disabled_optimizers)


def fixed_shape_of(options):
    """The shape (text) whose axes `_fixed_shape_session` fixed in `options`, or None."""
    try:
        return options.get_session_config_entry(FIXED_SHAPE_ENTRY)
    except RuntimeError:  # onnxruntime's answer for an entry never set
        return None


def return_freed_memory():
    """Hands the C heap's free pages back to the system (glibc's
    `malloc_trim`; elsewhere nothing): `decode_init`'s temporaries are the
    size of the cache, and the heap would otherwise keep them."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _host(value):
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def open_replay_sessions(step_path, size, cache_dtype, session_options, graph_providers,
                         providers, token_path=None, disabled_optimizers=()):
    """The sessions `device_cache.Resident` runs: the step and the ring's
    write (`decode_token`'s one graph where `token_path` is given), and the
    move of its positions with `graph_providers` (CUDA graphs on: every run
    of theirs is a replay of fixed buffers), the cache copy with `providers`
    (keys and values in `cache_dtype`). The step's graph without the
    optimizers in `disabled_optimizers`, as the runtime's other decode
    sessions (`low_memory`'s unfolded weights, float16's NCHWc)."""
    models = {"move": copy_model(MOVED), "copy": copy_model()}
    if token_path is None:
        models["write"] = ring_write_model(size)
    models = {name: with_cache_dtype(model, cache_dtype) for name, model in models.items()}
    steps = {"token": open_session(token_path, session_options, graph_providers,
                                   disabled_optimizers)} if token_path else \
        {"step": open_session(step_path, session_options, graph_providers, disabled_optimizers)}
    return {**steps, **{name: open_session(model.SerializeToString(), session_options,
                                           providers if name == "copy" else graph_providers)
                        for name, model in models.items()}}
