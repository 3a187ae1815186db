"""The compute precision and XLA setting that pay on the hardware present.

`choose()` looks at the accelerator (TPU, GPU compute capability) or at the
CPU's instruction set, and returns the Keras dtype policy and `jit_compile`
value measured or known to be fastest there, with the reason in words. The
training job and `TransformerXLLM` use it for their "auto" defaults; explicit
settings always win. CPU choices come from `benchmarks/throughput.py`
(benchmarks/README.md): on a CPU with native bfloat16 dot products
(AVX512-BF16 or AMX) `mixed_bfloat16` trains fastest and XLA slows it down;
without them TensorFlow emulates bfloat16, which loses, so float32 is kept.
"""
import dataclasses
import functools
import os

from txl_tf.errors import TxlError

# oneDNN's `ONEDNN_MAX_CPU_ISA` values below its first bfloat16 dot-product
# ISA (AVX512_CORE_BF16): under such a cap a bfloat16 matmul has no kernel and
# the process aborts (`could not create a primitive descriptor`).
_ISA_WITHOUT_BFLOAT16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2",
                                   "AVX512_CORE", "AVX512_CORE_VNNI"})


@dataclasses.dataclass(frozen=True)
class Precision:
    """A Keras dtype policy name, a `jit_compile` value and why."""
    policy: str
    jit_compile: bool
    reason: str

    def describe(self):
        return (f"{self.policy}, jit_compile {'on' if self.jit_compile else 'off'} "
                f"({self.reason})")


@functools.lru_cache(maxsize=None)
def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags (empty where /proc/cpuinfo does not exist)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _gpu_capabilities():
    import tensorflow as tf
    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        capabilities.append((details.get("device_name", gpu.name),
                             tuple(details.get("compute_capability") or (0, 0))))
    return capabilities


def _accelerator_choice(strategy, gpus):
    """The `Precision` of a TPU strategy or of the GPUs `gpus`, or None (the CPU)."""
    import tensorflow as tf
    if strategy is not None and isinstance(
            strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        return Precision("mixed_bfloat16", True, "TPU: bfloat16 matrix units, XLA always")
    if gpus:
        name, capability = min(gpus, key=lambda g: g[1])
        if capability >= (8, 0):
            return Precision("mixed_bfloat16", True,
                             f"GPU {name}, compute capability {capability[0]}.{capability[1]}: "
                             "bfloat16 tensor cores; XLA fuses the element-wise ops")
        return Precision("float32", True,
                         f"GPU {name}, compute capability {capability[0]}.{capability[1]}: "
                         "no bfloat16 tensor cores; XLA fuses the element-wise ops")
    return None


def xla_spans_devices(strategy):
    """Why Keras cannot XLA-compile the steps under `strategy`, or None.

    Keras 3.15 compiles the whole step, the strategy's `run` inside it, as
    one XLA program (`TensorFlowTrainer._make_function`); under a mirrored
    strategy over several devices of a machine it runs on one of them and
    cannot read the other replicas' variables ("Trying to access resource
    ... located in device"; keras-team/keras#19005). One device per worker,
    or a TPU's cores (its own replication), compile.

    Args:
        strategy: a `tf.distribute.Strategy`, or None.

    Returns:
        A phrase naming the devices, or None.
    """
    import tensorflow as tf
    if not isinstance(strategy, (tf.distribute.MirroredStrategy,
                                 tf.distribute.MultiWorkerMirroredStrategy)):
        return None
    devices = strategy.extended.worker_devices
    if len(devices) < 2:
        return None
    return (f"its replicas are on {len(devices)} devices of this machine and Keras compiles "
            "the whole step as one XLA program, which runs on one device and cannot read "
            "the others' variables (keras-team/keras#19005)")


def _native_bfloat16(flags):
    """The CPU feature flags among `flags` that multiply bfloat16 natively."""
    return sorted(f for f in ("avx512_bf16", "amx_bf16") if f in flags)


def _capped_below_bfloat16(native, isa_cap):
    """Why oneDNN has no bfloat16 dot products on a CPU with the `native`
    bfloat16 flags, or None: `isa_cap` (default `ONEDNN_MAX_CPU_ISA`) is below them."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA", "") if isa_cap is None else isa_cap).upper()
    if native and cap in _ISA_WITHOUT_BFLOAT16:
        return (f"CPU with {' and '.join(f.upper() for f in native)}, but "
                f"ONEDNN_MAX_CPU_ISA={cap} leaves oneDNN no bfloat16 dot products")
    return None


def choose(strategy=None, flags=None, gpus=None, isa_cap=None):
    """The `Precision` for the hardware `strategy` runs on (default: what
    TensorFlow sees). `flags` (CPU feature flags), `gpus` (a list of
    `(name, (major, minor))`) and `isa_cap` (oneDNN's ISA cap, default the
    `ONEDNN_MAX_CPU_ISA` environment variable) override the detection, for
    tests."""
    accelerator = _accelerator_choice(strategy, _gpu_capabilities() if gpus is None else gpus)
    if accelerator is not None and accelerator.jit_compile and xla_spans_devices(strategy):
        return dataclasses.replace(accelerator, jit_compile=False, reason=(
            f"{accelerator.reason}; no XLA: {xla_spans_devices(strategy)}"))
    if accelerator is not None:
        return accelerator
    native = _native_bfloat16(cpu_flags() if flags is None else flags)
    capped = _capped_below_bfloat16(native, isa_cap)
    if capped:
        return Precision("float32", False, capped)
    if native:
        return Precision("mixed_bfloat16", False,
                         f"CPU with {' and '.join(f.upper() for f in native)}: native bfloat16 "
                         "dot products; XLA measured slower in bfloat16 on CPU")
    return Precision("float32", False, "CPU without native bfloat16 (AVX512-BF16 / AMX): "
                     "TensorFlow would emulate it")


def bfloat16_would_abort(strategy=None, flags=None, gpus=None, isa_cap=None):
    """Why a bfloat16 matmul would abort the process here, or None.

    On the CPU (no TPU `strategy`, no GPU) TensorFlow sends bfloat16 matmuls
    of a CPU with native bfloat16 to oneDNN, which under an ISA cap below it
    has no kernel (`could not create a primitive descriptor`). Without native
    bfloat16 TensorFlow emulates it, and with `TF_ENABLE_ONEDNN_OPTS=0` oneDNN
    is not used: both run.

    Args:
        strategy, flags, gpus, isa_cap: as in `choose` (detected when None).

    Returns:
        A phrase naming the CPU's flags and the cap, or None.
    """
    if _accelerator_choice(strategy, _gpu_capabilities() if gpus is None else gpus):
        return None
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false"):
        return None
    return _capped_below_bfloat16(_native_bfloat16(cpu_flags() if flags is None else flags),
                                  isa_cap)


def resolve(policy="auto", jit_compile=None, strategy=None):
    """The `Precision` to use.

    Args:
        policy: a Keras dtype policy name, "none" (float32) or "auto" (the
            `--mixed_precision` flag of the jobs).
        jit_compile: a bool, or None (auto).
        strategy: the distribution strategy (auto parts come from
            `choose(strategy)`).

    Returns:
        A `Precision`.

    Raises:
        TxlError: a bfloat16 policy asked for where it would abort the
            process (`bfloat16_would_abort`), or XLA under a strategy
            over several devices (`xla_spans_devices`).
    """
    chosen = choose(strategy)
    if policy == "auto" and jit_compile is None:
        return chosen
    policy = chosen.policy if policy == "auto" else ("float32" if policy == "none" else policy)
    if policy in ("mixed_bfloat16", "bfloat16"):
        why = bfloat16_would_abort(strategy)
        if why:
            raise TxlError(f"--mixed_precision={policy}: {why}, so the first matmul would "
                           "abort the process; use --mixed_precision=auto or none (float32), "
                           "or unset ONEDNN_MAX_CPU_ISA")
    jit = chosen.jit_compile if jit_compile is None else bool(jit_compile)
    if jit and xla_spans_devices(strategy):
        raise TxlError(f"--jit_compile under {type(strategy).__name__}: "
                       f"{xla_spans_devices(strategy)}; leave --jit_compile unset (auto: off "
                       "there) or train on one device")
    return Precision(policy, jit, f"set explicitly; auto would give {chosen.policy}, "
                                  f"jit_compile {'on' if chosen.jit_compile else 'off'}")
