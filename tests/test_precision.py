"""Precision: the hardware choice (`txl_tf.keras_support.precision`), its use by the model,
and bfloat16's tolerance against float32."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import TransformerXLConfig, TransformerXLLM
from txl_tf.keras_support import precision
from txl_tf.errors import TxlError
from txl_tf.keras_support.precision import choose, cpu_flags, resolve
from bfloat16_cpu import needs_bfloat16_matmuls


@pytest.mark.parametrize("flags,policy", [
    ({"avx2", "avx512f", "avx512_bf16"}, "mixed_bfloat16"),
    ({"avx2", "amx_tile", "amx_bf16"}, "mixed_bfloat16"),
    ({"avx2", "avx512f"}, "float32"),
    (set(), "float32"),
])
def test_cpu_choice_follows_native_bfloat16(flags, policy):
    chosen = choose(flags=frozenset(flags), gpus=[], isa_cap="")
    assert chosen.policy == policy and chosen.jit_compile is False
    assert chosen.reason.startswith("CPU with ") == (policy == "mixed_bfloat16")


@pytest.mark.parametrize("cap,policy", [
    ("AVX2", "float32"), ("avx512_core", "float32"), ("AVX512_CORE_BF16", "mixed_bfloat16"),
    ("AVX512_CORE_AMX", "mixed_bfloat16"), ("ALL", "mixed_bfloat16"),
])
def test_a_onednn_isa_cap_below_bfloat16_keeps_float32(monkeypatch, cap, policy):
    """Under ONEDNN_MAX_CPU_ISA=AVX2 (an AVX2 machine's round-off reproduced)
    a bfloat16 matmul has no oneDNN kernel and the process aborts."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    chosen = choose(flags=frozenset({"avx2", "avx512f", "avx512_bf16"}), gpus=[])
    assert chosen.policy == policy
    assert ("ONEDNN_MAX_CPU_ISA" in chosen.reason) == (policy == "float32")


@pytest.mark.parametrize("gpus,policy", [
    ([("NVIDIA A100", (8, 0))], "mixed_bfloat16"),
    ([("NVIDIA H100", (9, 0)), ("NVIDIA L4", (8, 9))], "mixed_bfloat16"),
    ([("Tesla V100", (7, 0))], "float32"),
    ([("NVIDIA A100", (8, 0)), ("Tesla T4", (7, 5))], "float32"),  # the weakest decides
])
def test_gpu_choice_follows_compute_capability(gpus, policy):
    chosen = choose(flags=frozenset({"avx512_bf16"}), gpus=gpus)
    assert chosen.policy == policy and chosen.jit_compile is True


def test_tpu_gets_bfloat16_and_xla():
    tpu_strategy = object.__new__(tf.distribute.TPUStrategy)  # no TPU needed for isinstance
    chosen = choose(tpu_strategy, flags=frozenset(), gpus=[])
    assert (chosen.policy, chosen.jit_compile) == ("mixed_bfloat16", True)


def test_no_xla_under_a_strategy_over_several_devices(tmp_path):
    """Keras compiles the whole step, the strategy's `run` inside, as one XLA
    program: under `MirroredStrategy` over two devices (two GPUs; here two
    logical CPUs) it read the second replica's variables from the first
    device and `fit` failed with a traceback ("Trying to access resource").
    "auto" leaves XLA off there (on for one device), and asking for it is
    one error."""
    from training.strategy import mirrored_strategy
    gpus, flags = [("NVIDIA H200", (9, 0))], frozenset()
    two, one = mirrored_strategy(["/cpu:0", "/cpu:1"]), mirrored_strategy(["/cpu:0"])
    chosen = choose(two, flags=flags, gpus=gpus)
    assert (chosen.policy, chosen.jit_compile) == ("mixed_bfloat16", False)
    assert "no XLA: its replicas are on 2 devices" in chosen.reason
    for strategy in (one, tf.distribute.OneDeviceStrategy("/cpu:1"), None):
        assert choose(strategy, flags=flags, gpus=gpus).jit_compile is True
    assert precision.xla_spans_devices(two) and not precision.xla_spans_devices(one)
    with pytest.raises(TxlError, match=r"^--jit_compile under MirroredStrategy: its replicas "
                                       r"are on 2 devices"):
        resolve("none", True, two)
    assert resolve("none", None, two).jit_compile is False  # auto on a CPU: off anyway
    with two.scope():
        model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=2)
    with pytest.raises(TxlError, match=r"^jit_compile=True under MirroredStrategy"):
        model.compile(optimizer="adam", jit_compile=True)
    model.compile(optimizer="adam")
    assert model.jit_compile is False
    # Saved where "auto" meant XLA (Keras saves the value): load_model raised the error above.
    saved = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=2)
    saved.compile(optimizer="adam", jit_compile=True)
    saved.optimizer.build(saved.trainable_variables)  # as after fit: its slots are saved
    saved.save(tmp_path / "xla.keras")
    with two.scope():
        assert keras.models.load_model(tmp_path / "xla.keras").jit_compile is False


def test_explicit_settings_win_and_say_so(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # a cap refuses bfloat16 (below)
    auto = choose()
    assert resolve("auto", None) == auto
    forced = resolve("none", True)
    assert (forced.policy, forced.jit_compile) == ("float32", True)
    assert "set explicitly" in forced.reason and auto.policy in forced.reason
    assert resolve("mixed_bfloat16", None).jit_compile == auto.jit_compile


def test_explicit_bfloat16_where_onednn_has_no_kernel_is_refused(monkeypatch):
    """`--mixed_precision=mixed_bfloat16` under ONEDNN_MAX_CPU_ISA=AVX2 on a
    CPU with AVX512-BF16 aborted the process in its first matmul (exit -6)."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    monkeypatch.setattr(precision, "_gpu_capabilities", lambda: [])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    for policy in ("mixed_bfloat16", "bfloat16"):
        with pytest.raises(TxlError, match=rf"^--mixed_precision={policy}: CPU with AVX512_BF16, "
                                           r"but ONEDNN_MAX_CPU_ISA=AVX2 leaves oneDNN no "
                                           r"bfloat16 dot products, .* use --mixed_precision="
                                           r"auto or none \(float32\)"):
            resolve(policy, None)
    assert resolve("none", None).policy == resolve("auto", True).policy == "float32"
    # Where it runs: a cap at bfloat16, oneDNN off, a GPU, no native bfloat16 (emulated).
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16"),
                        ("TF_ENABLE_ONEDNN_OPTS", "0")):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            assert resolve("mixed_bfloat16", None).policy == "mixed_bfloat16"
    with monkeypatch.context() as patch:
        patch.setattr(precision, "_gpu_capabilities", lambda: [("NVIDIA A100", (8, 0))])
        assert resolve("mixed_bfloat16", None).policy == "mixed_bfloat16"
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    assert resolve("mixed_bfloat16", None).policy == "mixed_bfloat16"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512_bf16\nbugs\t: none\n")
    assert cpu_flags(str(path)) == {"fpu", "sse2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


@pytest.mark.parametrize("flags,policy", [({"avx512_bf16"}, "mixed_bfloat16"),
                                          (set(), "float32")])
def test_model_auto_dtype_and_compile_follow_the_choice(monkeypatch, flags, policy):
    # The CPU this runs on is replaced by one with / without native bfloat16.
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision, "_gpu_capabilities", lambda: [])
    model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=2, dtype="auto")
    assert model.dtype_policy.name == policy
    assert model.core.blocks[0].rel_attn.dtype_policy.name == policy
    model.compile(optimizer="adam")
    assert model.jit_compile is False
    model.compile(optimizer="adam", jit_compile=True)
    assert model.jit_compile is True
    monkeypatch.setattr(precision, "_gpu_capabilities", lambda: [("NVIDIA A100", (8, 0))])
    model.compile(optimizer="adam")
    assert model.jit_compile is True


def markov_streams(n_streams, length, seed):
    """Token t+1 = 3 * token t + 1 or + 2 (mod 64): one bit of entropy a token."""
    rng = np.random.default_rng(seed)
    x = np.empty((n_streams, length), np.int32)
    x[:, 0] = rng.integers(0, 64, n_streams)
    for t in range(1, length):
        x[:, t] = (3 * x[:, t - 1] + 1 + rng.integers(0, 2, n_streams)) % 64
    return x


@needs_bfloat16_matmuls
def test_bfloat16_training_stays_within_2_percent_of_float32():
    """The same initial weights and batches, trained in float32 and in
    mixed_bfloat16: log-probs agree closely before training and the held-out
    loss after 150 steps is within 2%, while both learned (the bar would be
    met trivially by two untrained models)."""
    T, B, steps = 16, 8, 150
    cfg = TransformerXLConfig.preset("tiny", dropout=0.0, tgt_len=T, mem_len=T)
    train = markov_streams(B, steps * T + 1, seed=1)
    held_out = markov_streams(B, 8 * T + 1, seed=2)

    def batches(streams, n):
        xs = np.stack([streams[:, s * T:(s + 1) * T] for s in range(n)])
        ys = np.stack([streams[:, s * T + 1:(s + 1) * T + 1] for s in range(n)])
        return tf.data.Dataset.from_tensor_slices((xs, ys))

    keras.utils.set_random_seed(5)
    initial = None
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        model = TransformerXLLM(cfg, batch_size=B, dtype=policy)
        if initial is None:
            initial = [w.numpy() for w in model.core.weights]
        else:
            for w, value in zip(model.core.weights, initial):
                w.assign(value)
        first = model(held_out[:, :T]).numpy()
        model.reset_memory()
        model.compile(optimizer=keras.optimizers.Adam(5e-3), jit_compile=False)
        model.fit(batches(train, steps), epochs=1, verbose=0)
        held = model.evaluate(batches(held_out, 8), verbose=0, return_dict=True)["loss"]
        results[policy] = (first, held)

    (first32, held32), (first16, held16) = results["float32"], results["mixed_bfloat16"]
    assert first16.dtype == np.float32
    assert np.abs(first16 - first32).mean() < 0.01  # bfloat16 has an 8-bit mantissa
    assert held32 < 1.5, "float32 did not learn: the comparison says nothing"
    assert abs(held16 - held32) / held32 < 0.02, (held16, held32)
