"""The decode cache's ring in its three backends: TensorFlow
(`txl_tf.layers.ring_cache`, the core's write and read), numpy (the export
runtimes' host cache, `export.decode_cache.write_token`, `in_time_order`) and
ONNX (the device ring, `export.device_cache.ring_write_model`,
`ring_memory_model`, on ONNX Runtime's CPU provider), driven through the
same writes and reads. Each is checked against the memory this test keeps
itself, in time order: after a step, a stopped row's memory is what it was,
a live row's is the one before shifted by one with the new token's state
last (and its slot valid), never against another backend."""
import numpy as np
import onnxruntime as ort
import tensorflow as tf

from export.decode_cache import SLOT_AXES, host_cache, in_time_order, write_token
from export.device_cache import ortvalue, ring_memory_model, ring_write_model, write_on_device
from txl_tf.layers import ring_cache
from txl_tf.layers.ring_cache import (RING_AXES, CachedToken, DecodeCache, flat_cache,
                                      ring_memory, swap_key_layout)

LAYERS, BATCH, SIZE, D_MODEL, HEADS, D_HEAD = 2, 3, 5, 4, 2, 3
RINGS = ("cache_mems", "keys", "values", "valid")
TOKENS = {"cache_mems": "token_mems", "keys": "token_keys", "values": "token_values"}
# The host layout's slot axis of each ring, as this test builds them below.
SLOT_AXIS = {"cache_mems": 2, "keys": 4, "values": 3, "valid": 1}


def tf_cache(host):
    """The TensorFlow `DecodeCache` of a host cache (per-layer tuples)."""
    layers = {name: tuple(tf.constant(layer) for layer in host[key])
              for name, key in (("mems", "cache_mems"), ("keys", "keys"),
                                ("values", "values"))}
    return DecodeCache(**layers, valid=tf.constant(host["valid"]),
                       slot=tf.constant(host["slot"]), row_slot=tf.constant(host["row_slot"]),
                       positions=tf.constant(host["positions"]))


def tf_as_host(cache):
    """A `DecodeCache` in the host's layout (`flat_cache`, as the exports do)."""
    flat = {name: value.numpy() for name, value in flat_cache(cache).items()}
    flat["cache_mems"] = flat.pop("mems")
    return flat


def by_time(ring, row_slot, name):
    """This test's own reading of a host-layout ring: `[L, B, M, ...]` (valid
    `[1, B, M]`), row b's slots `row_slot[b] + 1, ..., + M` (mod S), oldest
    first."""
    ring = np.moveaxis(ring[None] if name == "valid" else ring,
                       SLOT_AXIS[name] + (name == "valid"), 2)
    order = (np.asarray(row_slot)[:, None] + np.arange(1, SIZE)) % SIZE
    return np.stack([ring[:, b, order[b]] for b in range(BATCH)], 1)


def test_each_backend_keeps_stopped_rows_and_shifts_live_ones_by_one():
    rng = np.random.default_rng(7)
    assert SLOT_AXES == SLOT_AXIS == {"cache_mems": RING_AXES["mems"] + 1,
                                      "keys": RING_AXES["keys"] + 1,
                                      "values": RING_AXES["values"] + 1, "valid": 1}
    slot = 2
    start = {"cache_mems": rng.normal(size=[LAYERS, BATCH, SIZE, D_MODEL]),
             "keys": rng.normal(size=[LAYERS, BATCH, HEADS, D_HEAD, SIZE]),
             "values": rng.normal(size=[LAYERS, BATCH, HEADS, SIZE, D_HEAD]),
             "valid": rng.random([BATCH, SIZE]) < 0.6,
             "slot": np.array(slot, np.int32),
             "row_slot": np.full([BATCH], slot, np.int32),
             "positions": np.zeros([2 * SIZE, D_MODEL])}
    start = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in start.items()}
    # The memory each row holds, in time order, kept here step by step.
    want = {name: by_time(start[name], start["row_slot"], name) for name in RINGS}
    want_row_slot = start["row_slot"].copy()

    host = host_cache(start)
    tf_ring = tf_cache(start)
    device = {name: ortvalue(value.copy(), "cpu") for name, value in start.items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    writer = ort.InferenceSession(ring_write_model(SIZE).SerializeToString(), options,
                                  providers=["CPUExecutionProvider"])
    reader = ort.InferenceSession(ring_memory_model(SIZE).SerializeToString(), options,
                                  providers=["CPUExecutionProvider"])

    # Rows stop for good, as generation's do: none stopped for two steps, then
    # row 1, row 2 and last row 0 (a step where every row is stopped); a
    # stopped row's free slot stays behind as the ring wraps past it.
    stop_at = np.array([7, 2, 4])
    for step in range(8):
        stopped = step >= stop_at
        live = ~stopped
        token = {"token_mems": rng.normal(size=[LAYERS, BATCH, D_MODEL]),
                 "token_keys": rng.normal(size=[LAYERS, BATCH, HEADS, D_HEAD]),
                 "token_values": rng.normal(size=[LAYERS, BATCH, HEADS, D_HEAD])}
        token = {k: v.astype(np.float32) for k, v in token.items()}
        write_token(host, token, stopped)
        tf_ring = ring_cache.write_token(
            tf_ring, CachedToken(*(tuple(tf.unstack(token[k])) for k in
                                   ("token_mems", "token_keys", "token_values"))),
            tf.constant(stopped))
        write_on_device(writer, "cpu", device, token, stopped)

        newest = {**{name: token[TOKENS[name]] for name in TOKENS},
                  "valid": np.ones([1, BATCH], bool)}
        for name in RINGS:
            want[name][:, live] = np.concatenate(
                [want[name][:, live, 1:], newest[name][:, live, None]], 2)
        want_slot = (slot + step + 1) % SIZE
        want_row_slot[live] = want_slot

        backends = {"numpy": host, "tf": tf_as_host(tf_ring),
                    "onnx": {name: device[name].numpy() for name in host}}
        for backend, cache in backends.items():
            where = f"step {step}: {backend}"
            assert int(cache["slot"]) == want_slot, where
            np.testing.assert_array_equal(cache["row_slot"], want_row_slot, err_msg=where)
            for name in RINGS:
                np.testing.assert_array_equal(by_time(cache[name], want_row_slot, name),
                                              want[name], err_msg=f"{where} {name}")

        # Each backend's own reading of the memory, oldest first.
        mems, mask = want["cache_mems"], want["valid"][0]
        memory = ring_memory(tf_ring)
        for backend, (got_mems, got_mask) in {
                "numpy": (in_time_order(host["cache_mems"], host["row_slot"], 2),
                          in_time_order(host["valid"], host["row_slot"], 1)),
                "tf": (memory.mems.numpy(), memory.mem_mask.numpy()),
                "onnx": reader.run(None, {name: device[name].numpy()
                                          for name in ("cache_mems", "valid", "row_slot")}),
        }.items():
            np.testing.assert_array_equal(got_mems, mems, err_msg=f"step {step}: {backend}")
            np.testing.assert_array_equal(got_mask, mask, err_msg=f"step {step}: {backend}")
        # Keys and values as the core's segment read takes them.
        for name, ring in (("keys", tf_ring.keys), ("values", tf_ring.values)):
            for i, layer in enumerate(ring):
                rows = swap_key_layout(layer) if name == "keys" else layer
                got = ring_cache.in_time_order(rows, tf_ring, 2).numpy()
                np.testing.assert_array_equal(np.moveaxis(got, 2, 1), want[name][i],
                                              err_msg=f"step {step}: tf {name}")
    assert want_slot == (slot + 8) % SIZE and want_row_slot.tolist() == [
        (slot + 7) % SIZE, (slot + 2) % SIZE, (slot + 4) % SIZE]  # the ring wrapped past them
