"""Corpus readers (cached, tokenized once), the segment stream pipeline, and
classification data (labelled texts -> padded batches)."""
from txl_tf.data.classification import (ClassificationDataError, Examples,
                                        classification_dataset, read_examples,
                                        read_folder, read_tsv, token_dataset)
from txl_tf.data.corpora import (KNOWN_CORPORA, Corpus, CorpusNotFoundError,
                                 EmptyCorpusError, load_corpus, stdlib_dir,
                                 unknown_count)
from txl_tf.data.labels import LabelSet, UnknownLabelError
from txl_tf.data.passages import corpus_passages, passage_examples
from txl_tf.data.stream import (batchify, distribute_segments, eval_segment_dataset,
                                num_segments, segment_dataset, stream_length)

__all__ = [
    "KNOWN_CORPORA", "Corpus", "CorpusNotFoundError", "EmptyCorpusError",
    "load_corpus", "stdlib_dir", "unknown_count", "batchify", "distribute_segments",
    "eval_segment_dataset", "num_segments", "segment_dataset", "stream_length",
    "ClassificationDataError", "Examples", "LabelSet", "UnknownLabelError",
    "classification_dataset", "corpus_passages", "passage_examples", "read_examples",
    "read_folder", "read_tsv", "token_dataset",
]
