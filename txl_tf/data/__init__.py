"""Language-model data: corpus readers (cached, tokenized once), the
segment stream pipeline, and separate documents as streams."""
from txl_tf.data.corpora import (KNOWN_CORPORA, Corpus, CorpusNotFoundError,
                                 EmptyCorpusError, load_corpus, stdlib_dir,
                                 unknown_count)
from txl_tf.data.documents import (distribute_documents, document_dataset, document_segments,
                                   split_documents)
from txl_tf.data.stream import (batchify, distribute_segments, eval_segment_dataset,
                                num_segments, segment_dataset, stream_length)

__all__ = [
    "KNOWN_CORPORA", "Corpus", "CorpusNotFoundError", "EmptyCorpusError",
    "load_corpus", "stdlib_dir", "unknown_count", "batchify", "distribute_segments",
    "distribute_documents", "document_dataset", "document_segments", "split_documents",
    "eval_segment_dataset", "num_segments", "segment_dataset", "stream_length",
]
