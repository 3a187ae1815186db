"""Text classification on the Transformer-XL backbone: labelled data, the
classifier, its metrics and attention pictures."""
from txl_tf.classification.data import (ClassificationDataError, Examples,
                                        classification_dataset, read_examples,
                                        read_folder, read_tsv, token_dataset)
from txl_tf.classification.labels import LabelSet, UnknownLabelError
from txl_tf.classification.passages import corpus_passages, passage_examples

__all__ = [
    "ClassificationDataError", "Examples", "LabelSet", "UnknownLabelError",
    "classification_dataset", "corpus_passages", "passage_examples", "read_examples",
    "read_folder", "read_tsv", "token_dataset",
]
