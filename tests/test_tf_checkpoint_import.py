"""`import_tf_checkpoint` on checkpoints laid out as the paper's TF code writes them
(variables by its names, saved with a TF1 `Saver`; no paper code needed): the TF
code's own rules, and one clear error for a checkpoint of another layout."""
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import TransformerXL, TransformerXLConfig, TxlError
from txl_tf.weights.checkpoints import get_weights, import_tf_checkpoint

SIZES = dict(n_token=40, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24, dropout=0.0,
             tgt_len=4, mem_len=4)


def random_core(seed=0, **overrides):
    core = TransformerXL(TransformerXLConfig(**{**SIZES, **overrides}))
    rng = np.random.default_rng(seed)
    for var in core.weights:
        var.assign(rng.normal(0, 0.3, var.shape).astype(np.float32))
    return core


def save_tf1(weights, prefix, **extra):
    """A TF1 `Saver` checkpoint of `weights` (`{tf_name: array}`) and `extra` arrays."""
    variables = {name: tf.Variable(value) for name, value in {**weights, **extra}.items()}
    variables["global_step"] = tf.Variable(3, dtype=tf.int64)
    return tf.compat.v1.train.Saver(var_list=variables).save(None, prefix)


def outputs(core, ids):
    memory = core.initial_memory(len(ids))
    got = []
    for segment in np.split(ids, 2, axis=1):
        log_probs, memory = core(segment, memory)
        got.append(log_probs.numpy())
    return np.concatenate(got, 1)


def test_without_cutoffs_the_softmax_reads_the_embedding_projection_whatever_tie_projs(tmp_path):
    """The TF code's softmax without cutoffs always projects with the embedding's
    `proj_W` (it has no `adaptive_softmax/cutoff_0/proj`), whatever train_gpu's
    `proj_share_all_but_first` made `tie_projs`: a config with `tie_projs=[False]`,
    as those flags give, describes the same checkpoint."""
    source = random_core(d_embed=12, tie_projs=[True])
    prefix = save_tf1(get_weights(source), str(tmp_path / "model.ckpt"))
    core = import_tf_checkpoint(prefix, source.config.replace(tie_projs=[False]))
    assert core.config.tie_projs == [True]
    ids = np.random.default_rng(1).integers(0, 40, (2, 8))
    np.testing.assert_allclose(outputs(core, ids), outputs(_zero_filled(source), ids),
                               atol=1e-5)


def _zero_filled(core):
    copy = TransformerXL(core.config.replace(zero_filled_memory=True))
    for mine, theirs in zip(copy.weights, core.weights):
        mine.assign(theirs)
    return copy


@pytest.mark.parametrize("source, config", [
    (dict(n_layer=3), dict(n_layer=2)),  # a layer left out
    (dict(cutoffs=[10, 25], d_embed=12, tie_projs=[False] * 3),  # own projections unread
     dict(cutoffs=[10, 25], d_embed=12, tie_projs=[False, True, True])),
    (dict(cutoffs=[10, 25], div_val=2, proj_same_dim=True, tie_projs=[False, True, True]),
     dict(cutoffs=[10, 25], div_val=2, proj_same_dim=False, tie_projs=[False, True, True])),
])
def test_model_weights_the_config_leaves_unread_are_an_error(tmp_path, source, config):
    """Weights of the checkpoint's model that the config would not read (another
    n_layer, tie_projs or proj_same_dim) are an error naming them, not a model
    computing something else; optimizer slots and other variables are ignored."""
    weights = get_weights(random_core(**source))
    prefix = save_tf1(weights, str(tmp_path / "model.ckpt"), **{
        "transformer/layer_0/ff/layer_1/bias/Adam": weights["transformer/layer_0/ff/layer_1/bias"],
        "beta1_power": np.float32(0.9)})
    with pytest.raises(TxlError, match="holds .* weights this config does not use, e.g. "
                       r"\['transformer/"):
        import_tf_checkpoint(prefix, TransformerXLConfig(**{**SIZES, **config}))
    import_tf_checkpoint(prefix, TransformerXLConfig(**{**SIZES, **source}))  # its own config


def test_the_tf_codes_layer_norm_epsilon_and_same_length_rule_are_set(tmp_path):
    """A config carrying the PyTorch code's settings (the port's `config.json` has
    `layer_norm_epsilon` 1e-5; a PyTorch import's config the "pytorch" rule)
    gets the TF code's: epsilon 1e-12 and the "tf" `same_length` rule, as
    `zero_filled_memory`; keywords still override them."""
    source = random_core(same_length=True, cutoffs=[10, 25], div_val=2)
    prefix = save_tf1(get_weights(source), str(tmp_path / "model.ckpt"))
    given = source.config.replace(layer_norm_epsilon=1e-5, same_length_convention="pytorch")
    core = import_tf_checkpoint(prefix, given)
    assert (core.config.layer_norm_epsilon, core.config.same_length_convention) == (1e-12, "tf")
    ids = np.random.default_rng(2).integers(0, 40, (3, 8))
    np.testing.assert_allclose(outputs(core, ids), outputs(_zero_filled(source), ids),
                               atol=1e-5)
    kept = import_tf_checkpoint(prefix, given, layer_norm_epsilon=1e-6)
    assert kept.config.layer_norm_epsilon == 1e-6


@pytest.mark.parametrize("field, value", [("pre_lnorm", True), ("attn_type", 1),
                                          ("tie_weight", False)])
def test_a_config_the_tf_code_cannot_have_is_an_error(tmp_path, field, value):
    """The TF code has post-LayerNorm blocks, relative attention (attn_type 0)
    and output tables tied to the embedding only: a config asking for another
    is an error naming the field, before the weights are read (pre_lnorm's
    would all fit and compute something else)."""
    prefix = save_tf1(get_weights(random_core()), str(tmp_path / "model.ckpt"))
    with pytest.raises(TxlError, match=f"the paper's TF code .* config has {field}={value}$"):
        import_tf_checkpoint(prefix, TransformerXLConfig(**SIZES, **{field: value}))


def test_txl_convert_with_the_ports_config_keeps_the_tf_codes_layer_norm_epsilon(tmp_path):
    """`txl-convert --source=tf --config=<the port's config.json>`: the port's
    `layer_norm_epsilon` (1e-5, its PyTorch layers') is no keyword for the TF
    import, which keeps that code's 1e-12."""
    import json

    from txl_tf.weights import load_pretrained
    from txl_tf.weights.convert import convert

    source = random_core()
    prefix = save_tf1(get_weights(source), str(tmp_path / "model.ckpt"))
    port = {**source.config.to_dict(), "layer_norm_epsilon": 1e-5,
            "architectures": ["TransfoXLLMHeadModel"]}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(port))
    out = convert("tf", prefix, str(tmp_path / "model"), config=str(config),
                  echo=lambda line: None)
    assert load_pretrained(out).config.layer_norm_epsilon == 1e-12


def test_a_weight_of_another_shape_names_the_checkpoint(tmp_path):
    """A config of another `d_inner` than the checkpoint's: the error names the
    checkpoint as well as the weight and both shapes."""
    prefix = save_tf1(get_weights(random_core(d_inner=24)), str(tmp_path / "model.ckpt"))
    with pytest.raises(TxlError, match=r"checkpoint '.*model\.ckpt.*': weight transformer/"
                       r".* has shape \(.*\), the model expects"):
        import_tf_checkpoint(prefix, TransformerXLConfig(**{**SIZES, "d_inner": 20}))


class _CountingReader:
    """A checkpoint reader that records the tensors read."""

    def __init__(self, reader, read):
        self.reader, self.read = reader, read

    def get_variable_to_shape_map(self):
        return self.reader.get_variable_to_shape_map()

    def get_tensor(self, name):
        self.read.append(name)
        return self.reader.get_tensor(name)


def test_a_weight_of_another_shape_is_refused_before_any_tensor_is_read(tmp_path, monkeypatch):
    """Every tensor was read before any shape was compared: TensorFlow sizes a
    tensor by the shape the checkpoint's index declares, so one declaring
    2**40 elements was allocated before the mismatch was found. Shapes are
    compared from the index first, for the paper's checkpoints and training
    ones (`restore_weights`)."""
    from txl_tf.weights.checkpoints import restore_weights, weight_dict
    core = random_core()
    weights = get_weights(core)
    name = "transformer/layer_1/ff/layer_1/kernel"
    weights[name] = np.zeros((17, 24), np.float32)
    prefix = save_tf1(weights, str(tmp_path / "tf1" / "model.ckpt"))
    bigger = random_core(d_inner=32)
    trained = tf.train.Checkpoint(weights=weight_dict(bigger)).save(str(tmp_path / "run" / "ckpt"))
    read = []
    load = tf.train.load_checkpoint
    monkeypatch.setattr(tf.train, "load_checkpoint",
                        lambda path: _CountingReader(load(path), read))
    with pytest.raises(TxlError, match=rf"weight {name} has shape \(17, 24\), the model "
                                       r"expects \(16, 24\)"):
        import_tf_checkpoint(prefix, core.config)
    with pytest.raises(TxlError, match=r"weight transformer/layer_0/ff/layer_1/kernel has shape "
                                       r"\(16, 32\), the model expects \(16, 24\)"):
        restore_weights(random_core(), trained)
    assert read == []


def test_a_config_far_larger_than_the_checkpoint_is_refused_before_the_model_is_built(
        tmp_path, monkeypatch):
    """A config of n_token=10**7 given for a 40-token checkpoint built 160
    million floats, then found the first weight missing or of another shape."""
    import txl_tf.core
    prefix = save_tf1(get_weights(random_core()), str(tmp_path / "model.ckpt"))
    built = []
    monkeypatch.setattr(txl_tf.core.TransformerXL, "__init__",
                        lambda self, *a, **k: built.append(a))
    with pytest.raises(TxlError, match=r"checkpoint .*: the config's model has at least "
                                       r"160,[\d,]+ weights, more than twice the [\d,]+ the file "
                                       r"holds \(not one model's; nothing was built\)"):
        import_tf_checkpoint(prefix, TransformerXLConfig(**{**SIZES, "n_token": 10**7}))
    assert not built
