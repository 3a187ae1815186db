"""The pure core: exact against the paper's math, segments == one pass, memory facts, errors."""
import re
import keras
import numpy as np
import pytest
import tensorflow as tf
from reference_numpy import forward as reference_forward

from txl_tf import ConfigError, InputError, Memory, TransformerXL, TransformerXLConfig
from txl_tf.layers.masks import attention_visibility
from txl_tf.weights.checkpoints import get_weights

VARIANTS = {
    "plain": dict(),
    "adaptive": dict(cutoffs=[60, 150], div_val=2, d_embed=32),
    "adaptive_div1": dict(cutoffs=[60, 150], div_val=1, d_embed=24),
    "untied_r_same_length_clamp": dict(untie_r=True, same_length=True, clamp_len=6),
    "pre_lnorm_untied_outputs": dict(pre_lnorm=True, cutoffs=[60], tie_weight=False,
                                     tie_projs=[False, False], d_embed=16,
                                     layer_norm_epsilon=1e-5),
}


def make_core(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    cfg = TransformerXLConfig.preset("tiny", dropout=0.0, **overrides)
    core = TransformerXL(cfg)
    rng = np.random.default_rng(seed)
    for var in core.weights:  # non-trivial LayerNorms, biases and clusters
        if "gamma" in var.path or "beta" in var.path or "bias" in var.path or "_b" in var.path \
                or "cluster" in var.path:
            var.assign(rng.normal(0, 0.3, var.shape).astype(np.float32) + (
                1.0 if "gamma" in var.path else 0.0))
    return core


def ids(batch, length, seed=1, n_token=256):
    return np.random.default_rng(seed).integers(0, n_token, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_matches_numpy_transcription_of_the_paper_code_with_zero_memory(name):
    core = make_core(**VARIANTS[name])
    cfg, weights = core.config, get_weights(core)
    x1, x2 = ids(2, 5, 1), ids(2, 5, 2)
    zero = [np.zeros((cfg.mem_len, 2, cfg.d_model))] * cfg.n_layer
    ref1, ref_mems = reference_forward(weights, cfg, x1.T, zero)
    ref2, _ = reference_forward(weights, cfg, x2.T, ref_mems)
    memory = core.initial_memory(2, zero_filled=True)
    out1, memory = core(x1, memory)
    out2, _ = core(x2, memory)
    np.testing.assert_allclose(out1.numpy(), ref1.transpose(1, 0, 2), atol=2e-5)
    np.testing.assert_allclose(out2.numpy(), ref2.transpose(1, 0, 2), atol=2e-5)


@pytest.mark.parametrize("name", ["plain", "untied_r_same_length_clamp"])
def test_empty_memory_is_exactly_no_history_and_differs_from_zero_filled(name):
    core = make_core(**VARIANTS[name])
    weights, x = get_weights(core), ids(2, 6)
    # same_length keeps a window of M + 1 keys (M = memory slots, 8 here): a
    # 6-token segment never reaches its edge, so with no history every query
    # sees all earlier tokens, as in the paper's code without same_length.
    cfg = core.config.replace(same_length=False)
    no_history, _ = reference_forward(weights, cfg, x.T, None)
    empty, _ = core(x, core.initial_memory(2, mem_len=8))
    np.testing.assert_allclose(empty.numpy(), no_history.transpose(1, 0, 2), atol=2e-5)
    zero_filled, _ = core(x, core.initial_memory(2, mem_len=8, zero_filled=True))
    assert np.abs(zero_filled.numpy() - empty.numpy()).max() > 1e-3


@pytest.mark.parametrize("name", ["plain", "adaptive"])
def test_three_segments_with_memory_equal_one_long_pass(name):
    core = make_core(**VARIANTS[name])
    seg, x = 5, ids(3, 15)
    full, _ = core(x, core.initial_memory(3, mem_len=0))
    memory = core.initial_memory(3, mem_len=2 * seg + 3)
    parts = []
    for start in range(0, 15, seg):
        out, memory = core(x[:, start:start + seg], memory)
        parts.append(out.numpy())
    assert np.abs(np.concatenate(parts, 1) - full.numpy()).max() <= 1e-5


def test_token_by_token_decoding_equals_batch_pass():
    core = make_core(**VARIANTS["adaptive"])
    x = ids(2, 9)
    full, _ = core(x, core.initial_memory(2, mem_len=0))
    memory = core.initial_memory(2, mem_len=9)
    step = tf.function(lambda t, m: core(t, m))
    outs = []
    for t in range(9):
        out, memory = step(x[:, t:t + 1], memory)
        outs.append(out.numpy())
    assert np.abs(np.concatenate(outs, 1) - full.numpy()).max() <= 1e-5


def test_memory_holds_exactly_the_last_m_layer_inputs():
    core = make_core()
    x = ids(2, 7)
    memory = core.initial_memory(2, mem_len=4)
    _, new = core(x, memory)
    # Layer inputs: embedding output for layer 0, block 0's output for layer 1.
    emb = core.word_emb(tf.constant(x))
    visible = attention_visibility(7, memory.mem_mask)
    pos = core.pos_emb(tf.constant(11))
    h1 = core.blocks[0](emb, pos, memory.mems[0], visible, core.r_w_bias, core.r_r_bias)
    np.testing.assert_allclose(new.mems[0].numpy(), emb.numpy()[:, -4:], atol=1e-6)
    np.testing.assert_allclose(new.mems[1].numpy(), h1.numpy()[:, -4:], atol=1e-5)
    assert new.mem_mask.numpy().all()
    # A segment shorter than the memory shifts the old states left.
    _, newer = core(x[:, :2], new)
    np.testing.assert_array_equal(newer.mems[:, :, :2].numpy(), new.mems[:, :, 2:].numpy())


def test_memory_validity_grows_from_empty():
    core = make_core()
    memory = core.initial_memory(1, mem_len=5)
    _, memory = core(ids(1, 3), memory)
    np.testing.assert_array_equal(memory.mem_mask.numpy(), [[False, False, True, True, True]])
    _, zero = core(ids(1, 3), core.initial_memory(1, mem_len=0))
    assert zero.mems.shape == (2, 1, 0, 32) and zero.mem_mask.shape == (1, 0)


def test_no_gradient_flows_into_memory():
    core = make_core()
    memory = core.initial_memory(2, mem_len=4)
    _, memory = core(ids(2, 4), memory)
    states = tf.Variable(memory.mems)
    with tf.GradientTape(persistent=True) as tape:
        nll, new = core(ids(2, 4, 3), Memory(states, memory.mem_mask), targets=ids(2, 4, 4))
        loss = tf.reduce_sum(nll)
        carried = tf.reduce_sum(new.mems)
    assert tape.gradient(loss, states) is not None  # memory is read...
    assert tape.gradient(carried, core.trainable_weights[2]) is None  # ...new memory is cut
    grads = tape.gradient(carried, core.trainable_weights)
    assert all(g is None for g in grads)


def test_nll_equals_gathered_log_probs():
    core = make_core(**VARIANTS["adaptive"])
    x, y = ids(2, 6), ids(2, 6, 9)
    memory = core.initial_memory(2)
    log_probs, m1 = core(x, memory)
    nll, m2 = core(x, memory, targets=y)
    np.testing.assert_allclose(nll.numpy(), -tf.gather(log_probs, y, batch_dims=2).numpy(),
                               atol=1e-5)
    np.testing.assert_array_equal(m1.mems.numpy(), m2.mems.numpy())


def test_keras_file_round_trip_keeps_outputs(tmp_path):
    core = make_core(**VARIANTS["adaptive"])
    clone = TransformerXL.from_config(core.get_config())
    assert clone.config == core.config
    x = ids(2, 5)
    path = str(tmp_path / "m.keras")
    model = keras.Sequential([keras.layers.InputLayer((5,), batch_size=2, dtype="int32"),
                              _CoreWrapper(core)])
    before = model(x).numpy()
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(x).numpy(), before)


@keras.saving.register_keras_serializable(package="txl_tf_tests")
class _CoreWrapper(keras.layers.Layer):
    """Log-probs with an empty memory: lets a Sequential model hold the core."""

    def __init__(self, core, **kwargs):
        super().__init__(**kwargs)
        self.core = core

    def call(self, token_ids):
        return self.core(token_ids, self.core.initial_memory(2))[0]

    def get_config(self):
        return {**super().get_config(),
                "core": keras.saving.serialize_keras_object(self.core)}

    @classmethod
    def from_config(cls, config):
        core = keras.saving.deserialize_keras_object(config.pop("core"))
        return cls(core, **config)


def _sub_layers(layer):
    """Every layer in a public attribute (or list attribute) of `layer`, recursively."""
    for name, value in vars(layer).items():
        if name.startswith("_"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, keras.layers.Layer):
                yield item
                yield from _sub_layers(item)


def test_every_sub_layer_is_built_at_construction():
    core = TransformerXL(TransformerXLConfig.preset("tiny", cutoffs=[100], div_val=2))
    layers = list(_sub_layers(core))
    assert {type(layer).__name__ for layer in layers} >= {
        "RelativePositionalEncoding", "Dropout", "TransformerXLBlock", "AdaptiveLogSoftmax"}
    assert [layer.name for layer in layers if not layer.built] == []


@pytest.mark.parametrize("bad,message", [(256, "token id 256"), (-1, "token id -1")])
def test_out_of_range_ids_name_the_id_and_vocabulary(bad, message):
    core = make_core()
    x = ids(2, 4)
    x[1, 2] = bad
    with pytest.raises(InputError, match=message) as err:
        core(x, core.initial_memory(2))
    assert "256 tokens" in str(err.value)


def test_out_of_range_ids_fail_in_graph_mode_too():
    core = make_core()
    run = tf.function(lambda x, m: core(x, m))
    x = ids(1, 3)
    x[0, 0] = 999
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        run(x, core.initial_memory(1))


@pytest.mark.parametrize("bad", [256, -1])
def test_out_of_range_targets_are_named_as_targets(bad):
    core = make_core()
    y = ids(2, 4, seed=2)
    y[0, 3] = bad
    with pytest.raises(InputError, match=f"target id {bad} at position \\(0, 3\\)"):
        core(ids(2, 4), core.initial_memory(2), targets=y)
    run = tf.function(lambda x, t, m: core(x, m, targets=t))
    with pytest.raises(tf.errors.InvalidArgumentError, match="targets .*out of range"):
        run(ids(2, 4), y, core.initial_memory(2))


@pytest.mark.parametrize("graph", [False, True])
def test_empty_segments_and_mismatched_targets_are_named(graph):
    core = make_core()
    def run(x, m, t):
        return core(x, m, targets=t)
    run = tf.function(run) if graph else run
    memory, x = core.initial_memory(2), ids(2, 4)
    with pytest.raises(InputError, match=r"token_ids is empty \(shape \(2, 0\)\)"):
        run(x[:, :0], memory, None)
    with pytest.raises(InputError, match=r"targets is empty"):
        run(x, memory, x[:, :0])
    with pytest.raises(InputError, match=r"targets have shape \(2, 3\) but token_ids have "
                                         r"shape \(2, 4\)"):
        run(x, memory, x[:, :3])
    with pytest.raises(InputError, match=r"targets have shape \(1, 4\)"):
        run(x, memory, x[:1])


def test_mismatched_targets_fail_in_graph_with_dynamic_shapes():
    core = make_core()
    spec = tf.TensorSpec([None, None], tf.int32)
    run = tf.function(lambda x, t: core(x, core.initial_memory(2), targets=t),
                      input_signature=[spec, spec])
    with pytest.raises(tf.errors.InvalidArgumentError, match="targets must have the shape"):
        run(ids(2, 4), ids(2, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="targets empty or out of range"):
        run(ids(2, 0), ids(2, 0))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_memory_are_cast_to_float32(dtype):
    core = make_core()
    x = ids(2, 4)
    _, memory = core(x, core.initial_memory(2, mem_len=6))
    expected, new = core(x, memory)
    cast = Memory(memory.mems.numpy().astype(dtype), memory.mem_mask)
    got, new_cast = core(x, cast)
    assert new_cast.mems.dtype == tf.float32
    tolerance = 1e-2 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=tolerance)
    np.testing.assert_allclose(new_cast.mems.numpy(), new.mems.numpy(), atol=tolerance)
    run = tf.function(lambda x, m: core(x, m))
    assert run(x, cast)[1].mems.dtype == tf.float32


def test_bad_memory_shapes_are_named():
    core = make_core()
    x = ids(2, 3)
    good = core.initial_memory(2)
    with pytest.raises(InputError, match="rank 4"):
        core(x, Memory(good.mems[0], good.mem_mask))
    with pytest.raises(InputError, match="width 16"):
        core(x, Memory(tf.zeros([2, 2, 16, 16]), good.mem_mask))
    with pytest.raises(InputError, match="3 layers"):
        core(x, Memory(tf.zeros([3, 2, 16, 32]), good.mem_mask))
    with pytest.raises(InputError, match="batch 3"):
        core(ids(3, 3), good)
    with pytest.raises(InputError, match="must be integers"):
        core(x.astype(np.float32), good)
    with pytest.raises(InputError, match="bool"):
        core(x, Memory(good.mems, tf.cast(good.mem_mask, tf.float32)))


def test_inconsistent_config_is_named():
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match="cutoffs"):
        TransformerXLConfig(n_token=100, cutoffs=[50, 200])
    with pytest.raises(ConfigError, match="d_model"):
        TransformerXLConfig(n_token=100, d_model=0)
    with pytest.raises(ConfigError, match="tie_projs"):
        TransformerXLConfig(n_token=100, cutoffs=[50], tie_projs=[True])
    with pytest.raises(ConfigError, match="unknown preset 'gpt9'"):
        TransformerXLConfig.preset("gpt9")
    for fields, message in (
            (dict(d_model=33, d_embed=33),
             r"^d_model must be even \(sin and cos halves\), got 33$"),
            (dict(dropout="x"), r"^dropout must be a number, got 'x'$"),
            (dict(vocab_fingerprint=5), r"^vocab_fingerprint must be a string or None, got 5"),
            (dict(div_val=2), r"^div_val > 1 needs cutoffs \(a vocabulary split\)$"),
            (dict(d_embed=4, div_val=4, cutoffs=[5, 10]),
             r"^d_embed=4 // div_val=4\*\*2 leaves a bin with no embedding dimension")):
        with pytest.raises(ConfigError, match=message):
            TransformerXLConfig(n_token=100, **fields)
    from txl_tf.config import eval_settings
    with pytest.raises(ConfigError, match=r"^unknown preset 'gpt9'; known presets: \["):
        eval_settings("gpt9")


@pytest.mark.parametrize("fields, match", [
    # the keras-hub backbone's memory of mem_len slots wrapped to 4 (2**32 + 4) in its graph
    (dict(mem_len=2 ** 32 + 4), r"tgt_len \+ mem_len must be at most 2147483647 \(2\*\*31 - 1: "
                                r"TensorFlow counts a segment's keys in int32\), got 16 \+ "
                                r"4294967300"),
    (dict(mem_len=10 ** 10), r"got 16 \+ 10000000000"),
    (dict(tgt_len=2 ** 31 - 16), r"got 2147483632 \+ 16"),
    (dict(attn_type=1, max_klen=2 ** 31), r"max_klen is for attn_type 1 and 3, an integer in "
                                          r"\[1, 2147483647\]; got 2147483648"),
])
def test_lengths_an_int32_cannot_hold_are_refused_by_the_config(fields, match):
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match=match):
        TransformerXLConfig.preset("tiny", **fields)
    largest = TransformerXLConfig.preset("tiny", mem_len=2 ** 31 - 1 - 16)  # the limit holds
    assert largest.tgt_len + largest.mem_len == 2 ** 31 - 1


@pytest.mark.parametrize("field,value,match", [
    ("same_length", "no", "same_length must be a boolean"),  # a truthy string
    ("tie_weight", "false", "tie_weight must be a boolean"),
    ("tie_projs", ["false"], "tie_projs must be a list of booleans"),
    ("mem_len", True, "mem_len must be an integer"),
    ("clamp_len", "400", "clamp_len must be an integer"),
    ("dropout", "0.1", "dropout must be a number"),
    ("cutoffs", [50.5], "cutoffs must be a list of integers"),  # was cut to 50
    # NaN passed `<= 0` (a model of NaN outputs); inf a layer norm that outputs its bias
    ("init_std", float("nan"), r"init_std must be a finite number > 0, got nan"),
    ("proj_init_std", float("inf"), r"proj_init_std must be a finite number > 0, got inf"),
    ("layer_norm_epsilon", float("inf"), r"layer_norm_epsilon must be a finite number > 0"),
    ("layer_norm_epsilon", np.float32("nan"), r"layer_norm_epsilon must be a finite number"),
    # an int beyond a float: math.isfinite's OverflowError named nothing
    pytest.param("init_std", 2 ** 1024, r"init_std must be a finite number > 0, got 1797",
                 id="init_std-int-beyond-a-float"),
])
def test_config_values_of_the_wrong_type_are_named(field, value, match):
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match=match):
        TransformerXLConfig(n_token=100, **{field: value})


@pytest.mark.parametrize("value", [True, np.bool_(False), 0, 1, np.int64(1), 2, -1, "no", 1.0,
                                   None])
def test_the_config_takes_the_flags_the_shared_check_takes(value):
    """One definition of a flag (`numpy_checks.is_flag`); the config's is a ConfigError."""
    from txl_tf import ConfigError, TxlError
    from txl_tf.checks.numpy_checks import check_flag
    try:
        expected = check_flag("same_length", value)
    except TxlError as error:
        with pytest.raises(ConfigError, match=f"^{re.escape(str(error))}$"):
            TransformerXLConfig(n_token=100, same_length=value)
    else:
        assert TransformerXLConfig(n_token=100, same_length=value).same_length is expected
        assert TransformerXLConfig(n_token=100, cutoffs=[50],
                                   tie_projs=[value, value]).tie_projs == [expected] * 2


def test_unknown_or_missing_config_fields_are_config_errors():
    from txl_tf import ConfigError
    with pytest.raises(ConfigError, match=r"unknown config fields: \['n_layers'\]"):
        TransformerXLConfig.preset("tiny", n_layers=3)
    with pytest.raises(ConfigError, match=r"unknown config fields: \['n_layers'\]"):
        TransformerXLConfig(n_token=100).replace(n_layers=3)
    with pytest.raises(ConfigError, match="no n_token"):
        TransformerXLConfig.from_dict({"n_layer": 2})
    assert TransformerXLConfig(n_token=100, same_length=1, cutoffs=[np.int64(50)]).same_length \
        is True


def test_imports_a_checkpoint_written_with_the_paper_code_names(tmp_path):
    from txl_tf.weights.checkpoints import import_tf_checkpoint
    source = make_core(**VARIANTS["adaptive"])
    weights = get_weights(source)
    variables = {name: tf.Variable(value) for name, value in weights.items()}
    variables["transformer/layer_0/rel_attn/qkv/kernel/Adam"] = tf.Variable(
        np.zeros_like(weights["transformer/layer_0/rel_attn/qkv/kernel"]))
    variables["global_step"] = tf.Variable(7, dtype=tf.int64)
    prefix = tf.compat.v1.train.Saver(var_list=variables).save(None, str(tmp_path / "model.ckpt"))
    core = import_tf_checkpoint(prefix, source.config)
    assert core.config.zero_filled_memory and core.initial_memory(1).mem_mask.numpy().all()
    x = ids(2, 5)
    ref, _ = reference_forward(weights, source.config, x.T,
                               [np.zeros((source.config.mem_len, 2, 32))] * 2)
    np.testing.assert_allclose(core(x, core.initial_memory(2))[0].numpy(),
                               ref.transpose(1, 0, 2), atol=2e-5)
    with pytest.raises(ValueError, match="lacks .* weights"):
        import_tf_checkpoint(prefix, source.config.replace(n_layer=3))
    with pytest.raises(FileNotFoundError, match="no TF checkpoint"):
        import_tf_checkpoint(str(tmp_path / "nothing"), source.config)
    with pytest.raises(ValueError, match="is not a TF checkpoint"):
        import_tf_checkpoint(prefix + ".data-00000-of-00001", source.config)
    (data,) = tmp_path.glob("model.ckpt.data-*")
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 10])
    with pytest.raises(ValueError, match="cannot be read .*: is it truncated"):
        import_tf_checkpoint(prefix, source.config)


def test_config_replace_rederives_defaults():
    cfg = TransformerXLConfig.preset("tiny")
    assert cfg.replace(d_model=64, d_head=32).d_embed == 64
    assert cfg.replace(d_embed=16).replace(d_model=64).d_embed == 16
    assert cfg.replace(cutoffs=[100]).tie_projs == [False, True]
    assert TransformerXLConfig.from_json(cfg.to_json()) == cfg


def test_config_json_files_by_str_or_path(tmp_path):
    """`to_json(path)` and `from_json(a file's path)` take a `pathlib.Path`
    as a str (from_json's was an AttributeError); a missing file is a
    FileNotFoundError, JSON of no config a ConfigError."""
    cfg = TransformerXLConfig.preset("tiny")
    cfg.to_json(tmp_path / "config.json")
    assert TransformerXLConfig.from_json(tmp_path / "config.json") == cfg
    assert TransformerXLConfig.from_json(str(tmp_path / "config.json")) == cfg
    with pytest.raises(FileNotFoundError):
        TransformerXLConfig.from_json(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        TransformerXLConfig.from_json(tmp_path / "list.json")


@pytest.mark.parametrize("name", ["plain", "untied_r_same_length_clamp",
                                  "pre_lnorm_untied_outputs"])
def test_left_padded_row_computes_what_it_computes_alone(name):
    core = make_core(**VARIANTS[name])
    pad, real = 3, 5
    first, second = ids(3, 8, 5), ids(3, 8, 6)
    first[1, :pad] = 7  # any valid id: padding is never read
    mask = np.ones((3, 8), bool)
    mask[1, :pad] = False
    memory = core.initial_memory(3)
    out1, memory = core(first, memory, token_mask=mask)
    out2, memory2 = core(second, memory)
    alone1, alone_memory = core(first[1:2, pad:], core.initial_memory(1))
    alone2, _ = core(second[1:2], alone_memory)
    np.testing.assert_allclose(out1.numpy()[1, pad:], alone1.numpy()[0], atol=1e-5)
    np.testing.assert_allclose(out2.numpy()[1], alone2.numpy()[0], atol=1e-5)
    assert np.isfinite(out1.numpy()).all()
    mem_len = core.config.mem_len
    np.testing.assert_array_equal(memory.mem_mask.numpy()[1],
                                  np.arange(mem_len) >= mem_len - real)
    assert memory.mem_mask.numpy()[[0, 2], -8:].all()
    # The other rows are unchanged by the mask of row 1.
    plain1, _ = core(first, core.initial_memory(3))
    np.testing.assert_allclose(out1.numpy()[[0, 2]], plain1.numpy()[[0, 2]], atol=1e-6)


def test_token_mask_of_all_true_changes_nothing_and_bad_masks_are_named():
    core = make_core()
    x = ids(2, 6)
    plain, plain_memory = core(x, core.initial_memory(2))
    masked, masked_memory = core(x, core.initial_memory(2), token_mask=np.ones((2, 6), bool))
    np.testing.assert_array_equal(plain.numpy(), masked.numpy())
    np.testing.assert_array_equal(plain_memory.mem_mask.numpy(), masked_memory.mem_mask.numpy())
    with pytest.raises(InputError, match="token_mask must be bool"):
        core(x, core.initial_memory(2), token_mask=np.ones((2, 6), np.int32))
    with pytest.raises(InputError, match="one flag per token"):
        core(x, core.initial_memory(2), token_mask=np.ones((2, 5), bool))


def test_one_head_with_several_rows_matches_the_paper_code():
    # Shrunk from the fuzz test below: one head, two rows, twelve queries.
    # The position scores were a batch matmul of [B, 1, T, d] by the
    # shared [1, K, d] encodings, which TensorFlow's oneDNN kernel on CPU
    # computes wrongly (garbage, NaN, a corrupted heap).
    core = make_core(n_head=1, n_layer=1)
    weights, x = get_weights(core), ids(2, 12)
    want, _ = reference_forward(weights, core.config, x.T, None)
    got, _ = core(x, core.initial_memory(2, mem_len=0))
    np.testing.assert_allclose(got.numpy(), want.transpose(1, 0, 2), atol=2e-5)


def random_config(rng):
    """A small random attn_type 0 configuration for `test_random_configurations...`."""
    n_token = int(rng.integers(8, 60))
    cutoffs = sorted(rng.choice(np.arange(1, n_token), int(rng.integers(0, 3)),
                                replace=False).tolist())
    div_val = int(rng.choice([1, 2, 4])) if cutoffs else 1
    d_embed = max(int(rng.choice([8, 12, 16])), div_val ** len(cutoffs))
    tgt_len = int(rng.integers(1, 9))
    mem_len = int(rng.choice([0, max(tgt_len - 1, 1), tgt_len + int(rng.integers(1, 6))]))
    clamp_len = int(rng.choice([-1, 0, int(rng.integers(1, tgt_len + mem_len + 1)),
                                tgt_len + mem_len + 2]))
    return TransformerXLConfig(
        n_token=n_token, n_layer=int(rng.integers(1, 4)), d_model=int(rng.choice([8, 12, 16])),
        n_head=int(rng.integers(1, 4)), d_head=int(rng.choice([2, 4, 8])),
        d_inner=int(rng.choice([8, 24])), d_embed=d_embed,
        div_val=div_val, cutoffs=cutoffs, tie_weight=bool(rng.integers(2)),
        tie_projs=[bool(t) for t in rng.integers(0, 2, len(cutoffs) + 1)],
        proj_same_dim=bool(rng.integers(2)), untie_r=bool(rng.integers(2)),
        pre_lnorm=bool(rng.integers(2)), same_length=bool(rng.integers(2)),
        clamp_len=clamp_len, tgt_len=tgt_len, mem_len=mem_len, dropout=0.0,
        layer_norm_epsilon=float(rng.choice([1e-12, 1e-5])))


@pytest.mark.parametrize("seed", range(6))
def test_random_configurations_match_the_paper_code_and_one_pass(seed):
    # float32 against the float64 transcription: round-off over three layers
    # of O(1) weights stays near 1e-5 on log-probs of magnitude ~10.
    rng = np.random.default_rng(seed)
    cfg = random_config(rng)
    keras.utils.set_random_seed(seed)
    core = TransformerXL(cfg)
    for var in core.weights:  # O(1) weights: attention far from uniform
        var.assign((rng.normal(0, 0.4, var.shape)
                    + (1.0 if "gamma" in var.path else 0.0)).astype(np.float32))
    weights, batch = get_weights(core), int(rng.integers(1, 4))
    x = rng.integers(0, cfg.n_token, (batch, 2 * cfg.tgt_len + 5)).astype(np.int32)
    # Zero-filled memory: the paper's TF code, two segments.
    ref_mems = [np.zeros((cfg.mem_len, batch, cfg.d_model))] * cfg.n_layer
    memory = core.initial_memory(batch, zero_filled=True)
    for s in range(2):
        seg = x[:, s * cfg.tgt_len:(s + 1) * cfg.tgt_len]
        want, ref_mems = reference_forward(weights, cfg, seg.T, ref_mems)
        got, memory = core(seg, memory)
        np.testing.assert_allclose(got.numpy(), want.transpose(1, 0, 2), atol=1e-4)
        np.testing.assert_allclose(memory.mems.numpy(),
                                   np.stack(ref_mems).transpose(0, 2, 1, 3), atol=1e-4)
    # Segments of random lengths == one pass over an empty memory that covers
    # them (with same_length, any memory: both see the same window).
    cuts = sorted(set(rng.integers(1, x.shape[1], 3).tolist()))
    bounds = [0, *cuts, x.shape[1]]
    mem_len = int(rng.integers(0, 8)) if cfg.same_length else bounds[-2]
    full, full_memory = core(x, core.initial_memory(batch, mem_len=mem_len))
    memory = core.initial_memory(batch, mem_len=mem_len)
    for a, b in zip(bounds[:-1], bounds[1:]):
        got, memory = core(x[:, a:b], memory)
        np.testing.assert_allclose(got.numpy(), full.numpy()[:, a:b], atol=1e-5)
    np.testing.assert_allclose(memory.mems.numpy(), full_memory.mems.numpy(), atol=1e-5)
