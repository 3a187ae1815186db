"""Random-weight PyTorch Transformer-XL state dicts (numpy arrays, `[out, in]`
layout) in the paper code's naming and the transfo-xl-wt103 port's.

Each case is a dict: `state` (name → float32 array), `hyper` (the sizes the
numpy reference needs), `port` (naming/semantics of the port).
"""
import numpy as np


def _rand(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def make_state(n_token, d_model, n_head, d_head, d_inner, n_layer, d_embed=None, cutoffs=(),
               div_val=1, untie_r=False, tie_weight=True, tie_projs=None, port=False,
               save_tied_copies=False, seed=0, attn_type=0, max_klen=12):
    rng = np.random.default_rng(seed)
    d_embed = d_embed or d_model
    ends = [0, *cutoffs, n_token]
    n_bins = len(ends) - 1
    tie_projs = tie_projs or [False] + [True] * len(cutoffs)
    pre = "transformer." if port else ""
    s = {}
    if div_val == 1:
        s[f"{pre}word_emb.emb_layers.0.weight"] = _rand(rng, n_token, d_embed, scale=0.5)
        if d_embed != d_model:
            s[f"{pre}word_emb.emb_projs.0"] = _rand(rng, d_model, d_embed)
    else:
        for i in range(n_bins):
            dim = d_embed // div_val ** i
            s[f"{pre}word_emb.emb_layers.{i}.weight"] = _rand(rng, ends[i + 1] - ends[i], dim,
                                                              scale=0.5)
            s[f"{pre}word_emb.emb_projs.{i}"] = _rand(rng, d_model, dim)
    s[f"{pre}pos_emb.inv_freq"] = (1 / 10000 ** (np.arange(0, d_model, 2.0) / d_model)
                                   ).astype(np.float32)
    heads = n_head * d_head
    if attn_type == 1:  # the paper's RelLearnableMultiHeadAttn: per layer, by distance
        s["r_emb"] = _rand(rng, n_layer, max_klen, n_head, d_head)
        s["r_w_bias"] = _rand(rng, n_layer, n_head, d_head)
        s["r_bias"] = _rand(rng, n_layer, max_klen, n_head)
    if attn_type == 3:  # the paper's absolute embeddings per layer and position
        s["r_emb"] = _rand(rng, n_layer, max_klen, n_head, d_head)
    if not untie_r and attn_type == 0:
        s[f"{pre}r_w_bias"] = _rand(rng, n_head, d_head)
        s[f"{pre}r_r_bias"] = _rand(rng, n_head, d_head)
    for i in range(n_layer):
        p = f"{pre}layers.{i}"
        if attn_type in (2, 3):  # the paper's MultiHeadAttn
            s[f"{p}.dec_attn.q_net.weight"] = _rand(rng, heads, d_model)
            s[f"{p}.dec_attn.kv_net.weight"] = _rand(rng, 2 * heads, d_model)
        else:
            s[f"{p}.dec_attn.qkv_net.weight"] = _rand(rng, 3 * heads, d_model)
        if attn_type == 0:
            s[f"{p}.dec_attn.r_net.weight"] = _rand(rng, heads, d_model)
        s[f"{p}.dec_attn.o_net.weight"] = _rand(rng, d_model, heads)
        s[f"{p}.dec_attn.layer_norm.weight"] = 1 + _rand(rng, d_model, scale=0.1)
        s[f"{p}.dec_attn.layer_norm.bias"] = _rand(rng, d_model, scale=0.1)
        if untie_r:
            s[f"{p}.dec_attn.r_w_bias"] = _rand(rng, n_head, d_head)
            s[f"{p}.dec_attn.r_r_bias"] = _rand(rng, n_head, d_head)
        s[f"{p}.pos_ff.CoreNet.0.weight"] = _rand(rng, d_inner, d_model)
        s[f"{p}.pos_ff.CoreNet.0.bias"] = _rand(rng, d_inner, scale=0.1)
        s[f"{p}.pos_ff.CoreNet.3.weight"] = _rand(rng, d_model, d_inner)
        s[f"{p}.pos_ff.CoreNet.3.bias"] = _rand(rng, d_model, scale=0.1)
        s[f"{p}.pos_ff.layer_norm.weight"] = 1 + _rand(rng, d_model, scale=0.1)
        s[f"{p}.pos_ff.layer_norm.bias"] = _rand(rng, d_model, scale=0.1)
    tables = range(1) if div_val == 1 else range(n_bins)
    for i in tables:
        emb = s[f"{pre}word_emb.emb_layers.{i}.weight"]
        if not tie_weight:
            s[f"crit.out_layers.{i}.weight"] = _rand(rng, *emb.shape, scale=0.5)
        elif save_tied_copies:
            s[f"crit.out_layers.{i}.weight"] = emb.copy()
        s[f"crit.out_layers.{i}.bias"] = _rand(rng, emb.shape[0], scale=0.5)
    for i in range(n_bins):
        emb_proj = s.get(f"{pre}word_emb.emb_projs.{0 if div_val == 1 else i}")
        if emb_proj is None:
            continue
        if not tie_projs[i]:
            s[f"crit.out_projs.{i}"] = _rand(rng, *emb_proj.shape)
        elif save_tied_copies:
            s[f"crit.out_projs.{i}"] = emb_proj.copy()
    if cutoffs:
        # Large enough that a swapped cluster order shows in the log-probs.
        s["crit.cluster_weight"] = _rand(rng, len(cutoffs), d_embed, scale=0.5)
        s["crit.cluster_bias"] = np.linspace(-2, 2, len(cutoffs)).astype(np.float32)
    return s


def wt103_like_port():
    """The port's naming: cutoffs, div_val 4, untied r-biases in each layer."""
    hyper = dict(n_token=60, cutoffs=[20, 40], div_val=4, n_head=2, d_head=8)
    state = make_state(d_model=32, d_inner=48, n_layer=2, untie_r=True, port=True,
                       save_tied_copies=True, seed=1, **hyper)
    return dict(state=state, hyper=hyper, port=True)


def enwik8_like_paper():
    """The paper code's naming: a byte-sized vocabulary, shared r-biases."""
    hyper = dict(n_token=24, n_head=2, d_head=8)
    state = make_state(d_model=32, d_inner=48, n_layer=2, save_tied_copies=True, seed=2,
                       **hyper)
    return dict(state=state, hyper=hyper, port=False)


def adaptive_paper():
    """The paper code's naming with cutoffs, div_val 2, d_embed != d_model,
    untied output tables: its reversed cluster rows matter here."""
    hyper = dict(n_token=50, cutoffs=[10, 30], div_val=2, n_head=2, d_head=8)
    state = make_state(d_model=32, d_embed=16, d_inner=48, n_layer=2, tie_weight=False,
                       seed=3, **hyper)
    return dict(state=state, hyper=hyper, port=False)


CASES = {"wt103_port": wt103_like_port, "enwik8_paper": enwik8_like_paper,
         "adaptive_paper": adaptive_paper}


def save_safetensors(state, path):
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path))
    return str(path)


def random_case(seed):
    """A seeded random small model in either naming, with how to read it
    (`attn_type` is `seed % 4`, `pre_lnorm` is `seed % 3 == 0`, `same_length`
    `seed % 5 < 3` with memory, so 12 seeds meet each type with and without
    pre_lnorm; type 0 is in the port's naming when `seed // 4` is odd).

    Returns a dict: `state`, `hyper` (the reference's sizes), `port`,
    `attn_type`, `run` (memory, segment and evaluation settings, `pre_lnorm`,
    batch) and `overrides` (what `import_pytorch` needs beside the tensors).
    """
    rng = np.random.default_rng(seed)

    def pick(low, high):
        return int(rng.integers(low, high + 1))
    attn_type, n_layer, n_head = seed % 4, pick(1, 3), pick(1, 3)  # each type in 4 seeds
    d_head = pick(1, 8)
    if attn_type == 3:  # its embeddings are d_model wide: n_head * d_head, even
        d_head += d_head * n_head % 2
        d_model = n_head * d_head
    else:
        d_model = 2 * pick(2, 10)
    n_token = pick(8, 60)
    cutoffs = sorted(rng.choice(np.arange(1, n_token), pick(0, 3), replace=False).tolist())
    div_val = int(rng.choice([1, 2, 4])) if cutoffs else 1
    d_embed = d_model if rng.random() < 0.5 else 2 * pick(1, 12)
    while d_embed // div_val ** len(cutoffs) < 1:
        d_embed *= 2
    untie_r = attn_type == 0 and bool(rng.random() < 0.5)
    port = attn_type == 0 and seed // 4 % 2 == 1
    state = make_state(n_token, d_model, n_head, d_head, pick(1, 40), n_layer, d_embed=d_embed,
                       cutoffs=cutoffs, div_val=div_val, untie_r=untie_r,
                       tie_weight=bool(rng.random() < 0.6),
                       tie_projs=[bool(rng.random() < 0.5) for _ in range(len(cutoffs) + 1)],
                       port=port, save_tied_copies=bool(rng.random() < 0.5), seed=seed,
                       attn_type=attn_type, max_klen=pick(1, 16))
    if port and not untie_r and rng.random() < 0.5:  # the port lists shared r-biases per layer
        for i in range(n_layer):
            for b in ("r_w_bias", "r_r_bias"):
                state[f"transformer.layers.{i}.dec_attn.{b}"] = state[f"transformer.{b}"].copy()
    if rng.random() < 0.3:
        del state[("transformer." if port else "") + "pos_emb.inv_freq"]
    mem_len = 0 if rng.random() < 0.2 else pick(1, 8)
    run = dict(mem_len=mem_len, same_length=mem_len > 0 and seed % 5 < 3,
               clamp_len=int(rng.choice([-1, 0, pick(1, 6)])), pre_lnorm=seed % 3 == 0)
    overrides = dict(run)
    if attn_type == 2:  # its shapes tell n_head * d_head only
        overrides["n_head"] = n_head
    if div_val == 1 and cutoffs:  # one table: the shapes do not tell the cutoffs
        overrides["cutoffs"] = cutoffs
    run.update(seg_len=pick(1, 5), batch=pick(1, 3))
    hyper = dict(n_token=n_token, n_head=n_head, d_head=d_head, cutoffs=cutoffs, div_val=div_val)
    return dict(state=state, hyper=hyper, port=port, attn_type=attn_type, run=run,
                overrides=overrides)
