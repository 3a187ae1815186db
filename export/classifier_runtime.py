"""`open_classifier`: class probabilities from an exported classifier (ONNX or SavedModel)."""
import json
import os

import numpy as np

from export.classifier_export import METADATA_FILE
from export.input_checks import RuntimeInputError, check_ids
from export.metadata import ClassifierInfo
from export.runtime import choose_artefact
from txl_tf.layers.padding import lengths_message


def open_classifier(path, backend="auto", device="auto"):
    """Opens what `export_classifier` wrote: its output directory, `model.onnx`
    or `saved_model/` (`backend` auto | onnx | saved_model; `auto` prefers
    ONNX). `device` as for `open_runtime`. Returns a `ClassifierRuntime`."""
    backend, found = choose_artefact(path, backend)
    if backend == "onnx":
        return _OnnxClassifier(found, device)
    return _SavedModelClassifier(found, device)


class ClassifierRuntime:
    """`probabilities(token_ids, lengths)` → float32 numpy `[B, num_classes]`;
    `info` holds the metadata (`num_classes`, `label_names`, `segment_len`,
    `mem_len`, `config`). Inputs are checked before the backend runs
    (`RuntimeInputError`)."""

    backend = "abstract"

    def __init__(self, info):
        self.info = info
        self.num_classes = info.num_classes
        self.label_names = info.label_names

    def probabilities(self, token_ids, lengths):
        ids = check_ids(token_ids, self.info.config.n_token)
        lengths = np.asarray(lengths)
        if lengths.dtype == np.bool_ or not np.issubdtype(lengths.dtype, np.integer) \
                or lengths.shape != ids.shape[:1]:
            raise RuntimeInputError(f"lengths must be integers of shape [batch] = "
                                    f"[{ids.shape[0]}], got {lengths.dtype} {lengths.shape}")
        problem = lengths_message(lengths, ids.shape[1])
        if problem:
            raise RuntimeInputError(problem)
        return self._run(ids, lengths.astype(np.int32))

    def predict(self, token_ids, lengths):
        """The most probable class of each document: its label name when the
        export has names, else its index."""
        best = self.probabilities(token_ids, lengths).argmax(-1)
        if self.label_names is None:
            return best
        return [self.label_names[i] for i in best]

    def _run(self, ids, lengths):
        raise NotImplementedError


class _OnnxClassifier(ClassifierRuntime):
    backend = "onnxruntime"

    def __init__(self, path, device):
        from export.onnx_runtime import choose_providers, open_session
        providers, _ = choose_providers(device)
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
    with open(os.path.join(output_dir, METADATA_FILE), encoding="utf-8") as f:
        return ClassifierInfo(json.load(f))
