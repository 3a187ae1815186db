"""Adaptive input embedding (Baevski & Auli): smaller tables for rarer bins."""
import keras
import tensorflow as tf

from txl_tf.checks.numpy_checks import InputError, check_count, out_of_range_message
from txl_tf.errors import TxlError
from txl_tf.layers.init import normal
from txl_tf.layers.onnx_forms import onnx_forms

# The largest table (bytes) an ONNX graph gathers scaled (`AdaptiveEmbedding`):
# ONNX Runtime folds the scaled table into a copy of its own at load, in each
# session that folds constants (one that does not scales it at every call); a
# larger table (wt103_base's, 439 MB) keeps the Mul after its gather.
SCALED_TABLE_MAX_BYTES = 4 * 2 ** 20


def bin_bounds(n_token, cutoffs):
    """`[(0, c0), (c0, c1), ..., (c_last, n_token)]`."""
    ends = [0, *cutoffs, n_token]
    return list(zip(ends[:-1], ends[1:]))


def check_sizes(n_token, d_embed, d_model, cutoffs, div_val):
    """`(n_token, d_embed, d_model, cutoffs, div_val)` as ints, or
    `TxlError` naming the first that an adaptive layer cannot be built with."""
    sizes = [check_count(name, value, low=1) for name, value in
             (("n_token", n_token), ("d_embed", d_embed), ("d_model", d_model),
              ("div_val", div_val))]
    n_token, d_embed, d_model, div_val = sizes
    ends = [0, *(check_count("cutoffs", c, low=1) for c in cutoffs), n_token]
    if any(low >= high for low, high in zip(ends[:-1], ends[1:])):
        raise TxlError(f"cutoffs must be strictly increasing and inside (0, n_token="
                       f"{n_token}), got {list(cutoffs)}")
    if d_embed // div_val ** len(cutoffs) < 1:
        raise TxlError(f"d_embed={d_embed} // div_val={div_val}**{len(cutoffs)} leaves a bin "
                       "with no embedding dimension")
    return n_token, d_embed, d_model, ends[1:-1], div_val


@keras.saving.register_keras_serializable(package="txl_tf")
class AdaptiveEmbedding(keras.layers.Layer):
    """Token ids `[B, T]` → `[B, T, d_model]`, multiplied by `sqrt(d_model)`.

    With `div_val == 1` there is one table `[n_token, d_embed]` and a
    projection to `d_model` only when the widths differ. With `div_val > 1`
    bin i (split at `cutoffs`) has a table of width `d_embed // div_val**i` and
    a projection (`proj_same_dim` keeps it even when the width is `d_model`).
    Lookups use gathers with static shapes (no boolean masks), so the layer
    compiles with XLA and exports. `tables` and `projs` (None where absent) are
    exposed for weight tying by the adaptive softmax.
    """

    def __init__(self, n_token, d_embed, d_model, *, cutoffs=(), div_val=1,
                 proj_same_dim=True, init_std=0.02, proj_init_std=0.01, **kwargs):
        super().__init__(**kwargs)
        self.n_token, self.d_embed, self.d_model, self.cutoffs, self.div_val = check_sizes(
            n_token, d_embed, d_model, cutoffs, div_val)
        self.proj_same_dim = bool(proj_same_dim)
        self.init_std, self.proj_init_std = float(init_std), float(proj_init_std)
        self.emb_scale = self.d_model ** 0.5
        self.build()

    def build(self, input_shape=None):
        self.tables, self.projs = [], []
        table_init, proj_init = normal(self.init_std), normal(self.proj_init_std)
        if self.div_val == 1:
            self.tables.append(self.add_weight(
                name="lookup_table", shape=(self.n_token, self.d_embed),
                initializer=table_init))
            self.projs.append(None if self.d_embed == self.d_model else self.add_weight(
                name="proj_W", shape=(self.d_embed, self.d_model), initializer=proj_init))
        else:
            for i, (low, high) in enumerate(bin_bounds(self.n_token, self.cutoffs)):
                dim = self.d_embed // self.div_val ** i
                self.tables.append(self.add_weight(
                    name=f"cutoff_{i}_lookup_table", shape=(high - low, dim),
                    initializer=table_init))
                skip = dim == self.d_model and not self.proj_same_dim
                self.projs.append(None if skip else self.add_weight(
                    name=f"cutoff_{i}_proj_W", shape=(dim, self.d_model),
                    initializer=proj_init))
        self.built = True

    def _lookup(self, table, proj, ids):
        out = tf.gather(tf.cast(table, self.compute_dtype), ids)
        if proj is not None:
            out = tf.matmul(out, tf.cast(proj, self.compute_dtype))
        return out

    def call(self, token_ids):
        token_ids = tf.convert_to_tensor(token_ids)
        if not token_ids.dtype.is_integer:  # a cast would floor 1.7 to id 1
            raise InputError(f"token_ids must be integers, got dtype {token_ids.dtype.name}")
        if tf.executing_eagerly():  # a gather on GPU, or a bin's clip, would give a wrong row
            problem = out_of_range_message(token_ids.numpy(), self.n_token)
            if problem:
                raise InputError(problem)
        token_ids = tf.cast(token_ids, tf.int32)
        if self._gathers_scaled_table():
            # The same products, taken on the table: one kernel less per step.
            scale = tf.cast(self.emb_scale, self.compute_dtype)
            return tf.gather(tf.cast(self.tables[0], self.compute_dtype) * scale, token_ids)
        if self.div_val == 1:
            out = self._lookup(self.tables[0], self.projs[0], token_ids)
        else:
            out = 0.0
            # The bins' index math in int64: TensorFlow keeps the int32 math of a
            # GPU on the host, which then copies each bin's mask and indices to the
            # GPU (tests/test_gpu_kernels.py); int64 ids are copied there once. ONNX
            # Runtime keeps int32 on the GPU: its graphs skip the cast (a kernel).
            ids = token_ids if onnx_forms() else tf.cast(token_ids, tf.int64)
            for (low, high), table, proj in zip(bin_bounds(self.n_token, self.cutoffs),
                                                self.tables, self.projs):
                in_bin = (ids >= low) & (ids < high)
                local = tf.clip_by_value(ids - low, 0, high - low - 1)
                out += self._lookup(table, proj, local) * tf.cast(
                    in_bin, self.compute_dtype)[..., None]
        return out * tf.cast(self.emb_scale, self.compute_dtype)

    def _gathers_scaled_table(self):
        """Whether `call` gathers from the scaled table: traced for ONNX
        (`onnx_forms`), which folds it at load (elsewhere it would be scaled
        again at every call), one table of at most `SCALED_TABLE_MAX_BYTES`
        and no projection, in float32 (a float16 step's Mul runs unrounded in
        float32 on ONNX Runtime's CPU provider: a table scaled in float16
        would change its results there)."""
        return (onnx_forms() and self.div_val == 1 and self.projs[0] is None
                and self.compute_dtype == "float32"
                and self.n_token * self.d_embed * 4 <= SCALED_TABLE_MAX_BYTES)

    def get_config(self):
        return {**super().get_config(), "n_token": self.n_token, "d_embed": self.d_embed,
                "d_model": self.d_model, "cutoffs": self.cutoffs, "div_val": self.div_val,
                "proj_same_dim": self.proj_same_dim, "init_std": self.init_std,
                "proj_init_std": self.proj_init_std}
