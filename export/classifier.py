"""A fine-tuned `TransformerXLClassifier` exported (SavedModel and ONNX) and
served again (`open_classifier`: class probabilities from either).

Both formats serve `classify(token_ids int32 [B, L], lengths int32 [B]) ->
{"probabilities": float32 [B, num_classes]}` (the SavedModel also as
`serving_default`), with B and L dynamic. The document loop of
`TransformerXL.read_documents` is a `tf.while_loop`; tf2onnx turns it into
an ONNX `Loop`, so both formats read any number of segments.
"""
import json
import logging
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from export.staging import staged_folder
from export.metadata import (CLASSIFIER_INPUTS, CLASSIFIER_OUTPUTS, ClassifierInfo,
                             classifier_metadata)
from export.onnx_export import (DEFAULT_OPSET, add_id_range_check, add_input_guard,
                                convert_with_weight_inputs, declare_shapes, onnx_constant,
                                order_outputs, save_with_weights)
from export.runtime import RuntimeInputError, check_ids, choose_artefact
from export.saved_model import plain_copies, save_module, weights_scope
from txl_tf.app.paths import refuse_links_out_of, what_is_in_the_way
from txl_tf.checks.numpy_checks import as_array, is_integer_dtype
from txl_tf.errors import TxlError
from txl_tf.keras_support.untracked import Untracked
from txl_tf.layers.init import skip_random_init
from txl_tf.layers.padding import lengths_message
from txl_tf.weights.checkpoints import adapted_layers

log = logging.getLogger(__name__)

FORMATS = ("saved_model", "onnx")
SAVED_MODEL_DIR = "saved_model"
ONNX_FILE = "model.onnx"
METADATA_FILE = "classifier.json"
VOCAB_DIR = "vocab"


def classify_specs():
    return [tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([None], tf.int32, name="lengths")]


def classify(model, token_ids, lengths):
    """`{"probabilities": softmax(logits)}` on the model's current weights (or
    a StatelessScope's)."""
    logits = model({"token_ids": token_ids, "lengths": lengths}, training=False)
    return {"probabilities": tf.nn.softmax(logits)}


class ClassifierServingModule(tf.Module):
    """The classifier's weights as plain `tf.Variable`s (as `ServingModule`
    does for the LM: TF Serving loaders fail on Keras 3 variables) and a
    `classify` function that runs the model on them."""

    def __init__(self, model):
        super().__init__(name="txl_classifier")
        self._model = Untracked(model)
        self.weights = plain_copies(model.weights)
        self.classify = tf.function(self._classify, input_signature=classify_specs(),
                                    autograph=False)

    def signatures(self):
        fn = self.classify.get_concrete_function()
        return {"serving_default": fn, "classify": fn}

    def _classify(self, token_ids, lengths):
        model = self._model.value
        with weights_scope(model.weights, self.weights):
            return classify(model, token_ids, lengths)


def export_classifier(model, output_dir, formats=FORMATS, label_names=None, vocab_dir=None,
                      opset=DEFAULT_OPSET, overwrite=False):
    """Writes the classifier to `output_dir`:

    ```
    output_dir/
      classifier.json   metadata: backbone config, num_classes, label_names,
                        segment_len, mem_len, vocab files, compute dtypes
      saved_model/      signatures classify = serving_default (assets: the same
                        metadata and the vocabulary)
      model.onnx        classify as ONNX (metadata_props: the same metadata)
      vocab/            the vocabulary (`vocab_dir`, default the model's)
    ```
    `label_names` default to the model's. The SavedModel computes under the
    model's dtype policy; the ONNX graph always computes in float32 (see
    `export_classifier_onnx`). Everything is written into a staging folder
    that replaces `output_dir` whole once every format is written, so a
    failed export leaves `output_dir` as it was. `output_dir` must be absent,
    empty or a previous classifier export (it holds `classifier.json`);
    anything else is refused unless `overwrite`; a file at `output_dir` or
    above it always is (`TxlError` naming it).

    Args:
        model: a `TransformerXLClassifier`.
        output_dir: the folder to write.
        formats: some of `("saved_model", "onnx")` (default both).
        label_names: one name per class (None: the model's).
        vocab_dir: the vocabulary folder to ship (None: the model's
            `vocab_dir`, if any).
        opset: the ONNX opset (default 17).
        overwrite: replace an `output_dir` that is no classifier export.

    Returns:
        `{artefact: path}` (absolute): `metadata`, `vocab` (when shipped),
        `saved_model`, `onnx` (a list of files).
    """
    formats = tuple(formats)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise TxlError(f"formats must be some of {FORMATS}, got {formats}")
    output_dir = os.path.abspath(output_dir)
    _check_output_dir(output_dir, overwrite)
    if "onnx" in formats and model.compute_dtype != "float32":
        _refuse_adapted_layers(model)  # before the SavedModel is written for nothing
    vocab_dir = vocab_dir or getattr(model, "vocab_dir", None)
    vocab_files = _vocab_files(vocab_dir)
    metadata = classifier_metadata(model, label_names,
                                   [os.path.basename(p) for p in vocab_files])
    written = {"metadata": METADATA_FILE}
    with staged_folder(output_dir) as staging:
        with open(os.path.join(staging, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        if vocab_files:
            written["vocab"] = VOCAB_DIR
            os.makedirs(os.path.join(staging, VOCAB_DIR))
            for path in vocab_files:
                shutil.copy(path, os.path.join(staging, VOCAB_DIR))
        if "saved_model" in formats:
            written["saved_model"] = SAVED_MODEL_DIR
            export_classifier_saved_model(model, os.path.join(staging, SAVED_MODEL_DIR),
                                          metadata, vocab_files)
        if "onnx" in formats:
            files = export_classifier_onnx(model, os.path.join(staging, ONNX_FILE), metadata,
                                           opset)
            written["onnx"] = [os.path.relpath(p, staging) for p in files]
    return {name: [os.path.join(output_dir, p) for p in path] if isinstance(path, list)
            else os.path.join(output_dir, path) for name, path in written.items()}


def _check_output_dir(output_dir, overwrite):
    problem = what_is_in_the_way(output_dir)  # a file there or above it: [Errno 17] / [Errno 20]
    if problem:
        raise TxlError(f"output_dir: {problem}; choose another output_dir")
    if overwrite or not os.path.isdir(output_dir) or not os.listdir(output_dir):
        return
    if not os.path.isfile(os.path.join(output_dir, METADATA_FILE)):
        raise TxlError(f"output folder {output_dir!r} is not empty and holds no classifier "
                       f"export ({METADATA_FILE}); the export replaces the folder whole: "
                       "pass overwrite=True, or choose another folder")


def float32_twin(model):
    """`model` if it computes in float32, else a copy of it under the float32
    policy holding the same weights (as float32). A copy of LoRA-adapted or
    quantized layers is refused (`TxlError`): it is built from the config."""
    if model.compute_dtype == "float32":
        return model
    _refuse_adapted_layers(model)
    config = {**model.get_config(), "dtype": "float32"}
    config.pop("name", None)
    with skip_random_init():  # every weight is copied next
        twin = type(model).from_config(config)
    if [tuple(w.shape) for w in twin.weights] != [tuple(w.shape) for w in model.weights]:
        raise RuntimeError("the float32 copy of the classifier has other weights than the "
                           "classifier")
    for target, source in zip(twin.weights, model.weights):
        target.assign(tf.cast(source, tf.float32))
    twin.vocab_dir = getattr(model, "vocab_dir", None)
    return twin


def _refuse_adapted_layers(model):
    """Raises `TxlError` if a layer of `model` has LoRA adapters or is
    quantized (its float32 copy, built from the config, would have neither)."""
    adapted = adapted_layers(model)
    if adapted:
        kinds = " and ".join(sorted({kind for _, kind in adapted}))
        raise TxlError(f"cannot export a {model.dtype_policy.name} classifier with {kinds} "
                       f"layers ({len(adapted)}, e.g. {adapted[0][0]}) to ONNX: the ONNX "
                       "graph is converted from a float32 copy built from the config, which "
                       "has no adapters or quantized layers; export formats=('saved_model',), "
                       "or a float32 model")


def export_classifier_saved_model(model, path, metadata, vocab_files=()):
    """The SavedModel of `ClassifierServingModule`; `assets/classifier.json`
    holds `metadata`. Returns `path`."""
    module = ClassifierServingModule(model)
    with tempfile.TemporaryDirectory() as staging:
        metadata_file = os.path.join(staging, METADATA_FILE)
        with open(metadata_file, "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2, sort_keys=True)
        module.metadata_file = tf.saved_model.Asset(metadata_file)
        module.vocab_files = [tf.saved_model.Asset(p) for p in vocab_files]
        save_module(module, path)
    return path


def export_classifier_onnx(model, path, metadata, opset=DEFAULT_OPSET):
    """`classify` as ONNX: inputs `token_ids`, `lengths` (both checked in the
    graph), output `probabilities`; returns the files written. The graph
    computes in float32 whatever the model's policy: a mixed-precision model
    is converted from its `float32_twin` (tf2onnx cannot constant-fold the
    bfloat16 constants of the document loop)."""
    from onnx import helper
    model = float32_twin(model)
    onnx_model = convert_with_weight_inputs(
        lambda token_ids, lengths: classify(model, token_ids, lengths), classify_specs(),
        model.weights, opset)
    got_in = [i.name for i in onnx_model.graph.input][:len(CLASSIFIER_INPUTS)]
    got_out = [o.name for o in onnx_model.graph.output]
    if got_in != list(CLASSIFIER_INPUTS) or got_out != list(CLASSIFIER_OUTPUTS):
        raise RuntimeError(f"unexpected ONNX interface: inputs {got_in}, outputs {got_out}")
    order_outputs(onnx_model, CLASSIFIER_OUTPUTS)
    add_id_range_check(onnx_model, "token_ids", model.config.n_token)
    add_lengths_check(onnx_model)
    declare_shapes(onnx_model, {"token_ids": ["batch", "length"], "lengths": ["batch"],
                                "probabilities": ["batch", model.num_classes]})
    helper.set_model_props(onnx_model, metadata)
    onnx_model.doc_string = ("Transformer-XL classifier: (token_ids, lengths) -> "
                             "probabilities")
    return save_with_weights(onnx_model, path, model.weights, len(CLASSIFIER_INPUTS))


def lengths_check_node_name():
    return "lengths empty or out of range: each must be in [1, L], L = token_ids.shape[1]"


def add_lengths_check(onnx_model):
    """Makes the graph fail unless every length is in `[1, L]`, without
    reading L from the ids' shape (a value ONNX Runtime's CUDA provider keeps
    on the host, copied back each call): each row's id at column `length -
    1` is gathered (a length past L is an index out of range, in a node
    named as the check; that column of the first row by `Gather` too, which
    `onnx.reference` refuses out of range), and their zeros added to the
    lengths; a length under 1 is flagged (`add_input_guard`, which refuses
    no rows too); so are fewer or more lengths than rows (more: but for one
    row, then a length past L)."""
    from onnx import TensorProto, helper
    c = "txl_lengths_check/"
    rows_check = "lengths must be one per row of token_ids: shape [B]"
    nodes = [
        onnx_constant(c + "one", 1),
        onnx_constant(c + "zero", 0),
        onnx_constant(c + "column", [1], TensorProto.INT64),
        onnx_constant(c + "zero64", [0], TensorProto.INT64),
        onnx_constant(c + "pad_column", [0, 0, 0, 1], TensorProto.INT64),
        onnx_constant(c + "flat", [-1], TensorProto.INT64),
        # Each row's length, gathered by a column of zeros [rows of token_ids, 1]
        # (out of bounds with fewer lengths than rows) and added to the lengths
        # (which refuses more, but for one row).
        helper.make_node("Slice", ["token_ids", c + "zero64", c + "column", c + "column"],
                         [c + "first_column"], name=c + "first_column"),
        # [B, 1] when L = 0 too: a column padded on, the first one kept.
        helper.make_node("Pad", [c + "first_column", c + "pad_column"], [c + "padded_column"],
                         name=c + "padded_column"),
        helper.make_node("Slice", [c + "padded_column", c + "zero64", c + "column",
                                   c + "column"], [c + "one_column"], name=c + "one_column"),
        helper.make_node("Mul", [c + "one_column", c + "zero"], [c + "row_origins"],
                         name=c + "row_origins"),
        helper.make_node("Unsqueeze", ["lengths", c + "column"], [c + "lengths_column"],
                         name=c + "lengths_column"),
        helper.make_node("GatherElements", [c + "lengths_column", c + "row_origins"],
                         [c + "row_lengths"], axis=1, name=rows_check + " (fewer lengths)"),
        helper.make_node("Mul", [c + "row_lengths", c + "zero"], [c + "per_row_zeros"],
                         name=c + "per_row_zeros"),
        helper.make_node("Reshape", [c + "per_row_zeros", c + "flat"], [c + "per_row_flat"],
                         name=c + "per_row_flat"),
        helper.make_node("Add", ["lengths", c + "per_row_flat"], [c + "per_row"],
                         name=rows_check + " (more lengths)"),
        helper.make_node("Sub", [c + "per_row", c + "one"], [c + "last"], name=c + "last"),
        helper.make_node("Unsqueeze", [c + "last", c + "column"], [c + "last_column"],
                         name=c + "last_column"),
        helper.make_node("GatherElements", ["token_ids", c + "last_column"], [c + "last_id"],
                         name=lengths_check_node_name() + " (a length past L)", axis=1),
        # The same column of the first row, by Gathers: onnx.reference's GatherElements
        # wraps an index out of range, its Gather refuses one.
        helper.make_node("Gather", ["token_ids", c + "zero"], [c + "first_row"],
                         name=lengths_check_node_name() + " (the first row)", axis=0),
        helper.make_node("Gather", [c + "first_row", c + "last"], [c + "first_row_ids"],
                         name=lengths_check_node_name() + " (a length past L, row 0)", axis=0),
        helper.make_node("Mul", [c + "last_id", c + "zero"], [c + "zeros"], name=c + "zeros"),
        helper.make_node("Reshape", [c + "zeros", c + "flat"], [c + "zeros_flat"],
                         name=c + "zeros_flat"),
        helper.make_node("Mul", [c + "first_row_ids", c + "zero"], [c + "row_zeros"],
                         name=c + "row_zeros"),
        helper.make_node("Add", [c + "zeros_flat", c + "row_zeros"], [c + "all_zeros"],
                         name=c + "all_zeros"),
        helper.make_node("Add", [c + "per_row", c + "all_zeros"], [c + "within"],
                         name=c + "within"),
        helper.make_node("Less", [c + "within", c + "one"], [c + "bad"], name=c + "bad"),
    ]
    add_input_guard(onnx_model, "lengths", nodes, c + "bad", lengths_check_node_name(),
                    c + "guard/")


def _vocab_files(vocab_dir):
    if not vocab_dir:
        return []
    refuse_links_out_of(vocab_dir)
    return [os.path.join(vocab_dir, n) for n in sorted(os.listdir(vocab_dir))
            if os.path.isfile(os.path.join(vocab_dir, n))]


# ------------------------------------------------------------------ serving
def open_classifier(path, backend="auto", device="auto"):
    """Opens what `export_classifier` wrote.

    Args:
        path: its output directory, `model.onnx` or `saved_model/`.
        backend: `auto` (prefers ONNX), `onnx` or `saved_model`.
        device: as for `open_runtime` (`auto`, `cuda`/`gpu`, `cpu`).

    Returns:
        A `ClassifierRuntime`.
    """
    backend, found = choose_artefact(path, backend)
    if backend == "onnx":
        return _OnnxClassifier(found, device)
    return _SavedModelClassifier(found, device)


class ClassifierRuntime:
    """`probabilities(token_ids, lengths)` → float32 numpy `[B, num_classes]`;
    `info` holds the metadata (`num_classes`, `label_names`, `segment_len`,
    `mem_len`, `config`). Inputs are checked before the backend runs
    (`RuntimeInputError`). `open_classifier` makes one.

    Args:
        info: the export's metadata (a `ClassifierInfo`).
    """

    backend = "abstract"

    def __init__(self, info):
        self.info = info
        self.num_classes = info.num_classes
        self.label_names = info.label_names

    def probabilities(self, token_ids, lengths):
        """The class probabilities of each document.

        Args:
            token_ids: int `[B, L]`; row b's document is
                `token_ids[b, :lengths[b]]`.
            lengths: int `[B]`, each in `[1, L]`.

        Returns:
            float32 numpy `[B, num_classes]`.

        Raises:
            RuntimeInputError: bad ids or lengths.
        """
        ids = check_ids(token_ids, self.info.config.n_token)
        lengths = as_array(lengths, "lengths", RuntimeInputError)  # a mask: not dropped
        if not is_integer_dtype(lengths.dtype) \
                or lengths.shape != ids.shape[:1]:
            raise RuntimeInputError(f"lengths must be integers of shape [batch] = "
                                    f"[{ids.shape[0]}], got {lengths.dtype} {lengths.shape}")
        problem = lengths_message(lengths, ids.shape[1])
        if problem:
            raise RuntimeInputError(problem)
        return self._run(ids, lengths.astype(np.int32))

    def predict(self, token_ids, lengths):
        """The most probable class of each document.

        Args:
            token_ids: int `[B, L]`, as for `probabilities`.
            lengths: int `[B]`, as for `probabilities`.

        Returns:
            A list of `B` label names when the export has names, else an int
            numpy array `[B]` of class indices.
        """
        best = self.probabilities(token_ids, lengths).argmax(-1)
        if self.label_names is None:
            return best
        return [self.label_names[i] for i in best]

    def _run(self, ids, lengths):
        raise NotImplementedError


class _OnnxClassifier(ClassifierRuntime):
    backend = "onnxruntime"

    def __init__(self, path, device):
        from export.onnx_runtime import choose_providers, cuda_built, open_session
        providers, reason = choose_providers(device)
        if reason and (device != "auto" or cuda_built()):  # as `OnnxRuntime` says it
            log.warning("%s", reason)
        self.session = open_session(path, providers=providers)
        super().__init__(ClassifierInfo(self.session.get_modelmeta().custom_metadata_map))

    def _run(self, ids, lengths):
        return self.session.run(["probabilities"], {"token_ids": ids, "lengths": lengths})[0]


class _SavedModelClassifier(ClassifierRuntime):
    backend = "saved_model"

    def __init__(self, path, device):
        from export.tf_runtime import choose_tf_device, load_saved_model
        self._tf_device, _ = choose_tf_device(device)
        self.loaded = load_saved_model(path, self._tf_device)
        metadata = self.loaded.metadata_file.asset_path.numpy().decode()
        super().__init__(ClassifierInfo.from_json_file(metadata))
        self._classify = self.loaded.signatures["classify"]

    def _run(self, ids, lengths):
        import tensorflow as tf
        with tf.device(self._tf_device):
            out = self._classify(token_ids=tf.constant(ids), lengths=tf.constant(lengths))
        return np.asarray(out["probabilities"])


def read_metadata(output_dir):
    """The `ClassifierInfo` of an export directory's `classifier.json`."""
    return ClassifierInfo.from_json_file(os.path.join(output_dir, METADATA_FILE))
