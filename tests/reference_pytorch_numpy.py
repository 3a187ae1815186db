"""A numpy Transformer-XL with the PyTorch code's semantics, read straight
from a state dict in its own naming and layout (`[out, in]` weights).

Written for the tests from the paper's equations, independently of
`txl_tf.weights.pytorch_import`: time-major `[len, batch]`, LayerNorm epsilon 1e-5,
memories that start empty (size 0) and grow to `mem_len` (or, as the
transfo-xl-wt103 port does, start as `mem_len` attended zero states), the
PyTorch code's `same_length` mask (built from the configured `mem_len`), and
a tail-cluster rule of either code: head column `-i` ("pytorch") or
`shortlist + i - 1` ("tf"). Inference only. Weights with `q_net` and
`kv_net` are its `attn_type=2`: the sinusoid added to the embeddings and to
a copy of the first layer's memory, standard attention; weights with
`r_emb` and `r_bias` its `attn_type=1` (learned embeddings and biases per
distance, the farthest repeated beyond them); with `r_emb` alone its
`attn_type=3` (a learned embedding per position added to every layer's
input, kept in the memory as the paper's in-place addition keeps it, and to
a copy of its memory). `pre_lnorm`: as its layers compute it, LayerNorm on
the attention's input (for `q_net` weights the keys' and values' only: its
queries come from the inputs as they are) and on the feed-forward's input,
residuals added after, no LayerNorm at the end. `probs[i]`: layer i's attention
probabilities `[qlen, klen, bsz, n_head]` of the last `forward`.
"""
import numpy as np

EPS = 1e-5


def _strip(state):
    """Paper-code names: the port's `transformer.` prefix removed."""
    prefix = "transformer."
    return {k[len(prefix):] if k.startswith(prefix) else k: np.asarray(v, np.float64)
            for k, v in state.items()}


def _layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS) * w + b


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def pytorch_mask(qlen, mlen, mem_len, same_length):
    """True where masked: `triu(1 + mlen)`, plus with `same_length`
    `tril(-shift)` where `shift = qlen - (klen - mem_len)` if positive
    `klen - mem_len`, else `qlen`."""
    klen = qlen + mlen
    ones = np.ones((qlen, klen))
    mask = np.triu(ones, 1 + mlen)
    if same_length:
        mask_len = klen - mem_len
        shift = qlen - mask_len if mask_len > 0 else qlen
        mask = mask + np.tril(ones, -shift)
    return mask > 0


def _rel_shift(x):
    q, k = x.shape[:2]
    padded = np.concatenate([np.zeros((q, 1) + x.shape[2:]), x], 1)
    return padded.reshape((k + 1, q) + x.shape[2:])[1:].reshape(x.shape)


class PytorchReference:
    """`forward(ids [qlen, bsz])` → log-probs `[qlen, bsz, n_token]`,
    carrying its memories from call to call."""

    def __init__(self, state, n_token, n_head, d_head, cutoffs=(), div_val=1, mem_len=8,
                 same_length=False, clamp_len=-1, cluster_rule="pytorch", zero_start=False,
                 pre_lnorm=False):
        self.w = _strip(state)
        self.n_token, self.n_head, self.d_head = n_token, n_head, d_head
        self.cutoffs, self.div_val = list(cutoffs), div_val
        self.mem_len, self.same_length, self.clamp_len = mem_len, same_length, clamp_len
        self.cluster_rule = cluster_rule
        self.n_layer = len({k.split(".")[1] for k in self.w if k.startswith("layers.")})
        self.d_model = self.w["layers.0.dec_attn.layer_norm.weight"].shape[0]
        self.zero_start, self.pre_lnorm = zero_start, pre_lnorm
        self.absolute = "layers.0.dec_attn.q_net.weight" in self.w
        self.learnable = "r_emb" in self.w and "r_bias" in self.w
        self.per_layer = "r_emb" in self.w and not self.learnable
        self.mems = None
        self.probs = {}

    def _bias(self, name, layer):
        own = f"layers.{layer}.dec_attn.{name}"
        return self.w[own] if own in self.w else self.w[name]

    def _embed(self, ids):
        ends = [0, *self.cutoffs, self.n_token]
        out = np.zeros(ids.shape + (self.d_model,))
        for i in range(len(ends) - 1 if self.div_val > 1 else 1):
            low, high = (ends[i], ends[i + 1]) if self.div_val > 1 else (0, self.n_token)
            sel = (ids >= low) & (ids < high)
            emb = self.w[f"word_emb.emb_layers.{i}.weight"][ids[sel] - low]
            proj = self.w.get(f"word_emb.emb_projs.{i}")
            out[sel] = emb @ proj.T if proj is not None else emb
        return out * self.d_model ** 0.5

    def _layer(self, i, h, mem, pos, mask):
        w, p = self.w, f"layers.{i}"
        qlen, bsz = h.shape[:2]
        cat = np.concatenate([mem, h], 0)
        norm = (lambda x, ln: _layer_norm(x, w[f"{ln}.weight"], w[f"{ln}.bias"]))
        if self.pre_lnorm:  # the queries of q_net stay un-normalized (its `q_net(h)`)
            cat = norm(cat, f"{p}.dec_attn.layer_norm")
        shape = (-1, bsz, self.n_head, self.d_head)
        if self.absolute:
            q = (h @ w[f"{p}.dec_attn.q_net.weight"].T).reshape(shape)
            k, v = (x.reshape(shape) for x in
                    np.split(cat @ w[f"{p}.dec_attn.kv_net.weight"].T, 2, -1))
            score = np.einsum("ibnd,jbnd->ijbn", q, k) / self.d_head ** 0.5
        elif self.learnable:
            heads = cat @ w[f"{p}.dec_attn.qkv_net.weight"].T
            q, k, v = np.split(heads, 3, -1)
            q, k, v = q[-qlen:].reshape(shape), k.reshape(shape), v.reshape(shape)
            emb, bias = w["r_emb"][i], w["r_bias"][i]
            if self.clamp_len > 0:
                emb, bias = emb[-self.clamp_len:], bias[-self.clamp_len:]
            klen = k.shape[0]
            if klen > emb.shape[0]:  # the farthest distance's row repeated in front
                extra = klen - emb.shape[0]
                emb = np.concatenate([np.repeat(emb[:1], extra, 0), emb])
                bias = np.concatenate([np.repeat(bias[:1], extra, 0), bias])
            emb, bias = emb[-klen:], bias[-klen:]
            ac = np.einsum("ibnd,jbnd->ijbn", q + w["r_w_bias"][i], k)
            bd = _rel_shift(np.einsum("ibnd,jnd->ijbn", q, emb) + bias[None, :, None])
            score = (ac + bd) / self.d_head ** 0.5
        else:
            heads = cat @ w[f"{p}.dec_attn.qkv_net.weight"].T
            q, k, v = np.split(heads, 3, -1)
            q, k, v = q[-qlen:].reshape(shape), k.reshape(shape), v.reshape(shape)
            r = (pos @ w[f"{p}.dec_attn.r_net.weight"].T).reshape(-1, self.n_head, self.d_head)
            ac = np.einsum("ibnd,jbnd->ijbn", q + self._bias("r_w_bias", i), k)
            bd = _rel_shift(np.einsum("ibnd,jnd->ijbn", q + self._bias("r_r_bias", i), r))
            score = (ac + bd) / self.d_head ** 0.5
        score = np.where(mask[:, :, None, None], -np.inf, score)
        prob = np.exp(score - score.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        self.probs[i] = prob
        vec = np.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, bsz, -1)
        h = h + vec @ w[f"{p}.dec_attn.o_net.weight"].T
        h = h if self.pre_lnorm else norm(h, f"{p}.dec_attn.layer_norm")
        ff = f"{p}.pos_ff"
        x = norm(h, f"{ff}.layer_norm") if self.pre_lnorm else h
        hid = np.maximum(x @ w[f"{ff}.CoreNet.0.weight"].T + w[f"{ff}.CoreNet.0.bias"], 0)
        h = h + hid @ w[f"{ff}.CoreNet.3.weight"].T + w[f"{ff}.CoreNet.3.bias"]
        return h if self.pre_lnorm else norm(h, f"{ff}.layer_norm")

    def _log_probs(self, hidden):
        w, ends = self.w, [0, *self.cutoffs, self.n_token]

        def part(i):
            one = self.div_val == 1
            j = 0 if one else i
            weight = w.get(f"crit.out_layers.{j}.weight", w[f"word_emb.emb_layers.{j}.weight"])
            bias = w[f"crit.out_layers.{j}.bias"]
            if one:
                weight, bias = weight[ends[i]:ends[i + 1]], bias[ends[i]:ends[i + 1]]
            proj = w.get(f"crit.out_projs.{i}", w.get(f"word_emb.emb_projs.{j}"))
            return weight, bias, proj

        def logits(x, weight, bias, proj):
            return (x @ proj if proj is not None else x) @ weight.T + bias

        weight, bias, proj = part(0)
        if not self.cutoffs:
            return _log_softmax(logits(hidden, weight, bias, proj))
        weight = np.concatenate([weight, w["crit.cluster_weight"]])
        bias = np.concatenate([bias, w["crit.cluster_bias"]])
        head = _log_softmax(logits(hidden, weight, bias, proj))
        out = [head[..., :self.cutoffs[0]]]
        for i in range(1, len(ends) - 1):
            col = -i if self.cluster_rule == "pytorch" else self.cutoffs[0] + i - 1
            out.append(head[..., col:col + 1 or None] + _log_softmax(logits(hidden, *part(i))))
        return np.concatenate(out, -1)

    def forward(self, ids):
        qlen, bsz = ids.shape
        if self.mems is None:
            start = self.mem_len if self.zero_start else 0
            self.mems = [np.zeros((start, bsz, self.d_model)) for _ in range(self.n_layer)]
        mlen = self.mems[0].shape[0]
        klen = mlen + qlen
        pos_seq = np.arange(klen - 1, -1, -1.0)
        if self.clamp_len > 0:
            pos_seq = np.minimum(pos_seq, self.clamp_len)
        # The PyTorch code keeps the frequencies as a (float32-made) buffer.
        inv_freq = self.w.get("pos_emb.inv_freq",
                              1 / 10000 ** (np.arange(0, self.d_model, 2.0) / self.d_model))
        angles = np.outer(pos_seq, inv_freq)
        pos = np.concatenate([np.sin(angles), np.cos(angles)], -1)
        mask = pytorch_mask(qlen, mlen, self.mem_len, self.same_length)
        h = self._embed(ids)
        mems = list(self.mems)
        # Added to a copy: the memory carried on is not changed.
        if self.absolute and not self.per_layer:
            h = h + pos[-qlen:, None]
            mems[0] = mems[0] + pos[:mlen, None]
        hids = []
        for i in range(self.n_layer):
            if self.per_layer:  # rows counted back from the window's end, the first repeated
                emb = self.w["r_emb"][i].reshape(self.w["r_emb"].shape[1], -1)
                rows = np.maximum(len(emb) - klen + np.arange(klen), 0)
                h = h + emb[rows[mlen:], None]
                mems[i] = mems[i] + emb[rows[:mlen], None]
            hids.append(h)
            h = self._layer(i, h, mems[i], pos, mask)
        # mem_len 0 keeps nothing (the paper's code has no memory then; a
        # slice [-0:] would keep everything).
        self.mems = [np.concatenate([m, x], 0)[-self.mem_len:] if self.mem_len else m[:0]
                     for m, x in zip(self.mems, hids)]
        return self._log_probs(h)
