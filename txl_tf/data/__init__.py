"""Language-model data: corpus readers (cached, tokenized once) and the
segment stream pipeline."""
from txl_tf.data.corpora import (KNOWN_CORPORA, Corpus, CorpusNotFoundError,
                                 EmptyCorpusError, load_corpus, stdlib_dir,
                                 unknown_count)
from txl_tf.data.stream import (batchify, distribute_segments, eval_segment_dataset,
                                num_segments, segment_dataset, stream_length)

__all__ = [
    "KNOWN_CORPORA", "Corpus", "CorpusNotFoundError", "EmptyCorpusError",
    "load_corpus", "stdlib_dir", "unknown_count", "batchify", "distribute_segments",
    "eval_segment_dataset", "num_segments", "segment_dataset", "stream_length",
]
