"""Every op of the graphs we run on a GPU finds a GPU kernel, checked on the
CPU from TensorFlow's kernel registry (`gpu_kernels`): the XLA-compiled
train steps against `XLA_GPU_JIT` (and `XLA_CPU_JIT`, which compiles them
here), and the graphs TensorFlow runs without XLA (the SavedModel's
signatures, the non-XLA train step, the evaluation scorer, the non-XLA
decoder) against `GPU`, with the per-token tensors that would cross the bus
from the GPU to the host at each call. Traced, not run (but the decoder's)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import gpu_kernels as gk
from txl_tf import (ReplicaClippedAdam, TransformerXL, TransformerXLClassifier,
                    TransformerXLConfig, TransformerXLLM, WarmupCosineDecay)
from txl_tf.models.transformer_xl import TransformerXLBackbone, TransformerXLCausalLM

T = 8
SOFTMAX = {1: dict(cutoffs=[60, 120, 200], div_val=1, d_embed=24),  # one table, projected
           2: dict(cutoffs=[60, 120, 200], div_val=2)}


@pytest.fixture(scope="module", autouse=True)
def xla_kernels():
    gk.register_xla_kernels()


def _tiny(**overrides):
    return TransformerXLConfig.preset("tiny", dropout=0.1, dropatt=0.1, tgt_len=T, mem_len=T,
                                      **overrides)


def _stream_batches(rows=2, steps=2):
    ids = np.zeros((steps, rows, T), np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, ids))


def _lm_train_step(policy, jit_compile, div_val=2):
    """`training/train.py`'s train step: `TransformerXLLM` under `policy`,
    `ReplicaClippedAdam` with a clip and `WarmupCosineDecay`."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = TransformerXLLM(_tiny(**SOFTMAX[div_val]), batch_size=2)
        optimizer = ReplicaClippedAdam(WarmupCosineDecay(1e-3, 100, 10, 0.1),
                                       global_clipnorm=0.25)
        model.compile(optimizer=optimizer, jit_compile=jit_compile)
    finally:
        keras.config.set_dtype_policy(previous)
    data = _stream_batches()
    model._prepare_streams(data, None, "fit")  # what its `fit` does first
    return model, gk.keras_step(model, data)


def _check_xla(found, least):
    """The sites XLA compiles: at least `least`, each with a kernel on both
    XLA devices. Returns the compiled sites."""
    compiled = [s for s in found if s.compiled]
    assert len(compiled) >= least, len(compiled)
    assert not gk.missing(compiled, gk.XLA_CPU), "the walk reached what XLA does not compile"
    gpu = gk.missing(compiled, gk.XLA_GPU)
    assert not gpu, [f"{s.function}: {s.node.name} {s.describe()}" for s in gpu]
    return compiled


@pytest.mark.parametrize("policy, div_val", [("float32", 1), ("float32", 2),
                                             ("mixed_bfloat16", 2), ("mixed_float16", 1)])
def test_the_xla_train_step_has_xla_gpu_kernels(policy, div_val):
    model, step = _lm_train_step(policy, True, div_val)
    found = gk.sites(step)
    # Keras's loop over the iterator is TensorFlow's; the step in it, XLA's.
    assert "IteratorGetNext" in {s.op for s in found if not s.compiled}
    compiled = _check_xla(found, 2000)
    ops = gk.summary(compiled)
    # The adaptive softmax's XLA path (layers/tail_nll.py): a loop for each
    # of the 3 tail bins, and one in its custom gradient.
    assert sum(n for op, n in ops.items() if op.startswith("StatelessWhile")) == 6, ops
    compute = {"float32": "float32", "mixed_bfloat16": "bfloat16",
               "mixed_float16": "float16"}[policy]
    assert any(op.startswith("BatchMatMulV2{T=" + compute) for op in ops), ops
    if policy == "mixed_float16":  # Keras's loss scaling, in the compiled step
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert any(op.startswith("IsFinite{T=float16") or op.startswith("IsFinite{T=float32")
                   for op in ops), ops


def test_the_causal_lm_and_classifier_xla_steps_have_xla_gpu_kernels():
    cfg = TransformerXLConfig.preset("tiny", n_token=50, mem_len=8, tgt_len=4)
    lm = TransformerXLCausalLM(TransformerXLBackbone(**cfg.to_dict()))
    lm.compile(optimizer=keras.optimizers.Adam(1e-3), jit_compile=True)
    x = {"token_ids": np.zeros((4, 12), np.int32), "padding_mask": np.ones((4, 12), bool)}
    data = tf.data.Dataset.from_tensor_slices(
        (x, x["token_ids"], np.ones((4, 12), np.float32))).batch(2, drop_remainder=True)
    assert lm.jit_compile is True
    _check_xla(gk.sites(gk.keras_step(lm, data)), 1000)

    # training/classify.py's compile
    config = TransformerXLConfig(n_token=16, n_layer=2, d_model=32, n_head=2, d_head=16,
                                 d_inner=64, dropout=0.1, tgt_len=T, mem_len=16)
    classifier = TransformerXLClassifier(config, 2, segment_len=T, mem_len=16)
    classifier.compile(ReplicaClippedAdam(WarmupCosineDecay(1e-3, 10, 1, 0.0),
                                          global_clipnorm=0.25),
                       keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       metrics=["accuracy"], jit_compile=True)
    x = {"token_ids": np.zeros((4, 3 * T), np.int32), "lengths": np.full((4,), 20, np.int32)}
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(4, np.int32))).batch(
        2, drop_remainder=True)
    assert classifier.jit_compile is True
    _check_xla(gk.sites(gk.keras_step(classifier, data)), 1000)


# Tensors larger than a shape vector that go from the GPU to the host at each
# call, left as they are: `(node name's last part, op{types})`.
KNOWN_TO_HOST = {
    # The decoder's result, the ids `[B, n]` it made: read once per call.
    ("Identity", "Identity{T=int32}"),
}


def _tf_graph_problems(found, what):
    """What keeps a graph TensorFlow runs (no site compiled) off the GPU:
    a site without a GPU kernel but a string constant (an assertion's
    message: strings live on the host), or a tensor larger than a shape
    vector read back from the GPU to the host (the call waits for it)."""
    assert found and not any(s.compiled for s in found), what
    problems = [f"{what}: no GPU kernel: {s.node.name} {s.describe()} {s.inputs}"
                for s in gk.missing(found, gk.GPU)
                if not (s.op == "Const" and s.node.attr["dtype"].type == tf.string)]
    to_host = {(s.node.name.split("/")[-1], s.describe(), shape)
               for s, _, _, shape, way in gk.crossings(found)
               if way == "to host" and gk.is_large(shape)}
    return problems + sorted(f"{what}: to the host: {name} {op} {shape}"
                             for name, op, shape in to_host if (name, op) not in KNOWN_TO_HOST)


def _copies_to_gpu(found, scope):
    """The tensors larger than a shape vector that the host copies to the GPU
    in the layer named `scope`."""
    return [f"{s.function}: to the GPU: {s.node.name} {s.describe()} {shape}"
            for s, _, _, shape, way in gk.crossings(found)
            if way == "to device" and gk.is_large(shape) and scope in s.node.name]


def _ring_coordinates_to_gpu(found, what):
    """The ring's gathers in time order whose coordinates `[B, ..., M, axes]`
    the host copies to the GPU (they must be made there)."""
    return [f"{what}: to the GPU: {s.node.name} {s.describe()} {shape}"
            for s, _, _, shape, way in gk.crossings(found)
            if way == "to device" and gk.is_large(shape) and s.op == "GatherNd"]


def test_the_non_xla_train_step_and_evaluation_run_on_the_gpu():
    from txl_tf.learning.evaluation import make_scorer
    model, step = _lm_train_step("float32", False)
    ids = tf.TensorSpec([2, T], tf.int32)
    scorer = make_scorer(model.core).get_concrete_function(ids, ids, model.core.initial_memory(2))
    problems = []
    for what, found in (("train step", gk.sites(step)), ("scorer", gk.sites(scorer))):
        problems += _tf_graph_problems(found, what)
        # The ids and the targets go to the GPU once each (not each bin's
        # masks and indices: the adaptive input's and softmax's 4 bins).
        for layer in ("adaptive_embed", "adaptive_softmax"):
            problems += _copies_to_gpu(found, layer)[1:]
    assert not problems



def test_the_saved_model_signatures_run_on_the_gpu(tmp_path):
    from export.job import run_export
    from txl_tf.weights import save_pretrained
    core = TransformerXL(_tiny(**SOFTMAX[2]))
    save_pretrained(core, str(tmp_path / "model"))
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=("saved_model",),
               verify=False)
    signatures = tf.saved_model.load(str(tmp_path / "out" / "saved_model")).signatures
    assert {"step", "score", "initial_memory", "decode_step", "decode_read"} <= set(signatures)
    problems = []
    for name, function in signatures.items():
        found = gk.sites(function)
        problems += _tf_graph_problems(found, name)
        # The ids go to the GPU once, not each bin's mask and indices (4 bins).
        problems += _copies_to_gpu(found, "adaptive_embed")[1:]
        problems += _ring_coordinates_to_gpu(found, name)  # `decode_read`, `decode_memory`
    assert not problems



def test_the_decoder_runs_on_the_gpu():
    """The decoder without XLA on TensorFlow's GPU kernels (its sampler
    included: top-k, top-p, the repetition penalty), and with XLA (the
    default) on XLA's."""
    from txl_tf import Decoder
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=50, mem_len=8, tgt_len=4))
    decoder = Decoder(core, jit_compile=False)
    first = decoder.generate([[1, 2, 3], [4, 5]], 4, seed=1, temperature=1.0, top_k=5,
                             top_p=0.9, repetition_penalty=1.2, stop_ids=[7])
    decoder.generate([[5, 5], [6]], 2, resume=first.state)  # a next turn: `_read_cached`
    decoder.generate([[1, 2], [3]], 2, memory=first.memory)  # a memory with slots: `_last`
    found, compiled = [], []
    xla = Decoder(core)  # the default: the decode loop XLA-compiled, traced here
    for name in ("_last", "_first", "_decode", "_project", "_position_keys", "_read_cached"):
        traced = gk.concrete_functions(getattr(decoder, name))
        assert traced, f"{name} was not traced: nothing of it checked"
        for function in traced:
            found += gk.sites(function)
            if name not in ("_last", "_read_cached"):  # never compiled
                args, kwargs = function.structured_input_signature
                twin = getattr(getattr(xla, name), "function")
                compiled += gk.sites(twin.get_concrete_function(*args, **kwargs), compiled=True)
    assert not _tf_graph_problems(found, "decoder") + _ring_coordinates_to_gpu(found, "decoder")
    _check_xla(compiled, 1000)


def test_the_samplers_index_math_is_int64_in_tensorflow_and_int32_under_xla():
    """The sampler's maxima over ids `[B, V]` (greedy's, the last allowed id)
    are int64 in TensorFlow's graphs (a GPU's int32 math is the host's) and
    int32 under XLA, which keeps int32 on the device and reads half the
    bytes (review36: XLA's int64 made the CPU's greedy pick slower at batch
    16), with the same ids."""
    from txl_tf.generation.sampling import sample_next
    batch, vocab = 3, 50
    specs = [tf.TensorSpec([batch, vocab]), tf.TensorSpec([batch, vocab], tf.bool)] + [
        tf.TensorSpec([batch], dtype) for dtype in (tf.int64, tf.int64, tf.float32, tf.int32,
                                                    tf.float32, tf.float32)]
    maxima = {}
    for jit in (False, True):
        found = gk.sites(tf.function(sample_next, jit_compile=jit).get_concrete_function(*specs),
                         compiled=jit)
        maxima[jit] = [s.inputs[0][0] for s in found if s.op == "Max"
                       and s.inputs[0][1] == (batch, vocab) and "int" in s.inputs[0][0]]
    assert maxima == {False: ["int64"] * 2, True: ["int32"] * 2}, maxima
    lp = np.log(np.random.default_rng(0).dirichlet(np.ones(vocab), batch)).astype(np.float32)
    lp[1, 7] = lp[1, 3] = lp[1].max() + 1  # a tie: the lowest id
    lp[2] = -np.inf
    args = (lp, np.zeros((batch, vocab), bool), np.arange(batch), np.zeros(batch, np.int64))
    for temperature, top_k, top_p in ((0.0, 0, 1.0), (1.0, 5, 0.9)):
        rows = (np.full(batch, temperature, np.float32), np.full(batch, top_k, np.int32),
                np.full(batch, top_p, np.float32), np.ones(batch, np.float32))
        ids = [tf.function(sample_next, jit_compile=jit)(*args, *rows).numpy()
               for jit in (False, True)]
        np.testing.assert_array_equal(ids[0], ids[1])
        if not temperature:
            assert ids[0].tolist()[1:] == [3, 0]


# The check catches what it is for: planted cases, real ops of the registry.
def test_an_op_xla_compiles_on_a_cpu_but_not_a_gpu_is_found_deep_in_the_functions():
    """`Conv2D` of int32 has an `XLA_CPU_JIT` kernel and no `XLA_GPU_JIT`
    one: found in a while loop's body in a custom gradient's function in a
    nested `tf.function`, under the `jit_compile=True` of the outer one."""
    @tf.function
    def inner(x):
        @tf.custom_gradient
        def f(x):
            def body(i, y):
                c = tf.nn.conv2d(tf.cast(y, tf.int32), tf.ones([1, 1, 1, 1], tf.int32), 1, "VALID")
                return i + 1, y + tf.cast(c, tf.float32)
            return tf.while_loop(lambda i, y: i < 2, body, (0, x))[1], lambda g: g
        return f(x)

    outer = tf.function(lambda x: inner(x) * 2.0, jit_compile=True)
    found = gk.sites(outer.get_concrete_function(tf.TensorSpec([1, 2, 2, 1])), compiled=True)
    assert all(s.compiled for s in found) and not gk.missing(found, gk.XLA_CPU)
    (site,) = gk.missing(found, gk.XLA_GPU)
    assert site.describe() == "Conv2D{T=int32}" and site.function.startswith("while_body")
    with pytest.raises(AssertionError, match="Conv2D"):
        _check_xla(found, 1)
    # Not compiled, the same graph is TensorFlow's: nothing is XLA's.
    assert not any(s.compiled for s in gk.sites(outer.get_concrete_function(
        tf.TensorSpec([1, 2, 2, 1]))))


def test_an_op_without_a_gpu_kernel_and_a_per_token_read_back_are_found():
    """`GatherNd` of bool has no GPU kernel (it runs on the CPU, its input
    copied to the host); int32 arithmetic on a tensor the GPU made reads it
    back (TensorFlow keeps int32 math of a GPU in host memory)."""
    def graph(x, mask):
        return tf.gather_nd(mask, [[0], [1]]), tf.cast(x * 2.0, tf.int32) + 1

    function = tf.function(graph).get_concrete_function(tf.TensorSpec([4, T]),
                                                        tf.TensorSpec([4, T], tf.bool))
    found = gk.sites(function)
    assert [s.describe() for s in gk.missing(found, gk.GPU)] == [
        "GatherNd{Tindices=int32,Tparams=bool}"]
    problems = _tf_graph_problems(found, "planted")
    assert problems == ["planted: no GPU kernel: GatherNd GatherNd{Tindices=int32,Tparams=bool} "
                        f"(('bool', (4, {T})), ('int32', (2, 1)))",
                        f"planted: to the host: GatherNd GatherNd{{Tindices=int32,Tparams=bool}} "
                        f"(4, {T})",
                        f"planted: to the host: add AddV2{{T=int32}} (4, {T})"], problems


def test_private_names_that_moved_are_one_clear_failure():
    """The walk reads TensorFlow's and Keras's private state: where it moved,
    an AssertionError that says what (not a silent walk of nothing, nor a
    KeyError) (review36)."""
    function = tf.function(lambda x: tf.function(lambda y: y * 2.0)(x) + 1.0)
    concrete = function.get_concrete_function(tf.TensorSpec([2]))
    assert any(s.op == "Mul" for s in gk.sites(concrete))  # the nested call's body
    del concrete.graph._functions
    with pytest.raises(AssertionError, match=r"has no `_functions`"):
        gk.sites(concrete)

    class Model:
        def make_train_function(self):
            self.train_function = lambda data: data
    with pytest.raises(AssertionError, match=r"keeps no `multi_step_on_iterator`"):
        gk.keras_step(Model(), tf.data.Dataset.range(2))
