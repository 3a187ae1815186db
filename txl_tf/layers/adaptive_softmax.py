"""Adaptive log-softmax (Grave et al.) with weights tied to the adaptive input."""
import keras
import tensorflow as tf

from txl_tf.checks.numpy_checks import InputError, out_of_range_message
from txl_tf.errors import TxlError
from txl_tf.keras_support.untracked import Untracked
from txl_tf.layers.adaptive_embedding import bin_bounds, check_sizes
from txl_tf.layers.init import normal
from txl_tf.layers.tail_nll import tail_nll
from txl_tf.layers.xla_context import compiling_with_xla


@keras.saving.register_keras_serializable(package="txl_tf")
class AdaptiveLogSoftmax(keras.layers.Layer):
    """Hidden states `[..., d_model]` → log-probabilities or target NLL.

    The head scores the shortlist (ids below `cutoffs[0]`) and one cluster per
    tail bin; tail bin i (i >= 1) uses head column `cutoffs[0] + i - 1`, as in
    the paper's TF code and its released checkpoints. With `tie_weight` the
    output tables are the embedding's; `tie_projs[i]` reuses the embedding's
    projection of bin i. Untied projections exist where the paper's code makes
    them (none when the bin is already `d_model` wide and `div_val == 1` or
    not `proj_same_dim`).

    `layer(hidden)` gives float32 log-probs over the whole vocabulary;
    `layer(hidden, target)` gives float32 NLL of the targets without building
    full-vocabulary logits (tail bins only score the positions whose target
    falls in them; under XLA, which needs static shapes, in chunks of a fixed
    size: `layers.tail_nll`).
    """

    def __init__(self, n_token, d_embed, d_model, *, cutoffs=(), div_val=1, tie_weight=True,
                 tie_projs=None, proj_same_dim=True, init_std=0.02, proj_init_std=0.01,
                 embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.n_token, self.d_embed, self.d_model, self.cutoffs, self.div_val = check_sizes(
            n_token, d_embed, d_model, cutoffs, div_val)
        self.tie_weight = bool(tie_weight)
        n_bins = len(self.cutoffs) + 1
        self.tie_projs = [True] * n_bins if tie_projs is None else [bool(t) for t in tie_projs]
        if len(self.tie_projs) != n_bins:
            raise TxlError(f"tie_projs needs {n_bins} flags, got {self.tie_projs}")
        self.proj_same_dim = bool(proj_same_dim)
        self.init_std, self.proj_init_std = float(init_std), float(proj_init_std)
        if embedding is None and (self.tie_weight or any(self.tie_projs)):
            raise TxlError("tie_weight / tie_projs need the AdaptiveEmbedding to tie to "
                           "(pass embedding=...)")
        if embedding is not None and (self.tie_weight or any(self.tie_projs)):
            mine = (self.n_token, self.d_embed, self.d_model, self.cutoffs, self.div_val)
            theirs = tuple(getattr(embedding, name, None) for name in
                           ("n_token", "d_embed", "d_model", "cutoffs", "div_val"))
            if mine != theirs:
                raise TxlError(f"the tied embedding has (n_token, d_embed, d_model, cutoffs, "
                               f"div_val) = {theirs}, this softmax {mine}: they must agree")
        # Held outside Keras tracking: the tied weights belong to the embedding.
        self._tied = Untracked(embedding)
        self.bounds = bin_bounds(self.n_token, self.cutoffs)
        self.build()

    # ----------------------------------------------------------------- weights
    def build(self, input_shape=None):
        self.tables, self.projs, self.biases = [], [], []
        if not self.tie_weight:
            if self.div_val == 1:
                own = self.add_weight(name="weight", shape=(self.n_token, self.d_embed),
                                      initializer=normal(self.init_std))
                self.tables = [own]
            else:
                self.tables = [self.add_weight(
                    name=f"cutoff_{i}_weight", shape=(high - low, self._dim(i)),
                    initializer=normal(self.init_std))
                    for i, (low, high) in enumerate(self.bounds)]
        for i, (low, high) in enumerate(self.bounds):
            if self.tie_projs[i]:
                proj = None  # read from the embedding by _proj(i)
            elif (self.div_val == 1 or not self.proj_same_dim) and self._dim(i) == self.d_model:
                proj = None
            else:
                proj = self.add_weight(name=f"cutoff_{i}_proj", shape=(self._dim(i), self.d_model),
                                       initializer=normal(self.proj_init_std))
            self.projs.append(proj)
            name = "bias" if not self.cutoffs else f"cutoff_{i}_b"
            self.biases.append(self.add_weight(name=name, shape=(high - low,),
                                               initializer="zeros"))
        n_clusters = len(self.cutoffs)
        if n_clusters:
            self.cluster_weight = self.add_weight(
                name="cluster_W", shape=(n_clusters, self.d_embed), initializer="zeros")
            self.cluster_bias = self.add_weight(
                name="cluster_b", shape=(n_clusters,), initializer="zeros")
        self.built = True

    def _dim(self, i):
        return self.d_embed // self.div_val ** i

    def _proj(self, i):
        if self.tie_projs[i]:
            return self._tied.value.projs[0 if self.div_val == 1 else i]
        return self.projs[i]

    def _table(self, i):
        tables = self._tied.value.tables if self.tie_weight else self.tables
        if self.div_val == 1:
            low, high = self.bounds[i]
            return tables[0][low:high]
        return tables[i]

    def _bin_weights(self, i):
        """Bin i's (projection or None, output weight `[n, d_embed_i]`, bias) in
        the compute dtype; the head's weight and bias end with the clusters'."""
        dtype = self.compute_dtype
        proj = self._proj(i)
        weight, bias = tf.cast(self._table(i), dtype), tf.cast(self.biases[i], dtype)
        if i == 0 and self.cutoffs:
            weight = tf.concat([weight, tf.cast(self.cluster_weight, dtype)], axis=0)
            bias = tf.concat([bias, tf.cast(self.cluster_bias, dtype)], axis=0)
        return (None if proj is None else tf.cast(proj, dtype)), weight, bias

    def decode_weights(self):
        """Every bin's weights as `log_probs(..., weights=)` takes them,
        transposed to `[in, out]`. A decoding loop makes them once, before
        the loop: under XLA on a CPU, a transposed operand makes each step's
        output matmul several times slower."""
        out = []
        for i in range(len(self.bounds)):
            proj, weight, bias = self._bin_weights(i)
            out.append((None if proj is None else tf.transpose(proj), tf.transpose(weight), bias))
        return tuple(out)

    def _logits(self, hidden, i, weights=None):
        """float32 logits of bin i (with the cluster logits appended for the head)."""
        if weights is not None:
            proj_t, weight_t, bias = weights[i]
            out = hidden if proj_t is None else tf.matmul(hidden, proj_t)
            return tf.cast(tf.matmul(out, weight_t) + bias, tf.float32)
        proj, weight, bias = self._bin_weights(i)
        out = hidden if proj is None else tf.matmul(hidden, proj, transpose_b=True)
        return tf.cast(tf.matmul(out, weight, transpose_b=True) + bias, tf.float32)

    # ---------------------------------------------------------------- outputs
    def call(self, hidden, target=None):
        hidden = tf.convert_to_tensor(hidden)
        if not hidden.dtype.is_floating or not hidden.shape[-1:].is_compatible_with(
                [self.d_model]):
            raise InputError(f"hidden must be floating point [..., d_model={self.d_model}], got "
                             f"{hidden.dtype.name} of shape {hidden.shape}")
        if target is None:
            return self.log_probs(hidden)
        target = tf.convert_to_tensor(target)
        if not target.dtype.is_integer:  # a cast would floor 1.7 to id 1
            raise InputError(f"target must be integer ids, got dtype {target.dtype.name}")
        if not target.shape.is_compatible_with(hidden.shape[:-1]):
            raise InputError(f"target has shape {target.shape} but hidden has "
                             f"{hidden.shape}: one target per hidden state")
        if tf.executing_eagerly():  # out of range: a wrong NLL or TensorFlow's error
            problem = out_of_range_message(target.numpy(), self.n_token, "target")
            if problem:
                raise InputError(problem)
        return self.nll(hidden, target)

    def log_probs(self, hidden, weights=None):
        """float32 `[..., n_token]` log-probabilities (`weights`: from
        `decode_weights`, for `hidden` of rank 2)."""
        if weights is None and self._one_table():
            bins = self._one_table_logits(hidden)
        else:
            bins = [self._logits(hidden, i, weights) for i in range(len(self.bounds))]
        head = tf.nn.log_softmax(bins[0], axis=-1)
        if not self.cutoffs:
            return head
        shortlist = self.cutoffs[0]
        parts = [head[..., :shortlist]]
        for i in range(1, len(self.bounds)):
            tail = tf.nn.log_softmax(bins[i], axis=-1)
            parts.append(tail + head[..., shortlist + i - 1:shortlist + i])
        return tf.concat(parts, axis=-1)

    def _one_table(self):
        """Whether every bin scores against rows of one table through one
        projection (`div_val == 1` and the same projection, or none, in
        every bin)."""
        return self.div_val == 1 and len({id(self._proj(i))
                                          for i in range(len(self.bounds))}) == 1

    def _one_table_logits(self, hidden):
        """Each bin's float32 logits (the head's with the cluster logits
        appended), as `_logits` gives them, from one matmul against the whole
        table (`_one_table`). Slicing the table into bins instead copies it
        at every call in TensorFlow's runtime (its rows are not 64-byte
        aligned): 440 MB a step at `wt103_base`."""
        dtype = self.compute_dtype
        proj = self._proj(0)
        out = hidden if proj is None else tf.matmul(hidden, tf.cast(proj, dtype), transpose_b=True)
        tables = self._tied.value.tables if self.tie_weight else self.tables
        bias = tf.cast(tf.concat(self.biases, 0), dtype)
        logits = tf.cast(tf.matmul(out, tf.cast(tables[0], dtype), transpose_b=True) + bias,
                         tf.float32)
        if not self.cutoffs:
            return [logits]
        clusters = tf.cast(tf.matmul(out, tf.cast(self.cluster_weight, dtype), transpose_b=True)
                           + tf.cast(self.cluster_bias, dtype), tf.float32)
        head = tf.concat([logits[..., :self.cutoffs[0]], clusters], -1)
        return [head] + [logits[..., low:high] for low, high in self.bounds[1:]]

    def nll(self, hidden, target):
        """float32 negative log-likelihood of `target` (same leading shape)."""
        target = tf.cast(target, tf.int32)
        if not self.cutoffs:
            logits = self._logits(hidden, 0)
            return tf.nn.sparse_softmax_cross_entropy_with_logits(target, logits)
        out_shape = tf.shape(target)
        hidden = tf.reshape(hidden, [-1, self.d_model])
        target = tf.reshape(target, [-1])
        head = tf.nn.log_softmax(self._logits(hidden, 0), axis=-1)
        shortlist = self.cutoffs[0]
        # The indices are int64: TensorFlow keeps the int32 math of a GPU in
        # host memory, so int32 indices made on the GPU (a select, a gather)
        # would be copied to the host at each step (tests/test_gpu_kernels.py).
        ids = tf.cast(target, tf.int64)
        in_head = ids < shortlist
        head_target = tf.where(in_head, ids, shortlist + tf.zeros_like(ids))
        # Tail targets point at their cluster column of the head.
        for i, (low, high) in enumerate(self.bounds[1:], start=1):
            in_bin = (ids >= low) & (ids < high)
            head_target = tf.where(in_bin, tf.constant(shortlist + i - 1, tf.int64), head_target)
        nll = -tf.gather(head, head_target, batch_dims=1)
        if compiling_with_xla() and hidden.shape[0] is not None:  # static: in chunks
            for i, (low, high) in enumerate(self.bounds[1:], start=1):
                nll += tail_nll(hidden, target, low, high, *self._bin_weights(i))
        elif compiling_with_xla():
            nll += self._tail_nll_all_rows(hidden, target)
        else:
            for i, (low, high) in enumerate(self.bounds[1:], start=1):
                rows = tf.where((ids >= low) & (ids < high))[:, 0]
                tail = tf.nn.log_softmax(self._logits(tf.gather(hidden, rows), i), axis=-1)
                picked = tf.gather(tail, tf.gather(ids, rows) - low, batch_dims=1)
                nll = tf.tensor_scatter_nd_sub(nll, rows[:, None], picked)
        return tf.reshape(nll, out_shape)

    def _tail_nll_all_rows(self, hidden, target):
        """The tail bins' share of the NLL `[N]` in static shapes, for XLA
        where the row count is not known when traced (`tail_nll` where it
        is): every bin scores every row (0 where the target is in another bin),
        and the target's logit is picked by a one-hot product, which XLA
        fuses into the softmax and its gradient. The selection of the rows
        (`tf.where`) would be compiled with shapes bounded by N: the same
        scores, and a scatter of `[N, bin size]` in the gradient besides."""
        nll = tf.zeros(tf.shape(target), tf.float32)
        for i, (low, high) in enumerate(self.bounds[1:], start=1):
            logits = self._logits(hidden, i)
            picked = tf.reduce_sum(logits * tf.one_hot(target - low, high - low), -1)
            in_bin = (target >= low) & (target < high)
            nll += tf.where(in_bin, tf.reduce_logsumexp(logits, -1) - picked, 0.0)
        return nll

    def get_config(self):
        return {**super().get_config(), "n_token": self.n_token, "d_embed": self.d_embed,
                "d_model": self.d_model, "cutoffs": self.cutoffs, "div_val": self.div_val,
                "tie_weight": self.tie_weight, "tie_projs": self.tie_projs,
                "proj_same_dim": self.proj_same_dim, "init_std": self.init_std,
                "proj_init_std": self.proj_init_std}

    @classmethod
    def from_config(cls, config):
        """The layer `get_config` describes, where nothing is tied (a tied
        softmax shares the weights of an embedding its config cannot name).

        Args:
            config: `get_config`'s dict.

        Returns:
            An `AdaptiveLogSoftmax`.

        Raises:
            TxlError: a tied config (names what to use to copy a model:
                `keras.models.clone_model` rebuilds a model layer by layer).
        """
        if config.get("tie_weight", True) or any(config.get("tie_projs") or [True]):
            raise TxlError(
                "an AdaptiveLogSoftmax whose weights are tied to the embedding cannot be "
                "rebuilt from its config alone, as keras.models.clone_model rebuilds a model "
                "layer by layer: copy a Transformer-XL model with "
                "type(model).from_config(model.get_config()) (fresh weights, then "
                "set_weights(model.get_weights())), or save and load it")
        return super().from_config(config)
