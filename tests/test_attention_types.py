"""The paper's other attention types, `attn_type=1` (Shaw et al.'s learnable
relative embeddings), `2` (absolute sinusoid, standard attention: the
vanilla Transformer of its ablation) and `3` (Al-Rfou et al.'s learned
absolute embeddings at every layer), against a numpy model of its PyTorch
code (tests/reference_pytorch_numpy.py) read from the same state dict, and
what the types refuse."""
import keras
import numpy as np
import pytest

from tests.pytorch_fixtures import make_state, save_safetensors
from tests.reference_pytorch_numpy import PytorchReference
from txl_tf import TransformerXL, TransformerXLConfig, TxlError
from txl_tf.config import ConfigError
from txl_tf.weights import import_pytorch, load_pretrained, save_pretrained
from txl_tf.weights.pytorch_import import PytorchImportError

SEG, MEM, BATCH, SEGMENTS = 4, 8, 2, 3
HYPER = dict(n_token=50, cutoffs=[10, 30], div_val=2, n_head=2, d_head=8)


# attn_type 1 and 3 with 6 embeddings per layer: windows up to 12 long repeat the
# farthest; 3 adds n_head * d_head embeddings to d_model states.
TYPES = {1: dict(max_klen=6), 2: {}, 3: dict(max_klen=6, d_head=16)}


def sizes(attn_type):
    return {**HYPER, **TYPES[attn_type]}


def type_state(attn_type):
    """A random-weight state dict of the paper's code for `attn_type`."""
    return make_state(d_model=32, d_embed=16, d_inner=48, n_layer=2, tie_weight=False,
                      attn_type=attn_type, seed=4, **sizes(attn_type))


def type_config(attn_type):
    return TransformerXLConfig(d_model=32, d_embed=16, d_inner=48, n_layer=2,
                               attn_type=attn_type, tie_weight=False,
                               tie_projs=[False, True, True], **sizes(attn_type))


@pytest.mark.parametrize("attn_type", sorted(TYPES))
@pytest.mark.parametrize("same_length,clamp_len", [(False, -1), (True, -1), (True, 3)])
def test_each_type_matches_the_papers_code_over_segments_with_memory(
        tmp_path, attn_type, same_length, clamp_len):
    state = type_state(attn_type)
    path = save_safetensors(state, tmp_path / "w.safetensors")
    core = import_pytorch(path, type_config(attn_type), same_length=same_length,
                          clamp_len=clamp_len, mem_len=MEM)
    assert core.config.attn_type == attn_type
    assert_matches_the_papers_code(core, state, attn_type, same_length, clamp_len)


def test_type_2_imports_given_only_the_sizes_its_shapes_cannot_tell(tmp_path):
    state = type_state(2)
    path = save_safetensors(state, tmp_path / "w.safetensors")
    core = import_pytorch(path, n_head=2, d_head=8, mem_len=MEM)
    assert (core.config.attn_type, core.config.n_head, core.config.d_head) == (2, 2, 8)
    assert_matches_the_papers_code(core, state, 2, same_length=False, clamp_len=-1)


def assert_matches_the_papers_code(core, state, attn_type, same_length, clamp_len):
    """`core` against the numpy model of the paper's PyTorch code on `state`,
    over segments with memory: outputs and memories within float32 round-off."""
    reference_sizes = {k: v for k, v in sizes(attn_type).items() if k != "max_klen"}
    ref = PytorchReference(state, mem_len=MEM, same_length=same_length, clamp_len=clamp_len,
                           **reference_sizes)
    ids = np.random.default_rng(0).integers(0, HYPER["n_token"], (BATCH, SEG * SEGMENTS))
    memory = core.initial_memory(BATCH, MEM)
    for s in range(SEGMENTS):
        x = ids[:, s * SEG:(s + 1) * SEG]
        got, memory = core(x, memory)
        want = ref.forward(x.T).transpose(1, 0, 2)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,  # float32
                                   err_msg=f"segment {s}")
        filled = min(MEM, (s + 1) * SEG)  # the reference's memory grows from empty
        mems = np.asarray(memory.mems)[:, :, MEM - filled:]
        np.testing.assert_allclose(mems, np.stack(ref.mems).transpose(0, 2, 1, 3), atol=1e-5)


@pytest.mark.parametrize("attn_type", sorted(TYPES))
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_each_types_attention_probabilities_are_the_papers(tmp_path, attn_type, pre_lnorm):
    """`attention_probabilities` of every layer over segments with memory
    equal the paper's code's softmax (types 2 and 3 had only their shape and
    masking checked); the memory's empty slots get 0."""
    state = type_state(attn_type)
    path = save_safetensors(state, tmp_path / "w.safetensors")
    core = import_pytorch(path, type_config(attn_type), mem_len=MEM, same_length=True,
                          pre_lnorm=pre_lnorm)
    ref = PytorchReference(state, mem_len=MEM, same_length=True, pre_lnorm=pre_lnorm,
                           **{k: v for k, v in sizes(attn_type).items() if k != "max_klen"})
    ids = np.random.default_rng(0).integers(0, HYPER["n_token"], (BATCH, SEG * SEGMENTS))
    memory = core.initial_memory(BATCH, MEM)
    for s in range(SEGMENTS):
        x = ids[:, s * SEG:(s + 1) * SEG]
        ref.forward(x.T)
        empty = MEM - min(MEM, s * SEG)  # the reference's memory grows from empty
        for layer in range(2):
            probs = core.attention_probabilities(x, memory, layer)[0].numpy()
            assert (probs[..., :empty] == 0).all()
            np.testing.assert_allclose(probs[..., empty:], ref.probs[layer].transpose(2, 3, 0, 1),
                                       atol=1e-5, err_msg=f"segment {s}, layer {layer}")
        memory = core(x, memory)[1]


@pytest.mark.parametrize("attn_type", sorted(TYPES))
def test_each_type_round_trips_trains_and_refuses_a_decode_cache(tmp_path, attn_type):
    keras.utils.set_random_seed(0)
    config = TransformerXLConfig.preset("tiny", n_token=30, attn_type=attn_type, tgt_len=4,
                                        mem_len=4, dropout=0.0)
    core = TransformerXL(config)
    ids = np.random.default_rng(1).integers(0, 30, (2, 9)).astype(np.int32)
    x, y = ids[:, :8], ids[:, 1:]
    memory = core.initial_memory(2)
    expected, _ = core(x, memory)
    save_pretrained(core, tmp_path / "model")
    reloaded = load_pretrained(tmp_path / "model")
    np.testing.assert_allclose(reloaded(x, reloaded.initial_memory(2))[0], expected, atol=1e-6)

    from txl_tf import TransformerXLLM
    model = TransformerXLLM(config, batch_size=2)
    model.core.set_weights(core.get_weights())
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = [model.fit(x[:, :4], y[:, :4], verbose=0).history["loss"][0] for _ in range(8)]
    assert losses[-1] < losses[0] - 0.1, losses
    model.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert loaded.core.config.attn_type == attn_type
    np.testing.assert_allclose(loaded.core(x, loaded.core.initial_memory(2))[0],
                               model.core(x, model.core.initial_memory(2))[0], atol=1e-6)
    with pytest.raises(TxlError, match=f"attn_type {attn_type} .* decode cache"):
        core.decode_cache(memory)


def test_bad_types_are_one_clear_error_and_the_weights_tell_theirs(tmp_path):
    with pytest.raises(ConfigError, match="attn_type must be one of 0 .*3 .* got 4"):
        TransformerXLConfig(n_token=10, attn_type=4)
    with pytest.raises(ConfigError, match="max_klen is for attn_type 1 and 3"):
        TransformerXLConfig(n_token=10, max_klen=8)
    with pytest.raises(ConfigError, match="n_head \\* d_head = 16 must be d_model = 32"):
        TransformerXLConfig(n_token=10, d_model=32, n_head=2, d_head=8, attn_type=3)
    state = make_state(d_model=32, d_inner=48, n_layer=1, n_token=20, n_head=2, d_head=8,
                       attn_type=2)
    path = save_safetensors(state, tmp_path / "w.safetensors")
    with pytest.raises(PytorchImportError, match=r"n_head \* d_head = 16 but not n_head from "
                                                 r"d_head: pass n_head=\.\.\. and/or d_head="):
        import_pytorch(path)
    assert import_pytorch(path, n_head=8).config.d_head == 2  # the other size follows
    with pytest.raises(PytorchImportError, match="n_head=3 and d_head=8 does not fit"):
        import_pytorch(path, n_head=3, d_head=8)
    with pytest.raises(PytorchImportError, match="n_head=3 does not fit .* = 16 wide"):
        import_pytorch(path, n_head=3)
    with pytest.raises(PytorchImportError, match=r"holds attn_type 2 weights \(q_net and "
                                                 r"kv_net, no r_emb\); the config has attn_type 0"):
        import_pytorch(path, TransformerXLConfig(n_token=20, d_model=32, d_inner=48, n_layer=1,
                                                 n_head=2, d_head=8))
    state = make_state(d_model=32, d_inner=48, n_layer=1, n_token=20, n_head=2, d_head=16,
                       attn_type=3, max_klen=4)
    path = save_safetensors(state, tmp_path / "w3.safetensors")  # r_emb alone: attn_type 3
    inferred = import_pytorch(path).config
    assert (inferred.attn_type, inferred.max_klen, inferred.n_head, inferred.d_head) == \
        (3, 4, 2, 16)


def test_learnable_type_with_one_head_and_several_rows_matches_the_papers_code():
    # One head, two rows, twelve positions: the position scores were a batch
    # matmul TensorFlow's oneDNN kernel on CPU computes wrongly (see
    # test_core.test_one_head_with_several_rows_matches_the_paper_code).
    state = make_state(n_token=30, d_model=16, n_head=1, d_head=8, d_inner=24, n_layer=1,
                       attn_type=1, max_klen=6, seed=5)
    core = import_pytorch(state, mem_len=4)
    ref = PytorchReference(state, n_token=30, n_head=1, d_head=8, mem_len=4)
    ids = np.random.default_rng(2).integers(0, 30, (2, 24))
    memory = core.initial_memory(2)
    for s in range(2):
        got, memory = core(ids[:, 12 * s:12 * (s + 1)], memory)
        want = ref.forward(ids[:, 12 * s:12 * (s + 1)].T).transpose(1, 0, 2)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def random_paper_config(rng):
    """A small random configuration of the paper's PyTorch code (any
    `attn_type`, memory lengths 0, below and above the segment's)."""
    attn_type = int(rng.integers(0, 4))
    n_head, d_head = int(rng.integers(1, 4)), int(rng.choice([2, 4, 8]))
    n_token = int(rng.integers(8, 50))
    cutoffs = sorted(rng.choice(np.arange(1, n_token), int(rng.integers(0, 3)),
                                replace=False).tolist())
    tgt_len = int(rng.integers(1, 7))
    mem_len = int(rng.choice([0, max(tgt_len - 1, 1), tgt_len + 3]))
    klen = tgt_len + mem_len
    untie_r = bool(rng.integers(2)) and attn_type == 0
    return TransformerXLConfig(
        n_token=n_token, n_layer=int(rng.integers(1, 4)), n_head=n_head, d_head=d_head,
        d_model=n_head * d_head if attn_type == 3 else int(rng.choice([8, 16])),
        d_inner=int(rng.choice([8, 24])), d_embed=16, cutoffs=cutoffs,
        div_val=int(rng.choice([1, 2])) if cutoffs else 1, tie_weight=bool(rng.integers(2)),
        tie_projs=[bool(t) for t in rng.integers(0, 2, len(cutoffs) + 1)], untie_r=untie_r,
        # same_length without memory masks every key there (NaN): not compared.
        same_length=bool(rng.integers(2)) and mem_len > 0, tgt_len=tgt_len, mem_len=mem_len,
        clamp_len=int(rng.choice([-1, int(rng.integers(1, klen + 1)), klen + 2])),
        attn_type=attn_type,
        max_klen=int(rng.integers(tgt_len, 12)) if attn_type in (1, 3) else None)


@pytest.mark.parametrize("seed", range(8))
def test_random_configurations_match_the_papers_code(seed):
    # float32 against the float64 model of the paper's code: round-off stays
    # near 1e-5 on log-probs of magnitude ~10.
    rng = np.random.default_rng(100 + seed)
    cfg = random_paper_config(rng)
    state = make_state(cfg.n_token, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner,
                       cfg.n_layer, d_embed=cfg.d_embed, cutoffs=cfg.cutoffs,
                       div_val=cfg.div_val, untie_r=cfg.untie_r, tie_weight=cfg.tie_weight,
                       tie_projs=cfg.tie_projs, seed=seed, attn_type=cfg.attn_type,
                       max_klen=cfg.max_klen or 12)
    core = import_pytorch(state, cfg, same_length=cfg.same_length, clamp_len=cfg.clamp_len,
                          mem_len=cfg.mem_len)
    ref = PytorchReference(state, n_token=cfg.n_token, n_head=cfg.n_head, d_head=cfg.d_head,
                           cutoffs=cfg.cutoffs, div_val=cfg.div_val, mem_len=cfg.mem_len,
                           same_length=cfg.same_length, clamp_len=cfg.clamp_len)
    batch = int(rng.integers(1, 4))
    ids = rng.integers(0, cfg.n_token, (batch, 3 * cfg.tgt_len))
    memory = core.initial_memory(batch)
    for s in range(3):
        x = ids[:, s * cfg.tgt_len:(s + 1) * cfg.tgt_len]
        got, memory = core(x, memory)
        np.testing.assert_allclose(np.asarray(got), ref.forward(x.T).transpose(1, 0, 2),
                                   rtol=1e-4, atol=1e-4, err_msg=f"{cfg} segment {s}")


@pytest.mark.parametrize("attn_type", [1, 3])
def test_a_fresh_model_draws_the_papers_initial_position_weights(attn_type):
    """The paper's `weights_init`: `r_emb` and `r_w_bias` N(0, init_std),
    `r_bias` (attn_type 1's bias per distance) zero."""
    core = TransformerXL(type_config(attn_type).replace(init_std=0.05))
    r_emb = np.asarray(core.r_emb.numpy())
    assert abs(r_emb.std() - 0.05) < 0.01 and abs(r_emb.mean()) < 0.01
    if attn_type == 1:
        assert abs(np.asarray(core.r_w_bias.numpy()).std() - 0.05) < 0.02
        assert not np.asarray(core.r_bias.numpy()).any()
