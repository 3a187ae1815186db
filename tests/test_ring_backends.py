"""The decode cache's ring in its three backends: TensorFlow
(`txl_tf.layers.ring_cache`, the core's write and read), numpy (the export
runtimes' host cache, `export.decode_cache.write_token`, `in_time_order`) and
ONNX (the device ring, `ring_write_model`, `ring_memory_model`, on ONNX
Runtime's CPU provider), driven through the same writes and reads: they copy
the same values, so they agree exactly."""
import numpy as np
import onnxruntime as ort
import tensorflow as tf

from export.decode_cache import (SLOT_AXES, host_cache, in_time_order, ortvalue,
                                 ring_memory_model, ring_write_model, write_on_device,
                                 write_token)
from txl_tf.layers import ring_cache
from txl_tf.layers.ring_cache import (RING_AXES, CachedToken, DecodeCache, flat_cache,
                                      ring_memory, swap_key_layout)

LAYERS, BATCH, SIZE, D_MODEL, HEADS, D_HEAD = 2, 3, 5, 4, 2, 3
RINGS = ("cache_mems", "keys", "values", "valid")


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


def time_ordered(host_ring, row_slot, name):
    """A host ring (keys and values moved to `[L, B, S, ...]`) in time order."""
    moved = np.moveaxis(host_ring, SLOT_AXES[name], 2)
    return in_time_order(np.ascontiguousarray(moved), row_slot, 2)


def test_the_three_backends_write_and_read_the_ring_alike():
    rng = np.random.default_rng(7)
    assert SLOT_AXES == {"cache_mems": RING_AXES["mems"] + 1, "keys": RING_AXES["keys"] + 1,
                         "values": RING_AXES["values"] + 1, "valid": 1}
    slot = 2
    start = {"cache_mems": rng.normal(size=[LAYERS, BATCH, SIZE, D_MODEL]),
             "keys": rng.normal(size=[LAYERS, BATCH, HEADS, D_HEAD, SIZE]),
             "values": rng.normal(size=[LAYERS, BATCH, HEADS, SIZE, D_HEAD]),
             "valid": rng.random([BATCH, SIZE]) < 0.6,
             "slot": np.array(slot, np.int32),
             # a row on the ring's slot, two that stopped at other slots
             "row_slot": np.array([slot, 0, SIZE - 1], np.int32),
             "positions": np.zeros([2 * SIZE, D_MODEL])}
    start = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in start.items()}
    host = host_cache(start)
    tf_ring = tf_cache(start)
    device = {name: ortvalue(value.copy(), "cpu") for name, value in start.items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    writer = ort.InferenceSession(ring_write_model(SIZE).SerializeToString(), options,
                                  providers=["CPUExecutionProvider"])
    reader = ort.InferenceSession(ring_memory_model(SIZE).SerializeToString(), options,
                                  providers=["CPUExecutionProvider"])

    stops = rng.random([8, BATCH]) < 0.4
    stops[2], stops[5] = True, False  # a step where every row stops, one where none does
    for step, stopped in enumerate(stops):
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

        got = {"tf": tf_as_host(tf_ring),
               "onnx": {name: device[name].numpy() for name in host}}
        for backend, cache in got.items():
            for name in RINGS + ("slot", "row_slot"):
                np.testing.assert_array_equal(cache[name], host[name],
                                              err_msg=f"step {step}: {backend} {name}")

        # The memory read back in time order, oldest first.
        mems = in_time_order(host["cache_mems"], host["row_slot"], SLOT_AXES["cache_mems"])
        mask = in_time_order(host["valid"], host["row_slot"], SLOT_AXES["valid"])
        live = ~stopped
        np.testing.assert_array_equal(mems[:, live, -1], token["token_mems"][:, live])
        assert mask[live, -1].all()
        memory = ring_memory(tf_ring)
        device_memory = reader.run(None, {name: device[name].numpy()
                                          for name in ("cache_mems", "valid", "row_slot")})
        for backend, (got_mems, got_mask) in {
                "tf": (memory.mems.numpy(), memory.mem_mask.numpy()),
                "onnx": device_memory}.items():
            np.testing.assert_array_equal(got_mems, mems, err_msg=f"step {step}: {backend}")
            np.testing.assert_array_equal(got_mask, mask, err_msg=f"step {step}: {backend}")
        # Keys and values as the core's segment read takes them.
        for name, ring in (("keys", tf_ring.keys), ("values", tf_ring.values)):
            want = time_ordered(host[name], host["row_slot"], name)
            for i, layer in enumerate(ring):
                rows = swap_key_layout(layer) if name == "keys" else layer
                got_layer = ring_cache.in_time_order(rows, tf_ring, 2).numpy()
                np.testing.assert_array_equal(np.moveaxis(got_layer, 2, 1), want[i],
                                              err_msg=f"step {step}: tf {name}")
    assert int(host["slot"]) == (slot + len(stops)) % SIZE  # the ring wrapped
