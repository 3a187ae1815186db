"""Weights by the paper's TF variable names, in `.npz` files and from the paper's TF checkpoints.

Every weight of a `TransformerXL` has a name of the paper's TF code
(`transformer/layer_0/rel_attn/qkv/kernel`, ...), so weights saved here, a
converted TF checkpoint and the numpy reference in the tests share one layout.
Files are `.npz` archives read with `allow_pickle=False`: no pickle anywhere.
"""
import functools
import os
import tokenize
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from txl_tf.app.files import remove_leftovers, temporary_path
from txl_tf.errors import TxlError
from txl_tf.layers.init import skip_random_init

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.npz"
VOCAB_DIR = "vocab"


class FusedColumns:
    """Kernels that the paper's code keeps as one (`qkv`), side by side: it
    reads as their concatenation along the columns and assigns by splitting.

    Args:
        **parts: the kernels (Keras variables `[rows, cols]`) in column order.
    """

    def __init__(self, **parts):
        self.parts = parts
        first = next(iter(parts.values()))
        self.dtype = first.dtype
        self.shape = (first.shape[0], sum(part.shape[1] for part in parts.values()))

    def numpy(self):
        return np.concatenate([np.asarray(part.numpy()) for part in self.parts.values()], axis=1)

    def assign(self, value):
        bounds = np.cumsum([part.shape[1] for part in self.parts.values()])[:-1]
        for part, columns in zip(self.parts.values(), np.split(value, bounds, axis=1)):
            assign_in_place(part, np.ascontiguousarray(columns))


def adapted_layers(model):
    """The layers of `model` (a Keras layer or model) that a copy built from
    its config would not reproduce.

    Args:
        model: a Keras layer or model.

    Returns:
        `[(layer path, "LoRA" or the quantization mode, e.g. "int8")]`,
        in the order `model` holds them.
    """
    return [(layer.path, getattr(layer, "quantization_mode", None) or "LoRA")
            for layer in model._flatten_layers()
            if getattr(layer, "quantization_mode", None)
            or getattr(layer, "lora_enabled", False)]


def _plain_kernel(dense):
    """`dense`'s float kernel variable; adapted or quantized kernels have no
    place in the paper's layout."""
    if dense.quantization_mode is not None or getattr(dense, "lora_enabled", False):
        raise TxlError(
            f"{dense.path} is {'quantized' if dense.quantization_mode else 'LoRA-adapted'}: "
            "the weights file holds plain float weights; save this model with "
            "save_to_preset (keras-hub) or model.save(...keras) instead")
    return dense.kernel


def reference_names(core):
    """Ordered `{tf_name: variable}` for every weight of `core` (the attention's
    `qkv` kernel is a `FusedColumns` of its query, key and value)."""
    cfg = core.config
    names = OrderedDict()
    emb, crit = core.word_emb, core.crit
    if cfg.div_val == 1:
        names["transformer/adaptive_embed/lookup_table"] = emb.tables[0]
        if emb.projs[0] is not None:
            names["transformer/adaptive_embed/proj_W"] = emb.projs[0]
    else:
        for i, (table, proj) in enumerate(zip(emb.tables, emb.projs)):
            names[f"transformer/adaptive_embed/cutoff_{i}/lookup_table"] = table
            if proj is not None:
                names[f"transformer/adaptive_embed/cutoff_{i}/proj_W"] = proj
    if cfg.attn_type == 0:
        names["transformer/r_w_bias"] = core.r_w_bias
        names["transformer/r_r_bias"] = core.r_r_bias
    elif cfg.attn_type == 1:  # per layer: embeddings, u and biases by distance
        names["transformer/r_emb"] = core.r_emb
        names["transformer/r_w_bias"] = core.r_w_bias
        names["transformer/r_bias"] = core.r_bias
    elif cfg.attn_type == 3:  # per layer: an embedding per position
        names["transformer/r_emb"] = core.r_emb
    for i, block in enumerate(core.blocks):
        prefix = f"transformer/layer_{i}"
        attn, ff = block.rel_attn, block.ff
        names[f"{prefix}/rel_attn/qkv/kernel"] = FusedColumns(
            query=_plain_kernel(attn.query), key=_plain_kernel(attn.key),
            value=_plain_kernel(attn.value))
        if hasattr(attn, "r_kernel"):  # attn_type 0
            names[f"{prefix}/rel_attn/r/kernel"] = attn.r_kernel
        names[f"{prefix}/rel_attn/o/kernel"] = _plain_kernel(attn.attention_output)
        names[f"{prefix}/rel_attn/LayerNorm/gamma"] = attn.layer_norm.gamma
        names[f"{prefix}/rel_attn/LayerNorm/beta"] = attn.layer_norm.beta
        names[f"{prefix}/ff/layer_1/kernel"] = _plain_kernel(ff.layer_1)
        names[f"{prefix}/ff/layer_1/bias"] = ff.layer_1.bias
        names[f"{prefix}/ff/layer_2/kernel"] = _plain_kernel(ff.layer_2)
        names[f"{prefix}/ff/layer_2/bias"] = ff.layer_2.bias
        names[f"{prefix}/ff/LayerNorm/gamma"] = ff.layer_norm.gamma
        names[f"{prefix}/ff/LayerNorm/beta"] = ff.layer_norm.beta
    soft = "transformer/adaptive_softmax"
    if not cfg.cutoffs:
        names[f"{soft}/bias"] = crit.biases[0]
    else:
        for i, bias in enumerate(crit.biases):
            names[f"{soft}/cutoff_{i}/b"] = bias
        names[f"{soft}/cutoff_0/cluster_W"] = crit.cluster_weight
        names[f"{soft}/cutoff_0/cluster_b"] = crit.cluster_bias
    for i, proj in enumerate(crit.projs):
        if proj is not None:
            names[f"{soft}/cutoff_{i}/proj"] = proj
    if not cfg.tie_weight:
        if cfg.div_val == 1:
            names[f"{soft}/weight"] = crit.tables[0]
        else:
            for i, table in enumerate(crit.tables):
                names[f"{soft}/cutoff_{i}/weight"] = table
    return names


def least_weights(config):
    """A lower bound of the weights of `config`'s model: its embedding tables
    and every layer's attention and feed-forward kernels."""
    bounds = [0, *config.cutoffs, config.n_token]
    tables = sum((b - a) * (config.d_embed // config.div_val ** i)
                 for i, (a, b) in enumerate(zip(bounds, bounds[1:])))
    d, heads = config.d_model, config.n_head * config.d_head
    return tables + config.n_layer * (4 * d * heads + 2 * d * config.d_inner)


def far_larger(config, held):
    """A message where `config`'s model needs more than twice the `held`
    weights a file holds, else None: a model of another size altogether (a
    config edited to n_token=10**9 would build gigabytes, then find the first
    weight's shape wrong) is refused before it is built; a near miss (a layer
    more) is built, and its missing weights named."""
    least = least_weights(config)
    if least <= 2 * held:
        return None
    return (f"the config's model has at least {least:,} weights, more than twice the "
            f"{held:,} the file holds (not one model's; nothing was built)")


def get_weights(core):
    """All weights, by the paper's TF variable names.

    Args:
        core: a `TransformerXL`.

    Returns:
        An ordered `{tf_name: numpy array}`.
    """
    return OrderedDict((k, np.asarray(v.numpy())) for k, v in reference_names(core).items())


def set_weights(core, arrays):
    """Assigns weights by the paper's TF variable names, in place.

    Args:
        core: a `TransformerXL`.
        arrays: `{tf_name: array}` (any mapping, read one weight at a time);
            names and shapes must match exactly, and every array be
            floating point.

    Raises:
        TxlError: a missing or unexpected name, a shape or dtype that does
            not fit.
    """
    names = reference_names(core)
    missing = sorted(set(names) - set(arrays))
    unexpected = sorted(set(arrays) - set(names))
    if missing or unexpected:
        raise TxlError(f"weights do not fit this model: missing {missing[:5]}"
                       f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                       f"{'...' if len(unexpected) > 5 else ''}")
    for name, variable in names.items():
        value = np.asarray(arrays[name])
        if tuple(value.shape) != tuple(variable.shape):
            raise TxlError(f"weight {name} has shape {value.shape}, the model expects "
                           f"{tuple(variable.shape)}")
        if value.dtype.kind != "f" and value.dtype.name != "bfloat16":  # ml_dtypes' is kind V
            raise TxlError(f"weight {name} holds {value.dtype} values, where a floating-point "
                           "weight belongs")
        cast = value.astype(variable.dtype, copy=False)
        if not _finite(cast):  # after the cast: 1e5 is inf in float16
            if not _finite(value):
                raise TxlError(f"weight {name} holds NaN or inf values (a damaged file, or "
                               "the weights of a run that diverged)")
            raise TxlError(f"weight {name} holds values beyond {variable.dtype}'s range "
                           f"(largest magnitude {float(np.abs(value).max()):g})")
        assign_in_place(variable, cast)
        del value, cast  # one weight in memory at a time, even for a lazy archive


_BLOCK_BYTES = 1 << 25


def _finite(value):
    """Whether every element of the numpy array `value` is finite, checked a
    block of rows at a time."""
    if value.ndim == 0:
        return bool(np.isfinite(value))
    rows = max(1, _BLOCK_BYTES // max(1, value[:1].nbytes))
    return all(np.isfinite(value[i:i + rows]).all() for i in range(0, len(value), rows))


def assign_in_place(variable, value):
    """`variable.assign(value)` for a numpy array, in blocks of rows written into
    the variable's own buffer.

    A whole-array `assign` converts the array to a tensor (two transient
    copies), and a sliced `variable[a:b].assign` first reads the variable,
    after which the update copies all of it; the in-place strided-slice
    assignment needs only one block beyond the variable.
    """
    if isinstance(variable, FusedColumns) or value.ndim == 0 or value.nbytes <= _BLOCK_BYTES:
        variable.assign(value)
        return
    import tensorflow as tf
    rows = max(1, _BLOCK_BYTES // (value.nbytes // len(value)))
    for start in range(0, len(value), rows):
        stop = min(start + rows, len(value))
        tf.raw_ops.ResourceStridedSliceAssign(ref=variable.handle, begin=[start], end=[stop],
                                              strides=[1], value=value[start:stop])


def _checkpoint_key(name):
    return name.replace("/", ".")


def weight_dict(core):
    """`{key: variable}`, one per variable, keyed by the TF names with `/`
    made checkpoint-key safe (a fused kernel's parts get their part's name
    appended): the `weights` object of a training checkpoint
    (`training.checkpointing`)."""
    weights = {}
    for name, variable in reference_names(core).items():
        if isinstance(variable, FusedColumns):
            weights.update({_checkpoint_key(f"{name}/{part}"): kernel
                            for part, kernel in variable.parts.items()})
        else:
            weights[_checkpoint_key(name)] = variable
    return weights


def restore_weights(core, path):
    """Loads only the weights of a training checkpoint `path` (a `ckpt-N`
    prefix or a directory holding checkpoints) into a bare core; checkpoints
    written before the attention's `qkv` kernel was split load too.

    Returns:
        The checkpoint prefix read.
    """
    import tensorflow as tf

    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(f"no checkpoint in {path}")
        path = latest
    reader = tf.train.load_checkpoint(path)
    available = reader.get_variable_to_shape_map()

    def stored(key):  # a checkpoint escapes "." in object names as ".."
        return f"weights/{key.replace('.', '..')}/.ATTRIBUTES/VARIABLE_VALUE"

    def read(key):
        full = stored(key)
        if full not in available:
            raise TxlError(f"checkpoint {path} has no weight {key!r}: is it this model's?")
        try:
            return reader.get_tensor(full)
        except IndexError as err:  # TensorFlow's reader on a data file cut short
            raise TxlError(f"checkpoint {path} cannot be read ({err}): is it truncated?") from None

    def read_fused(name, parts):
        return np.concatenate([read(_checkpoint_key(f"{name}/{part}")) for part in parts], 1)

    readers, expected, declared = {}, {}, {}
    for name, variable in reference_names(core).items():
        split = (isinstance(variable, FusedColumns)
                 and stored(_checkpoint_key(name)) not in available)
        readers[name] = (functools.partial(read_fused, name, list(variable.parts)) if split
                         else functools.partial(read, _checkpoint_key(name)))
        for label, part in (((f"{name}/{p}", v) for p, v in variable.parts.items()) if split
                            else [(name, variable)]):
            if stored(_checkpoint_key(label)) in available:  # shapes first: TF sizes by them
                expected[label] = part
                declared[label] = (tuple(available[stored(_checkpoint_key(label))]), None)
    check_shapes(expected, declared)
    set_weights(core, _Lazy(readers))
    return path


def save_weights(core, path):
    """Writes all weights to an `.npz` file keyed by TF names, through a
    temporary file and a rename: an interrupted save leaves the previous file
    (and a killed one its temporary, `.tmp-<pid>-<name>`, which the next
    save of that file deletes; other files' are left alone)."""
    weights = reference_names(core)
    if not isinstance(path, (str, os.PathLike)):  # a file object
        _write_npz(path, weights)
        return
    path = os.fspath(path)
    path = path if path.endswith(".npz") else path + ".npz"  # as np.savez names it
    remove_leftovers(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    temporary = temporary_path(path)
    try:
        _write_npz(temporary, weights)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _write_npz(file, variables):
    """Writes `{name: variable}` as `np.savez` would, reading one variable at a
    time: a whole-model dict of numpy copies would add the weights' size again
    to the peak (3.4 GB at `lm1b_large`)."""
    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED,
                         allowZip64=True) as archive:
        for name, variable in variables.items():
            value = np.asarray(variable.numpy())
            if value.dtype.name == "bfloat16":  # numpy writes it as raw `|V2`: float32, exact
                value = value.astype(np.float32)
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)
            del value


def load_weights(core, path):
    """Reads weights written by `save_weights` (no pickle), one array at a
    time, so loading needs little memory beyond the model's own."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    # Opened here: numpy's `np.load(path)` leaves its file open when the
    # archive is damaged (until a garbage collection).
    try:
        file = open(path, "rb")
        try:
            archive = np.load(file, allow_pickle=False)
        except BaseException:
            file.close()
            raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, tokenize.TokenError) as err:
        raise TxlError(_unreadable(path, err)) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):  # an .npy's one array
        file.close()
        raise TxlError(f"cannot read weights file {path}: one .npy array, not an .npz archive")
    with file, archive:
        check_shapes(reference_names(core), npz_headers(path))
        set_weights(core, _CheckedArchive(archive, path))


def npz_headers(path):
    """`{name: (shape, dtype)}` of the arrays in the .npz archive `path`, from
    their headers only: numpy allocates the shape a header declares before
    reading the data, so a few bytes could ask for any size."""
    headers = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if not name.endswith(".npy"):
                    continue
                with archive.open(name) as member:
                    version = np.lib.format.read_magic(member)
                    read = {(1, 0): np.lib.format.read_array_header_1_0,
                            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                    if read is None:
                        raise ValueError(f"{name}: .npy format version {version}")
                    shape, _, dtype = read(member)
                headers[name[:-len(".npy")]] = (tuple(shape), _bfloat16_of_voids(dtype))
    # TokenError: numpy's parser of a header whose brackets do not close
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error,
            tokenize.TokenError) as err:
        raise TxlError(_unreadable(path, err)) from None
    return headers


def check_shapes(names, headers):
    """Refuses, before any is read, a weight whose `(shape, dtype)` in
    `headers` does not fit its variable in `names` (as `set_weights` would
    after reading it)."""
    for name, variable in names.items():
        if name not in headers:
            continue  # set_weights names every missing one
        shape, dtype = headers[name]
        if tuple(shape) != tuple(variable.shape):
            raise TxlError(f"weight {name} has shape {tuple(shape)}, the model expects "
                           f"{tuple(variable.shape)}")
        if dtype is not None and dtype.kind != "f" and dtype.name != "bfloat16":
            raise TxlError(f"weight {name} holds {dtype} values, where a floating-point "
                           "weight belongs")


def _unreadable(path, err):
    try:
        with open(path, "rb") as file:
            start = file.read(2)
    except OSError:
        start = None
    if start == b"":
        problem = "the file is empty"
    elif start is not None and start != b"PK":  # numpy's guess: pickled data (never read here)
        problem = "not an .npz archive (it does not start with a zip file's signature)"
    else:
        problem = f"not a complete .npz archive ({err or type(err).__name__})"
    return f"cannot read weights file {path}: {problem}"


class _Lazy(Mapping):
    """`{name: array}` read on access: `readers` maps each name to a function."""

    def __init__(self, readers):
        self.readers = readers

    def __getitem__(self, name):
        return self.readers[name]()

    def __iter__(self):
        return iter(self.readers)

    def __len__(self):
        return len(self.readers)


def _bfloat16_of_voids(value):
    """An array (or dtype) of raw 2-byte voids (`|V2`) as bfloat16: how 0.4.0's
    `save_pretrained` wrote a bfloat16 core's weights (numpy has no bfloat16)."""
    void = np.dtype("V2")
    if (value if isinstance(value, np.dtype) else value.dtype) != void:
        return value
    from ml_dtypes import bfloat16
    return np.dtype(bfloat16) if isinstance(value, np.dtype) else value.view(bfloat16)


class _CheckedArchive(Mapping):
    """An open `.npz` archive whose read errors name the file."""

    def __init__(self, archive, path):
        self.archive, self.path = archive, path

    def __getitem__(self, name):
        try:
            return _bfloat16_of_voids(self.archive[name])
        except KeyError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error,
                tokenize.TokenError) as err:
            raise TxlError(_unreadable(self.path, err)) from None

    def __iter__(self):
        return iter(self.archive.files)

    def __len__(self):
        return len(self.archive.files)


def _unread_model_weights(available, names):
    """The checkpoint's model variables (under `transformer/`) that are
    neither in `names` nor a slot of one (`<name>/Adam`, ...)."""
    return sorted(key for key in available if key.startswith("transformer/")
                  and not any(key == name or key.startswith(name + "/") for name in names))


# What follows from the paper's TF code, whatever the given config says: every
# stream starts from attended zero states, tf.contrib's LayerNorm epsilon, and
# its `same_length` mask (`txl_tf.layers.masks`).
_TF_CODE_SEMANTICS = {"zero_filled_memory": True, "layer_norm_epsilon": 1e-12,
                      "same_length_convention": "tf"}


def import_tf_checkpoint(checkpoint, config, **config_overrides):
    """A `TransformerXL` holding the weights of a checkpoint written by the
    paper's TF code (`tf/train_gpu.py`, `train.py`): a checkpoint prefix or a
    folder with a `checkpoint` file.

    `config` must describe the checkpoint's model (sizes, `cutoffs`,
    `div_val`, `untie_r`, ...). The returned config sets what follows from
    that code, whatever `config` says (a keyword overrides it):
    `zero_filled_memory=True` (it starts every stream from attended zero
    states), `layer_norm_epsilon=1e-12` (the port's `config.json` says 1e-5)
    and `same_length_convention="tf"`. Without `cutoffs` it sets
    `tie_projs=[True]`: that code's softmax then always reads the embedding's
    projection, whatever `proj_share_all_but_first` said. Optimizer slots
    (`<weight>/Adam`, ...) and variables outside `transformer/` are ignored;
    a model weight the config would not read (another `n_layer`, `tie_projs`,
    `proj_same_dim`) is an error, and so is a config that code cannot have
    (`pre_lnorm`, `attn_type` other than 0, untied output tables).

    Args:
        checkpoint: a checkpoint prefix or a folder with a `checkpoint` file.
        config: a `TransformerXLConfig` or dict of the checkpoint's model.
        **config_overrides: config fields to change.

    Returns:
        The `TransformerXL`.

    Raises:
        FileNotFoundError: no checkpoint there.
        TxlError: the file is not a TF checkpoint, or its weights do not fit
            (missing, unread or of another shape).
    """
    import tensorflow as tf

    from txl_tf.core import TransformerXL, as_config

    try:
        reader = tf.train.load_checkpoint(checkpoint)
    except (ValueError, tf.errors.NotFoundError) as err:
        raise FileNotFoundError(f"no TF checkpoint at {checkpoint!r}: {err}") from None
    except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as err:  # another file
        raise TxlError(f"{checkpoint!r} is not a TF checkpoint: {err.message}") from None
    available = reader.get_variable_to_shape_map()
    cfg = as_config(config).replace(**{**_TF_CODE_SEMANTICS, **config_overrides})
    if not cfg.cutoffs:  # that code's softmax then always projects with the embedding's proj_W
        cfg = cfg.replace(tie_projs=[True])
    for field, value in (("pre_lnorm", False), ("attn_type", 0), ("tie_weight", True)):
        if getattr(cfg, field) != value:
            raise TxlError(f"the paper's TF code builds {field}={value} models only; the "
                           f"config has {field}={getattr(cfg, field)}")
    too_large = far_larger(cfg, sum(int(np.prod(shape)) for key, shape in available.items()
                                    if key.startswith("transformer/") and "/Adam" not in key))
    if too_large:
        raise TxlError(f"checkpoint {checkpoint!r}: {too_large}")
    with skip_random_init():  # every weight is read from the checkpoint below
        core = TransformerXL(cfg)
    names = reference_names(core)
    missing = [name for name in names if name not in available]
    if missing:
        raise TxlError(
            f"checkpoint {checkpoint!r} lacks {len(missing)} weights the config needs, e.g. "
            f"{missing[:3]}: check n_layer, cutoffs, div_val, untie_r and tie_projs")
    unread = _unread_model_weights(available, names)
    if unread:
        raise TxlError(
            f"checkpoint {checkpoint!r} holds {len(unread)} weights this config does not use, "
            f"e.g. {unread[:3]}: check n_layer, tie_projs and proj_same_dim")
    try:
        check_shapes(names, {name: (tuple(available[name]), None) for name in names})
        set_weights(core, {name: reader.get_tensor(name) for name in names})
    except IndexError as err:  # TensorFlow's reader on a data file cut short
        raise TxlError(f"checkpoint {checkpoint!r} cannot be read ({err}): is it "
                       "truncated?") from None
    except TxlError as err:  # a shape, dtype or value the config does not fit
        raise TxlError(f"checkpoint {checkpoint!r}: {err}") from None
    return core
