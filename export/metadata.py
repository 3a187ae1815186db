"""What an exported artefact records about itself (shared by SavedModel and ONNX)."""
import json

from txl_tf.app.files import parse_json
from txl_tf.config import TransformerXLConfig
from txl_tf.errors import TxlError

CONFIG_KEY = "txl_tf.config"
INPUT_NAMES = ("token_ids", "mems", "mem_mask")
OUTPUT_NAMES = ("log_probs", "new_mems", "new_mem_mask")
# How the decode graphs' cache holds the attention keys (`export.decode_interface`):
# as columns `[L, B, H, d_head, S]`. Exports before this key held them as rows
# `[L, B, H, S, d_head]`; runtimes decode those through `step_last`.
DECODE_CACHE_LAYOUT = "keys_as_columns"
# The ONNX files of the cached decode interface, beside `model.onnx`.
DECODE_FILES = {"decode_init": "decode_init.onnx", "decode_step": "decode_step.onnx",
                "decode_read": "decode_read.onnx"}
# The step that writes its rings in place (`decode_interface.decode_token`),
# beside them since this key; a runtime steps an export without it through
# `decode_step` and the ring's write graph.
DECODE_TOKEN_FILE = "decode_token.onnx"
# The initializers that hold the model's weights, in every graph of an export:
# `txl_weight_NNNN`, NNNN the weight's index in the model's weights.
WEIGHT_PREFIX = "txl_weight_"
# The dtypes the decode graphs may keep the cache's keys and values in
# (`--cache_dtype`; `export.decode_interface`). No bfloat16: ONNX Runtime's
# CPU provider runs no bfloat16 MatMul or Softmax.
CACHE_DTYPES = ("float32", "float16")
# The dtypes the decode graphs may compute in, with their weights and their
# cache's keys and values (`--decode_dtype`; `export.decode_interface`).
DECODE_DTYPES = ("float32", "float16")


def weights_quantization(model):
    """What an export of `model` records as `weights_quantization`: the
    Keras quantization mode of its quantized layers (`"int8"`: their
    kernels are int8 in the graphs, which multiply int8 inputs quantized at
    each call), several joined by ",", or `"none"`.

    Args:
        model: the Keras layer or model exported (a core, a classifier).

    Returns:
        A string.
    """
    from txl_tf.weights.checkpoints import adapted_layers  # serving imports no TensorFlow
    modes = sorted({kind for _, kind in adapted_layers(model) if kind != "LoRA"})
    return ",".join(modes) or "none"


def external_data_file(path):
    """Where the weights of a large ONNX model go: `model.onnx` → `model.onnx.data`."""
    return path + ".data"


def read_metadata_file(path):
    """The JSON object of the metadata file `path` (a TxlError naming the file
    if it is not one)."""
    try:
        with open(path, encoding="utf-8") as f:
            values = parse_json(f.read())
    except ValueError as err:  # not JSON, or not UTF-8
        raise TxlError(f"{path}: not a JSON object of export metadata ({err})") from None
    if not isinstance(values, dict):
        raise TxlError(f"{path}: not a JSON object of export metadata (a "
                       f"{type(values).__name__})")
    return values


def export_metadata(config, mem_len, log_probs="all", zero_filled=False,
                    memory_layout="layer_major", cache_dtype="float32", decode_dtype="float32",
                    quantization="none"):
    """The metadata an export carries.

    Args:
        config: the model's `TransformerXLConfig`.
        mem_len: the exported memory length.
        log_probs: `"all"` (`[B, T, n_token]`) or `"last"` (`[B, n_token]`).
        zero_filled: whether fresh memories are zero states.
        memory_layout: `"layer_major"` or `"batch_major"`.
        cache_dtype: the dtype of the decode cache's keys and values.
        decode_dtype: the dtype the decode graphs compute in.
        quantization: the weights' quantization (`weights_quantization`).

    Returns:
        A dict of strings: config JSON, memory geometry and layout,
        vocabulary size, those dtypes, the weights' quantization, input and
        output names, the txl_tf version.
    """
    import txl_tf
    return {
        CONFIG_KEY: config.to_json(),
        "n_layer": str(config.n_layer),
        "mem_len": str(int(mem_len)),
        "d_model": str(config.d_model),
        "n_token": str(config.n_token),
        "vocab_size": str(config.n_token),
        "log_probs": log_probs,
        "zero_filled_memory": str(bool(zero_filled)).lower(),
        "memory_layout": memory_layout,
        "decode_cache_layout": DECODE_CACHE_LAYOUT,
        "decode_cache_dtype": cache_dtype,
        "decode_dtype": decode_dtype,
        "weights_quantization": quantization,
        "same_length": str(bool(config.same_length)).lower(),
        "same_length_convention": config.same_length_convention,
        "inputs": ",".join(INPUT_NAMES),
        "outputs": ",".join(OUTPUT_NAMES),
        "token_ids_dtype": "int32",
        "txl_tf_version": txl_tf.__version__,
    }


class ExportInfo:
    """Parsed metadata: `config`, `mem_len`, `log_probs`, `zero_filled`,
    `memory_layout`, `decode_cache_layout`, `cache_dtype` (of the decode
    cache's keys and values; exports before it: float32), `decode_dtype`
    (the decode graphs' weights and compute; exports before it: float32).

    Args:
        values: the metadata, a dict of strings (`export_metadata`'s).

    Raises:
        TxlError: a classifier's or a decode interface's metadata, a
            required key missing, or a dtype this version does not read.
    """

    def __init__(self, values):
        if values.get("task") == "classification":
            raise TxlError("this export is a txl_tf classifier: open it with "
                           "export.open_classifier")
        if values.get("interface"):
            raise TxlError(f"this graph is the cached decode interface's "
                           f"{values['interface']}, which a runtime opens itself: open the "
                           "model.onnx beside it, or its folder")
        missing = [k for k in (CONFIG_KEY, "mem_len") if k not in values]
        if missing:
            raise TxlError(f"export metadata lacks {missing}; was this exported by txl_tf?")
        self.values = dict(values)
        self.config = TransformerXLConfig.from_json(values[CONFIG_KEY])
        self.mem_len = int(values["mem_len"])
        self.log_probs = values.get("log_probs", "all")
        self.zero_filled = values.get("zero_filled_memory", "false") == "true"
        self.memory_layout = values.get("memory_layout", "layer_major")
        self.decode_cache_layout = values.get("decode_cache_layout", "keys_as_rows")
        self.cache_dtype = values.get("decode_cache_dtype", "float32")
        if self.cache_dtype not in CACHE_DTYPES:
            raise TxlError(f"this export's decode cache is {self.cache_dtype}, which this "
                           f"txl_tf does not read (it reads {', '.join(CACHE_DTYPES)})")
        self.decode_dtype = values.get("decode_dtype", "float32")
        if self.decode_dtype not in DECODE_DTYPES:
            raise TxlError(f"this export's decode graphs compute in {self.decode_dtype}, which "
                           f"this txl_tf does not read (it reads {', '.join(DECODE_DTYPES)})")

    @classmethod
    def from_json_file(cls, path):
        """The `ExportInfo` of a JSON file of metadata.

        Args:
            path: the file.

        Returns:
            An `ExportInfo`.
        """
        return cls(read_metadata_file(path))


CLASSIFIER_INPUTS = ("token_ids", "lengths")
CLASSIFIER_OUTPUTS = ("probabilities",)


def classifier_metadata(model, label_names=None, vocab_files=()):
    """String key/value pairs of an exported `TransformerXLClassifier`:
    backbone config, classes and their names, how documents are read, and
    the precision: `dtype_policy` (the Keras model's, under which the
    SavedModel computes: `saved_model_compute_dtype`),
    `onnx_compute_dtype`, always float32 (the ONNX graph is converted from a
    float32 copy of the weights, so a mixed-precision model's ONNX export
    differs from it by bfloat16/float16 rounding), and
    `weights_quantization`, as a language model's export records it."""
    import txl_tf
    config = model.config
    names = model.label_names if label_names is None else [str(n) for n in label_names]
    if names is not None and len(names) != model.num_classes:
        raise TxlError(f"{len(names)} label_names for {model.num_classes} classes")
    return {
        CONFIG_KEY: config.to_json(),
        "task": "classification",
        "num_classes": str(model.num_classes),
        "label_names": json.dumps(names),
        "segment_len": str(model.segment_len),
        "mem_len": str(model.mem_len),
        "n_token": str(config.n_token),
        "vocab_size": str(config.n_token),
        "vocab_files": json.dumps(list(vocab_files)),
        "inputs": ",".join(CLASSIFIER_INPUTS),
        "outputs": ",".join(CLASSIFIER_OUTPUTS),
        "token_ids_dtype": "int32",
        "dtype_policy": model.dtype_policy.name,
        "saved_model_compute_dtype": str(model.compute_dtype),
        "onnx_compute_dtype": "float32",
        "weights_quantization": weights_quantization(model),
        "txl_tf_version": txl_tf.__version__,
    }


class ClassifierInfo:
    """Parsed classifier metadata: `config`, `num_classes`, `label_names`
    (or None), `segment_len`, `mem_len`, `vocab_files`."""

    def __init__(self, values):
        if values.get("task") != "classification":
            raise TxlError("this export is not a txl_tf classifier (metadata 'task' is "
                           f"{values.get('task')!r}); use export.open_runtime for language "
                           "models")
        self.values = dict(values)
        self.config = TransformerXLConfig.from_json(values[CONFIG_KEY])

        def number(key, least):  # a string (as written) or int; int() cuts 2.5 to 2
            value = values.get(key)
            if type(value) is str:
                try:
                    value = int(value)
                except ValueError:
                    pass
            if type(value) is not int or value < least:
                raise TxlError(f"classifier metadata: {key} must be an integer >= {least}, "
                               f"got {values.get(key)!r}")
            return value

        def listed(key, default, kind, what):
            try:
                value = parse_json(values.get(key, default))
            except (TypeError, ValueError):
                value = values.get(key)
            if value is not None and not (isinstance(value, list) and all(
                    kind(v) for v in value)):
                raise TxlError(f"classifier metadata: {key} must be {what}, got "
                               f"{values.get(key)!r}")
            return value

        self.num_classes = number("num_classes", 2)
        self.segment_len = number("segment_len", 1)
        self.mem_len = number("mem_len", 0)
        self.label_names = listed("label_names", "null", lambda v: isinstance(v, str),
                                  f"null or {self.num_classes} strings")
        if self.label_names is not None and len(self.label_names) != self.num_classes:
            raise TxlError(f"classifier metadata: label_names must be null or "
                           f"{self.num_classes} strings, got {len(self.label_names)}")
        self.vocab_files = listed(  # names in the export's vocab/, never a path out of it
            "vocab_files", "[]", lambda v: isinstance(v, str) and v not in ("", ".", "..")
            and "/" not in v and "\\" not in v, "a list of file names") or []

    @classmethod
    def from_json_file(cls, path):
        return cls(read_metadata_file(path))
