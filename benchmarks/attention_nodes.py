"""The cached decode step's attention in each form ONNX Runtime's attention
ops can take (issue 53), in one place: the forms (`FORMS`), the layout of
their rings, and the nodes one layer's attention is in each form.
`benchmarks.attention_forms` builds one layer's graph of them;
`benchmarks.fused_step` puts them into a whole exported decode step.

The forms are described in `benchmarks.attention_forms`' docstring. Every
form takes the same tensors (`attention_nodes`): the query with u (`q_u`,
already scaled), the token's key and value, the rings, the write indices,
and the terms of the additive bias (the relative term, the hidden slots'
mask), whose slots already match the form's rings (`slots_of`).
"""
import numpy as np

FORMS = ("today", "mha", "mha_pad", "attention23", "attention23_pad", "attention24_pad", "dmmha",
         "dmmha_inflight", "gqa")
ATTENTION = ("attention23", "attention23_pad", "attention24_pad")
DMMHA = ("dmmha", "dmmha_inflight")
# Forms whose op appends the token at a fixed index: one scratch slot after the ring.
SCRATCH = (*DMMHA, "gqa")
# `dmmha_inflight` is `dmmha` with the CUDA kernel's loads of many keys in flight at once.
INFLIGHT = "ORT_DECODER_MASKED_ATTENTION_LOAD_KV_DATA_IN_FLIGHT"
# `_pad` forms: the slots padded with hidden ones to a multiple of this (a fused kernel's
# alignment of the bias rows: 4 float32 or 8 float16 elements).
PAD = 8
DTYPES = ("float32", "float16")
HIDDEN = {"float32": -1e30, "float16": -3e4}
OPSET = 23  # 24 for the forms that write with TensorScatter (`scatter_writes`)
MICROSOFT = "com.microsoft"


def slots_of(form, slots):
    """The slots of `form`'s rings for a ring of `slots`: one scratch slot
    more (`SCRATCH`), or padded to a multiple of `PAD` (`_pad`)."""
    if form in SCRATCH:
        return slots + 1
    if form.endswith("_pad"):
        return -(-slots // PAD) * PAD
    return slots


def scatter_writes(form):
    """Whether `form` writes the token into the rings with the opset-24
    TensorScatter (one write index a row, in place, no index tensors)
    rather than ScatterElements."""
    return form == "attention24_pad"


def opset_of(form):
    """The default domain's opset `form`'s nodes need (None: any the graph has)."""
    if scatter_writes(form):
        return 24
    return OPSET if form in ATTENTION else None


def chunked_keys(form, device):
    """Whether `form` on `device` keeps its keys in the decoder kernel's
    chunks: `dmmha` on CUDA, whose kernel (FasterTransformer's) reads and
    writes the key cache as `[B, H, d / x, S, x]`, x = 16 bytes of elements,
    in a tensor it declares `[B, H, S, d]` (its CPU kernel reads BNSH)."""
    return form in DMMHA and device == "cuda"


def chunk(dtype):
    """The elements of 16 bytes of `dtype` (the chunked keys' last axis)."""
    return 16 // np.dtype(dtype).itemsize


def ring_dims(form, heads, d_head, slots, chunk_elements=0, batch=None):
    """`(keys, values)`: the dims of `form`'s rings of `slots` slots (its
    own, `slots_of`), the keys in chunks of `chunk_elements` where not 0
    (`chunked_keys`), the batch axis `batch`."""
    x = chunk_elements
    keys = ([batch, heads, d_head, slots] if form == "today" else
            [batch, heads, d_head // x, slots, x] if x else [batch, heads, slots, d_head])
    return keys, [batch, heads, slots, d_head]


def form_rings(form, keys, values, device="cpu"):
    """BNSH rings `[B, H, S, d]` (numpy) in `form`'s layout on `device`:
    the slots past `S` (`slots_of`) zero, today's keys as columns, the
    chunked keys in chunks (`chunked_keys`); contiguous copies."""
    b, h, s, d = keys.shape
    extra = slots_of(form, s) - s
    if extra:
        keys, values = (np.concatenate([x, np.zeros((b, h, extra, d), x.dtype)], 2)
                        for x in (keys, values))
    if form == "today":
        keys = keys.transpose(0, 1, 3, 2)
    elif chunked_keys(form, device):
        x = chunk(keys.dtype)
        keys = keys.reshape(b, h, keys.shape[2], d // x, x).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(keys), np.ascontiguousarray(values)


def bnsh(form, keys, values, slots):
    """A form's rings `(keys, values)` as BNSH `[B, H, S, d]` (today's key
    columns transposed, chunked keys joined, slots past `slots` dropped)."""
    if form == "today":
        keys = keys.transpose(0, 1, 3, 2)
    if keys.ndim == 5:
        b, h, chunks, _, x = keys.shape
        keys = keys.transpose(0, 1, 3, 2, 4).reshape(b, h, -1, chunks * x)
    return keys[:, :, :slots], values[:, :, :slots]


class Nodes:
    """ONNX nodes and initializers being collected for a graph: `add`
    appends a node, `const` an int64 constant (once per name, `prefix`
    put before it)."""

    def __init__(self, prefix=""):
        self.nodes, self.inits, self.prefix = [], {}, prefix

    def add(self, op, inputs, outputs, **attrs):
        from onnx import helper
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def const(self, name, values, dtype=np.int64):
        from onnx import numpy_helper
        name = self.prefix + name
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(np.asarray(values, dtype), name)
        return name


def attention_nodes(nodes, form, t, heads, d_head, slots, chunked=0, prefix=""):
    """Adds one layer's attention in `form` to `nodes` (`Nodes`): the token
    written into the rings, then the attention of the query against them.

    Args:
        nodes: a `Nodes`.
        form: one of `FORMS`.
        t: `{role: tensor name}`. Inputs: `q_u` (`B * H * d` elements in
            head order: any shape), `key`, `value` (likewise), `keys`,
            `values` (the rings in the form's layout, `ring_dims`),
            `bias_terms` (a list: tensors that add up to the bias
            `[B, H, 1, slots]`, in the rings' dtype), `value_index` `[B, H,
            1, d]` (each row's write slot, broadcast; not for
            `scatter_writes` forms), `key_index` (today's `[B, H, d, 1]`,
            the chunked keys' `[B, H, d / x, 1, x]`), `write_index` int64
            `[B]` (`scatter_writes` forms), `seqlens` int32 `[B]` (`gqa`:
            the ring's slots, `slots - 1`). Outputs: `out` `[B, H * d]`,
            `keys_out`, `values_out` (the written rings, to be bound to the
            rings' buffers) and for `SCRATCH` forms `present_keys`,
            `present_values` (likewise).
        heads, d_head: the layer's heads and head width.
        slots: the slots of the form's rings (`slots_of`).
        chunked: the keys in the decoder kernel's chunks: 0, or the
            chunk's elements (`chunk`).
        prefix: put before the names of the tensors made here.
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    h, d, p = heads, d_head, prefix
    heads_1_d = nodes.const("heads_1_d", [0, h, 1, d])
    rows_1_flat = nodes.const("rows_1_flat", [0, 1, h * d])
    add = nodes.add
    value4 = add("Reshape", [t["value"], heads_1_d], [p + "value4"])
    if scatter_writes(form):
        key4 = add("Reshape", [t["key"], heads_1_d], [p + "key4"])
        for ring, new in (("keys", key4), ("values", value4)):
            add("TensorScatter", [t[ring], new, t["write_index"]], [t[ring + "_out"]], axis=2,
                mode="circular")
    else:
        add("ScatterElements", [t["values"], t["value_index"], value4], [t["values_out"]],
            axis=2)
    keys_read = t["keys_out"]
    if scatter_writes(form):
        pass
    elif form == "today":
        key4 = add("Reshape", [t["key"], nodes.const("heads_d_1", [0, h, d, 1])], [p + "key4"])
        add("ScatterElements", [t["keys"], t["key_index"], key4], [t["keys_out"]], axis=3)
    elif chunked:
        x = chunked
        key5 = add("Reshape", [t["key"], nodes.const("chunks_1_x", [0, h, d // x, 1, x])],
                   [p + "key5"])
        add("ScatterElements", [t["keys"], t["key_index"], key5], [t["keys_out"]], axis=3)
        keys_read = add("Reshape", [t["keys_out"], nodes.const(f"slots_d_{slots}",
                                                               [0, h, slots, d])],
                        [p + "keys_cache"])
    else:
        key4 = add("Reshape", [t["key"], heads_1_d], [p + "key4"])
        add("ScatterElements", [t["keys"], t["value_index"], key4], [t["keys_out"]], axis=2)
    terms = list(t["bias_terms"])
    if form == "today":
        q_u4 = add("Reshape", [t["q_u"], heads_1_d], [p + "q_u4"])
        score = add("MatMul", [q_u4, t["keys_out"]], [p + "content"])
        for k, term in enumerate(terms):
            score = add("Add", [score, term], [p + f"score{k}"])
        prob = add("Softmax", [score], [p + "prob"], axis=-1)
        vec = add("MatMul", [prob, t["values_out"]], [p + "vec"])
    else:
        bias = terms[0]
        for k, term in enumerate(terms[1:]):
            bias = add("Add", [bias, term], [p + f"bias{k}"])
        vec = _fused(nodes, form, t, bias, keys_read, h, slots, p, (heads_1_d, rows_1_flat))
    add("Reshape", [vec, nodes.const("flat", [0, h * d])], [t["out"]])


def _fused(nodes, form, t, bias, keys_read, h, slots, p, shapes):
    """The fused op's nodes (`attention_nodes`; `shapes`: the names of its
    `[B, H, 1, d]` and `[B, 1, H * d]`); returns its output."""
    add = nodes.add
    heads_1_d, rows_1_flat = shapes
    if form in ("mha", "mha_pad"):
        q_u3 = add("Reshape", [t["q_u"], rows_1_flat], [p + "q_u3"])
        return add("MultiHeadAttention", [q_u3, keys_read, t["values_out"], "", "", bias],
                   [p + "vec"], domain=MICROSOFT, num_heads=h, scale=1.0)
    if form in ATTENTION:
        q_u4 = add("Reshape", [t["q_u"], heads_1_d], [p + "q_u4"])
        return add("Attention", [q_u4, keys_read, t["values_out"], bias], [p + "vec"],
                   scale=1.0)
    q_u3, key3, value3 = (add("Reshape", [t[k], rows_1_flat], [p + k + "3"])
                          for k in ("q_u", "key", "value"))
    presents = [p + "vec", t["present_keys"], t["present_values"]]
    if form in DMMHA:  # the token appended at the scratch slot, hidden by the bias
        past = nodes.const(f"past_length_{slots - 1}", slots - 1, np.int32)
        return add("DecoderMaskedMultiHeadAttention",
                   [q_u3, key3, value3, "", bias, keys_read, t["values_out"], past], presents,
                   domain=MICROSOFT, num_heads=h, scale=1.0, past_present_share_buffer=1)
    total = nodes.const(f"total_length_{slots}", slots, np.int32)  # gqa
    return add("GroupQueryAttention",
               [q_u3, key3, value3, keys_read, t["values_out"], t["seqlens"], total, "", "", "",
                bias], presents, domain=MICROSOFT, num_heads=h, kv_num_heads=h, scale=1.0)
