"""An independent numpy transcription of the paper's TF forward pass.

Time-major like `tf/model.py` of kimiyoung/transformer-xl (mask built with
band parts, relative shift on `[qlen, klen, ...]`, boolean-mask adaptive
softmax), fed by weights keyed with the paper's TF variable names. Tests use
it to check the Keras core on exact small cases. Inference only (no dropout).
`pre_lnorm` follows the paper's PyTorch code (LayerNorm on the sub-layer
inputs, memory included; residual added after; no final LayerNorm).
"""
import numpy as np


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def rel_shift(x):
    qlen, klen = x.shape[:2]
    x = np.concatenate([np.zeros((qlen, 1) + x.shape[2:], x.dtype), x], axis=1)
    x = x.reshape((klen + 1, qlen) + x.shape[2:])[1:]
    return x.reshape((qlen, klen) + x.shape[2:])


def create_mask(qlen, mlen, same_length):
    """1 where attention is masked (the paper's convention)."""
    ones = np.ones((qlen, qlen))
    mask_u = np.triu(ones)
    mask_dia = np.diag(np.diag(ones))
    ret = np.concatenate([np.zeros((qlen, mlen)), mask_u - mask_dia], axis=1)
    if same_length:
        mask_l = np.tril(ones)
        ret = np.concatenate([ret[:, :qlen] + mask_l - mask_dia, ret[:, qlen:]], axis=1)
    return ret


def embed(w, cfg, x):
    if cfg.div_val == 1:
        y = w["transformer/adaptive_embed/lookup_table"][x]
        if "transformer/adaptive_embed/proj_W" in w:
            y = y @ w["transformer/adaptive_embed/proj_W"]
    else:
        y = np.zeros(x.shape + (cfg.d_model,))
        ends = [0] + cfg.cutoffs + [cfg.n_token]
        for i in range(len(ends) - 1):
            mask = (x >= ends[i]) & (x < ends[i + 1])
            cur = w[f"transformer/adaptive_embed/cutoff_{i}/lookup_table"][x[mask] - ends[i]]
            proj = w.get(f"transformer/adaptive_embed/cutoff_{i}/proj_W")
            y[mask] = cur @ proj if proj is not None else cur
    return y * cfg.d_model ** 0.5


def output_log_probs(w, cfg, hidden):
    """Full-vocabulary log-probs by the paper's head/tail composition."""
    def proj_of(i):
        if cfg.tie_projs[i]:
            if cfg.div_val == 1:
                return w.get("transformer/adaptive_embed/proj_W")
            return w.get(f"transformer/adaptive_embed/cutoff_{i}/proj_W")
        return w.get(f"transformer/adaptive_softmax/cutoff_{i}/proj")

    def table_of(i, low, high):
        if not cfg.tie_weight:  # output tables of their own
            if cfg.div_val == 1:
                return w["transformer/adaptive_softmax/weight"][low:high]
            return w[f"transformer/adaptive_softmax/cutoff_{i}/weight"]
        if cfg.div_val == 1:
            return w["transformer/adaptive_embed/lookup_table"][low:high]
        return w[f"transformer/adaptive_embed/cutoff_{i}/lookup_table"]

    def logit(x, weight, bias, proj):
        if proj is not None:
            x = np.einsum("ibd,ed->ibe", x, proj)
        return np.einsum("ibd,nd->ibn", x, weight) + bias

    if not cfg.cutoffs:
        return log_softmax(logit(hidden, table_of(0, 0, cfg.n_token),
                                 w["transformer/adaptive_softmax/bias"], proj_of(0)))
    ends = [0] + cfg.cutoffs + [cfg.n_token]
    head_w = np.concatenate([table_of(0, 0, ends[1]),
                             w["transformer/adaptive_softmax/cutoff_0/cluster_W"]])
    head_b = np.concatenate([w["transformer/adaptive_softmax/cutoff_0/b"],
                             w["transformer/adaptive_softmax/cutoff_0/cluster_b"]])
    head = log_softmax(logit(hidden, head_w, head_b, proj_of(0)))
    parts = [head[..., :ends[1]]]
    for i in range(1, len(ends) - 1):
        tail = log_softmax(logit(hidden, table_of(i, ends[i], ends[i + 1]),
                                 w[f"transformer/adaptive_softmax/cutoff_{i}/b"], proj_of(i)))
        parts.append(tail + head[..., ends[1] + i - 1:ends[1] + i])
    return np.concatenate(parts, -1)


def forward(w, cfg, dec_inp, mems=None, attention=None):
    """dec_inp `[qlen, bsz]`, mems list of `[mlen, bsz, d]` or None →
    (log_probs `[qlen, bsz, n_token]`, new_mems list keeping `cfg.mem_len`).
    `attention`, a list if given, gets each layer's attention probabilities
    `[qlen, klen, bsz, n_head]`."""
    eps = cfg.layer_norm_epsilon
    qlen, bsz = dec_inp.shape
    mlen = mems[0].shape[0] if mems is not None else 0
    klen = mlen + qlen
    output = embed(w, cfg, dec_inp)
    mask = create_mask(qlen, mlen, cfg.same_length)
    pos_seq = np.arange(klen - 1, -1, -1.0)
    if cfg.clamp_len > 0:
        pos_seq = np.minimum(pos_seq, cfg.clamp_len)
    inv_freq = 1 / (10000 ** (np.arange(0, cfg.d_model, 2.0) / cfg.d_model))
    sinusoid = np.einsum("i,j->ij", pos_seq, inv_freq)
    pos_emb = np.concatenate([np.sin(sinusoid), np.cos(sinusoid)], -1)
    n, dh = cfg.n_head, cfg.d_head
    new_mems = []
    for layer in range(cfg.n_layer):
        mem = mems[layer] if mems is not None else None
        cat_new = np.concatenate([mem, output], 0) if mem is not None else output
        new_mems.append(cat_new[-cfg.mem_len:] if cfg.mem_len else cat_new[:0])
        p = f"transformer/layer_{layer}"
        r_w_bias = w["transformer/r_w_bias"][layer] if cfg.untie_r else w["transformer/r_w_bias"]
        r_r_bias = w["transformer/r_r_bias"][layer] if cfg.untie_r else w["transformer/r_r_bias"]
        ln = lambda x, part: layer_norm(x, w[f"{p}/{part}/LayerNorm/gamma"],  # noqa: E731
                                        w[f"{p}/{part}/LayerNorm/beta"], eps)
        cat = ln(cat_new, "rel_attn") if cfg.pre_lnorm else cat_new
        heads = cat @ w[f"{p}/rel_attn/qkv/kernel"]
        q, k, v = np.split(heads, 3, -1)
        q = q[-qlen:].reshape(qlen, bsz, n, dh)
        k = k.reshape(klen, bsz, n, dh)
        v = v.reshape(klen, bsz, n, dh)
        r = (pos_emb @ w[f"{p}/rel_attn/r/kernel"]).reshape(klen, n, dh)
        ac = np.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
        bd = rel_shift(np.einsum("ibnd,jnd->ijbn", q + r_r_bias, r))
        score = (ac + bd) / dh ** 0.5
        m = mask[:, :, None, None]
        score = score * (1 - m) - 1e30 * m
        score = score - score.max(1, keepdims=True)
        prob = np.exp(score) / np.exp(score).sum(1, keepdims=True)
        if attention is not None:
            attention.append(prob)
        vec = np.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, bsz, n * dh)
        attn = vec @ w[f"{p}/rel_attn/o/kernel"]
        output = output + attn if cfg.pre_lnorm else ln(attn + output, "rel_attn")
        ff_in = ln(output, "ff") if cfg.pre_lnorm else output
        hid = np.maximum(ff_in @ w[f"{p}/ff/layer_1/kernel"] + w[f"{p}/ff/layer_1/bias"], 0)
        ff = hid @ w[f"{p}/ff/layer_2/kernel"] + w[f"{p}/ff/layer_2/bias"]
        output = output + ff if cfg.pre_lnorm else ln(ff + output, "ff")
    return output_log_probs(w, cfg, output), new_mems
