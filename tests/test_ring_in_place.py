"""Under XLA a decoding loop updates the ring in place: the compiled
`tf.while_loop` body holds no copy of a ring (`ring_cache.after` orders each
step's write after its reads; without it XLA keeps the old ring for the
reads by copying the whole ring every step). A property of the compiled
graph, read from its optimized HLO: no timing."""
import re

import tensorflow as tf

from test_core import ids, make_core

BATCH, MEM_LEN, STEPS = 2, 7, 4


def while_body_ops(hlo):
    """The instruction lines of each `while` body computation of `hlo`."""
    bodies = set(re.findall(r"while\(.*body=%?([\w.\-]+)", hlo))
    lines, computation = [], None
    for line in hlo.splitlines():
        header = re.match(r"%?([\w.\-]+) .*\{\s*$", line)
        if header and not line.startswith(" "):
            computation = header.group(1)
        elif computation in bodies:
            lines.append(line)
    assert bodies and lines, "no while body in the compiled loop"
    return lines


def copies_of(lines, shape):
    """How many of `lines` copy a tensor of `shape` (HLO's `f32[...]`)."""
    pattern = re.compile(r"= " + re.escape(shape) + r"(\{[^}]*\})? copy\(")
    return sum(bool(pattern.search(line)) for line in lines)


def test_a_compiled_decoding_loop_copies_no_ring():
    core = make_core()
    cfg, size = core.config, MEM_LEN + 1
    cache = core.decode_cache(core.initial_memory(BATCH, mem_len=MEM_LEN))

    @tf.function(jit_compile=True)
    def loop(cache, token_ids):
        def step(i, cache):
            return i + 1, core.call_with_cache(token_ids, cache)[1]
        return tf.while_loop(lambda i, _: i < STEPS, step, (tf.constant(0), cache))[1]

    token_ids = tf.constant(ids(BATCH, 1)[:, 0])
    hlo = loop.experimental_get_compiler_ir(cache, token_ids)(stage="optimized_hlo")
    body = while_body_ops(hlo)
    rings = {"mems": [BATCH, size, cfg.d_model],
             "keys": [BATCH, cfg.n_head, cfg.d_head, size],
             "values": [BATCH, cfg.n_head, size, cfg.d_head]}
    for name, dims in rings.items():
        shape = f"f32[{','.join(map(str, dims))}]"
        assert copies_of(body, shape) == 0, f"the loop copies the {name} ring {shape}"
