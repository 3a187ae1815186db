"""Text classification data: labelled examples from files, padded batches.

Two layouts are read (UTF-8):

* **lines** (:func:`read_tsv`): one example a line, ``label<TAB>text``. The
  label is everything before the first TAB (surrounding spaces dropped), the
  text everything after it (further TABs stay in the text). Blank lines are
  not examples and are skipped; a line without a TAB is an error. Lines end
  in LF, CRLF or CR (as Python's text mode reads them).
* **folders** (:func:`read_folder`): ``<root>/<class>/<file>``, one example a
  file (every non-hidden file under the class folder, recursively, sorted;
  links to files and folders are followed, a link to nothing is an error);
  class names are the sub-folder names. Files directly in ``<root>`` are
  ignored; ``classes=`` picks some sub-folders (e.g. IMDB's ``neg``/``pos``
  without ``unsup``).

Labels become ids through a :class:`~txl_tf.classification.labels.LabelSet`: built from
the training data (sorted; numerically when every label is an integer) and
saved as ``labels.json``, then passed to the evaluation reader, where an
unknown label is an error naming the file and line.

Empty text (a label with nothing but whitespace after it, or an empty file in
a class folder) is an error by default, since a document of zero tokens gives
the classifier nothing to read; ``empty_text="skip"`` drops such examples and
lists them in :attr:`Examples.skipped`.

:func:`classification_dataset` turns examples into the classifier's batches
``({"token_ids": int32 [B, L], "lengths": int32 [B]}, label_ids int32 [B])``:
texts are tokenized inside tf.data with the project's tokenizers, cut to
``max_length`` tokens (keeping the start by default), and right-padded with
``pad_id`` to the longest document of the batch rounded up to a multiple of
``segment_len``, so the classifier cuts ``L / segment_len`` segments without
padding again. :func:`token_dataset` does the same for documents that are
already ids.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import tensorflow as tf

from txl_tf.app.progress import show_bar, tqdm_bar
from txl_tf.checks.numpy_checks import MAX_POSITIONS, is_integer_dtype
from txl_tf.classification.labels import LabelSet, UnknownLabelError
from txl_tf.data.corpora import PROGRESS_MIN_BYTES, CorpusNotFoundError
from txl_tf.errors import TxlError
from txl_tf.text import Tokenizer

TSV_LAYOUT = "one example a line, label<TAB>text (UTF-8)"
FOLDER_LAYOUT = "<root>/<class name>/<one file per example> (UTF-8)"
EMPTY_TEXT = ("error", "skip")
KEEP = ("start", "end")


class ClassificationDataError(TxlError):
    """A classification data file is malformed; ``path`` and ``line`` say where."""

    def __init__(self, message: str, path: Path | str | None = None,
                 line: int | None = None):
        self.path, self.line = path, line
        where = f"{path}:{line}: " if line else (f"{path}: " if path is not None else "")
        super().__init__(where + message)


@dataclasses.dataclass
class Examples:
    """Labelled texts: ``texts[i]`` has id ``label_ids[i]`` in ``labels`` and
    was read at ``sources[i]``.

    Args:
        texts: the texts.
        label_ids: one int id per text (kept as int32 ``[N]``).
        labels: the :class:`LabelSet` the ids index.
        sources: where each text was read (``path:line`` or ``path``).
        skipped: where empty texts were dropped (``empty_text="skip"``).

    Raises:
        TxlError: lengths that differ, or an id out of range.
    """

    texts: list[str]
    label_ids: np.ndarray
    labels: LabelSet
    sources: list[str]
    skipped: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        # Checked before the int32 cast, which reads 1.5 and True as 1, 2**32 + 1 as 1.
        label_ids = np.asarray(self.label_ids).reshape(-1)
        if label_ids.size and not is_integer_dtype(label_ids.dtype):
            raise TxlError(f"label_ids must be integers, got dtype {label_ids.dtype}")
        if not len(self.texts) == len(label_ids) == len(self.sources):
            raise TxlError(f"{len(self.texts)} texts, {len(label_ids)} label ids "
                           f"and {len(self.sources)} sources do not match")
        bad = np.flatnonzero((label_ids < 0) | (label_ids >= len(self.labels)))
        if bad.size:
            i = int(bad[0])
            raise TxlError(f"{self.sources[i]}: label id {label_ids[i]} is out of "
                           f"range for {len(self.labels)} classes")
        self.label_ids = label_ids.astype(np.int32)

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        # Not the dataclass's: that printed every text and source.
        first = f", first from {self.sources[0]}" if self.sources else ""
        return (f"Examples({len(self.texts):,} texts, {self.labels!r}{first}, "
                f"{len(self.skipped):,} skipped)")

    def class_counts(self) -> dict[str, int]:
        """Examples per class.

        Returns:
            ``{class name: count}``, in id order.
        """
        counts = np.bincount(self.label_ids, minlength=len(self.labels))
        return {name: int(c) for name, c in zip(self.labels.names, counts)}


# -- readers -------------------------------------------------------------------

def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise TxlError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                       f"got {value!r}")


def _decode(data: bytes, path: Path, line: int | None = None) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        if line is None:  # LF, CRLF and CR end a line
            before = data[:err.start]
            line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise ClassificationDataError(f"not valid UTF-8 (byte {data[err.start]:#04x})",
                                      path, line) from None
    return text[1:] if text.startswith("\ufeff") else text


def _resolve(rows: list[tuple[str, str, str]], labels: LabelSet | None,
             skipped: list[str]) -> Examples:
    """Rows of (label name, text, source) -> Examples, naming the source of
    an unknown label."""
    if labels is None:
        labels = LabelSet.from_labels(name for name, _, _ in rows)
    ids = np.empty(len(rows), np.int32)
    for i, (name, _, source) in enumerate(rows):
        try:
            ids[i] = labels.id(name)
        except UnknownLabelError as err:
            error = UnknownLabelError(f"{source}: {err} (from labels.json of the "
                                      "training data)")
            error.path, _, line = source.rpartition(":")
            error.line = int(line) if line.isdigit() else None
            raise error from None
    return Examples([t for _, t, _ in rows], ids, labels, [s for _, _, s in rows], skipped)


def _numbered_lines(path: Path, progress=None):
    """``(line number, text)`` of each line of a UTF-8 file; lines end in LF,
    CRLF or CR (as Python's text mode reads them), a BOM at a line's start is
    dropped, and bytes that are not UTF-8 are an error naming the line.
    ``progress(n)`` is told the bytes read."""
    n = 0
    with open(path, "rb") as f:
        for raw in f:  # ends in b"\n" (but maybe the last): CRLF stays in one piece
            if progress is not None:
                progress(len(raw))
            for piece in raw.removesuffix(b"\n").removesuffix(b"\r").split(b"\r"):
                n += 1
                yield n, _decode(piece, path, n)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, as the ``label<TAB>text`` reader sees
    them (e.g. one document a line for ``predict``).

    Args:
        path: the file.

    Returns:
        Its lines (without line ends; LF, CRLF and CR end a line; a leading
        BOM dropped), line ``n`` at index ``n - 1``.

    Raises:
        ClassificationDataError: bytes that are not UTF-8, naming the line.
    """
    return [line for _, line in _numbered_lines(Path(path))]


def _tsv_rows(path: Path, empty_text: str, skipped: list[str],
              progress: bool | None) -> list[tuple[str, str, str]]:
    if not path.is_file():
        raise CorpusNotFoundError(path, TSV_LAYOUT, "classification file")
    size = path.stat().st_size
    show = show_bar(progress, size >= PROGRESS_MIN_BYTES)
    rows, dropped = [], 0
    with tqdm_bar(total=size, unit="B", unit_scale=True, leave=False, desc=path.name,
                  disable=not show) as bar:
        for n, line in _numbered_lines(path, bar.update):
            if not line.strip():
                continue
            name, tab, text = line.partition("\t")
            if not tab:
                raise ClassificationDataError(
                    f"no TAB in this line (expected {TSV_LAYOUT}): {line[:60]!r}", path, n)
            name = name.strip()
            if not name:
                raise ClassificationDataError("empty label before the TAB", path, n)
            if not text.strip():
                if empty_text == "error":
                    raise ClassificationDataError(
                        "empty text after the label (pass empty_text='skip' to drop "
                        "such lines)", path, n)
                skipped.append(f"{path}:{n}")
                dropped += 1
                continue
            rows.append((name, text, f"{path}:{n}"))
    if not rows:
        why = f" ({dropped} lines with empty text skipped)" if dropped else ""
        raise ClassificationDataError(f"empty file: no examples{why}; expected "
                                      f"{TSV_LAYOUT}", path)
    return rows


def _class_files(folder: Path) -> list[Path]:
    """Files under a class folder, hidden ones pruned, sorted by relative POSIX
    path. Links to folders are followed (each real folder read once, so a link
    to a folder above ends there); a link to nothing is an error."""
    found, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))  # a fixed walk
        for name in filenames:
            path = Path(dirpath) / name
            if name.startswith("."):
                continue
            if path.is_file():
                found.append(path)
            elif path.is_symlink() and not path.exists():
                raise ClassificationDataError("a link to nothing (a missing example?)", path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def read_tsv(paths: str | os.PathLike | Sequence[str | os.PathLike],
             labels: LabelSet | None = None, *, empty_text: str = "error",
             progress: bool | None = None) -> Examples:
    """Examples from one or more ``label<TAB>text`` files (in the given order).

    Args:
        paths: a file or a list of files.
        labels: None builds the :class:`LabelSet` from these files
            (training); pass the training set's labels when reading
            evaluation data.
        empty_text: ``"error"`` (an example with no text is an error) or
            ``"skip"``.
        progress: tqdm bars: True / False, or None for large files when
            stderr is a terminal.

    Returns:
        The :class:`Examples`.

    Raises:
        CorpusNotFoundError: no file given, or a missing one.
        ClassificationDataError: a malformed or empty file, naming it.
    """
    _check_choice("empty_text", empty_text, EMPTY_TEXT)
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise CorpusNotFoundError(None, TSV_LAYOUT, "classification file")
    rows, skipped = [], []
    for path in paths:
        rows.extend(_tsv_rows(Path(path), empty_text, skipped, progress))
    return _resolve(rows, labels, skipped)


def read_folder(root: str | os.PathLike, labels: LabelSet | None = None, *,
                classes: Sequence[str] | None = None, empty_text: str = "error",
                progress: bool | None = None) -> Examples:
    """Examples from a folder with one sub-folder per class, one file per example.

    Examples come in class-name order, then file order (sorted paths).

    Args:
        root: the folder.
        labels: None builds the :class:`LabelSet` from the class folders;
            given, a class folder that is not a known label is an error.
        classes: None (every sub-folder not starting with ``.``), or the
            class folders to read.
        empty_text: ``"error"`` (an empty file is an error) or ``"skip"``.
        progress: a tqdm bar: True / False, or None for 10,000 files or
            more when stderr is a terminal.

    Returns:
        The :class:`Examples`.

    Raises:
        CorpusNotFoundError: a missing folder.
        ClassificationDataError: no class folder, an empty one, an empty
            file, or no examples.
        UnknownLabelError: a class folder not in ``labels``.
    """
    _check_choice("empty_text", empty_text, EMPTY_TEXT)
    root = Path(root)
    if not root.is_dir():
        raise CorpusNotFoundError(root, FOLDER_LAYOUT, "classification folder")
    if classes is None:
        classes = sorted(d.name for d in root.iterdir()
                         if d.is_dir() and not d.name.startswith("."))
        if not classes:
            raise ClassificationDataError(f"no class sub-folders; expected {FOLDER_LAYOUT}",
                                          root)
    else:
        classes = sorted(set(classes))
        for name in classes:
            if not (root / name).is_dir():
                raise CorpusNotFoundError(root / name, FOLDER_LAYOUT, "class folder")
    if labels is not None:
        for name in classes:
            if name not in labels:
                error = UnknownLabelError(
                    f"{root / name}: class folder {name!r} is not a known label "
                    f"(known: {', '.join(labels.names)}; from labels.json of the "
                    "training data)")
                error.path = root / name
                raise error
    files = {}
    for name in classes:
        files[name] = _class_files(root / name)
        if not files[name]:
            raise ClassificationDataError("empty class folder: no files", root / name)
    total = sum(len(v) for v in files.values())
    rows, skipped = [], []
    with tqdm_bar(total=total, desc=root.name, leave=False,
                  disable=not show_bar(progress, total >= 10_000)) as bar:
        for name in classes:
            for path in files[name]:
                bar.update(1)
                text = _decode(path.read_bytes(), path)
                if not text.strip():
                    if empty_text == "error":
                        raise ClassificationDataError(
                            "empty file: an example with no text (pass "
                            "empty_text='skip' to drop such files)", path)
                    skipped.append(str(path))
                    continue
                rows.append((name, text, str(path)))
    if not rows:
        raise ClassificationDataError(f"no examples ({len(skipped)} empty files skipped)",
                                      root)
    return _resolve(rows, labels, skipped)


def read_examples(path: str | os.PathLike | Sequence[str | os.PathLike],
                  labels: LabelSet | None = None, **options) -> Examples:
    """:func:`read_folder` for a folder, :func:`read_tsv` for a file or a list
    of files.

    Args:
        path: a folder, a file or a list of files.
        labels: as for :func:`read_tsv` / :func:`read_folder`.
        **options: theirs (``classes`` for a folder only).

    Returns:
        The :class:`Examples`.

    Raises:
        CorpusNotFoundError: a missing path, naming both layouts.
    """
    if isinstance(path, (str, os.PathLike)):
        if Path(path).is_dir():
            return read_folder(path, labels, **options)
        if not Path(path).exists():
            raise CorpusNotFoundError(path, f"a file ({TSV_LAYOUT}) or a folder "
                                      f"({FOLDER_LAYOUT})", "classification data")
    if options.pop("classes", None) is not None:
        raise TxlError(f"classes= applies to a folder of class folders, not to "
                       f"line files ({path})")
    return read_tsv(path, labels, **options)


# -- tf.data -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Batching:
    batch_size: int
    max_length: int
    segment_len: int
    keep: str
    pad_id: int
    bucket: bool
    pad_to_max_length: bool
    drop_remainder: bool

    def __post_init__(self):
        for name in ("batch_size", "max_length", "segment_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise TxlError(f"{name} must be a positive int, got {value!r}")
            if value > MAX_POSITIONS:  # lengths are int32
                raise TxlError(f"{name} must be at most {MAX_POSITIONS} (2**31 - 1), got "
                               f"{value!r}")
        _check_choice("keep", self.keep, KEEP)
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, (int, np.integer)):
            raise TxlError(f"pad_id must be an int, got {self.pad_id!r}")
        if self.bucket and self.pad_to_max_length:
            raise TxlError("bucket and pad_to_max_length exclude each other "
                           "(bucketing exists to vary the padded length)")

    @property
    def num_segments(self) -> int:
        """Segments in the longest possible batch."""
        return math.ceil(self.max_length / self.segment_len)

    def truncate(self, ids, batched: bool):
        """Cut a document (or each row of a ragged batch) to ``max_length``."""
        cut = slice(None, self.max_length) if self.keep == "start" else \
            slice(-self.max_length, None)
        return ids[:, cut] if batched else ids[cut]


def _source(texts_or_ids, label_ids, shuffle, seed, shuffle_buffer, repeat):
    items = texts_or_ids if label_ids is None else (texts_or_ids, label_ids)
    ds = tf.data.Dataset.from_tensor_slices(items)
    if shuffle:
        n = len(label_ids) if label_ids is not None else int(ds.cardinality())
        buffer = shuffle_buffer if shuffle_buffer is not None else max(n, 1)
        if isinstance(buffer, bool) or not isinstance(buffer, (int, np.integer)) or buffer <= 0:
            raise TxlError(f"shuffle_buffer must be a positive int, got {shuffle_buffer!r}")
        ds = ds.shuffle(int(buffer), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds


def _features(ragged: tf.RaggedTensor, opts: _Batching) -> dict:
    """A ragged batch of (truncated) documents -> ``{"token_ids", "lengths"}``,
    padded to a multiple of ``segment_len`` (or to the maximum)."""
    lengths = tf.cast(ragged.row_lengths(), tf.int32)
    ids = ragged.to_tensor(default_value=opts.pad_id)
    width, step = tf.shape(ids)[1], opts.segment_len
    if opts.pad_to_max_length:
        target = opts.num_segments * step
    else:
        target = tf.maximum((width + step - 1) // step, 1) * step
    ids = tf.pad(ids, [[0, 0], [0, target - width]], constant_values=opts.pad_id)
    batch = opts.batch_size if opts.drop_remainder else None
    ids.set_shape([batch, target if opts.pad_to_max_length else None])
    lengths.set_shape([batch])
    return {"token_ids": ids, "lengths": lengths}


def _bucket(ds: tf.data.Dataset, opts: _Batching) -> tf.data.Dataset:
    """Per-document ``ids [n]`` or ``(ids [n], label)`` -> batches of documents
    with the same number of segments, padded to exactly that many."""
    def features(ids, *label):
        f = {"token_ids": ids, "lengths": tf.shape(ids, out_type=tf.int32)[0]}
        return (f, *label) if label else f

    has_label = isinstance(ds.element_spec, tuple)
    zero = tf.constant(0, tf.int32)
    pad = {"token_ids": tf.constant(opts.pad_id, tf.int32), "lengths": zero}

    def segments(f, *label):  # key k: documents of k + 1 segments
        return tf.cast((f["lengths"] - 1) // opts.segment_len, tf.int64)

    def batch(key, group):  # padded to exactly (k + 1) * segment_len
        shapes = {"token_ids": [(key + 1) * opts.segment_len], "lengths": []}
        return group.padded_batch(opts.batch_size, (shapes, []) if has_label else shapes,
                                  (pad, zero) if has_label else pad,
                                  drop_remainder=opts.drop_remainder)

    # Grouped by a key computed per document, not by a list of every possible
    # segment count (`bucket_by_sequence_length`: a huge max_length hung making it).
    return ds.map(features).group_by_window(segments, batch, window_size=opts.batch_size)


def classification_dataset(examples: Examples | Sequence[str], tokenizer: Tokenizer,
                           batch_size: int, *, max_length: int, segment_len: int,
                           keep: str = "start", pad_id: int = 0, bucket: bool = False,
                           pad_to_max_length: bool = False, shuffle: bool = False,
                           seed: int | None = None, shuffle_buffer: int | None = None,
                           repeat: bool = False, drop_remainder: bool = False,
                           tokenize_chunk: int = 256) -> tf.data.Dataset:
    """Batches of tokenized documents for the classifier.

    Row b's document is ``token_ids[b, :lengths[b]]``, then ``pad_id``. Texts
    are tokenized in the graph (``tokenizer.encode_tf``). ``L`` is the
    batch's longest document rounded up to a multiple of ``segment_len`` (so
    at most ``ceil(max_length / segment_len)`` distinct shapes ever occur),
    or always that maximum with ``pad_to_max_length``.

    Args:
        examples: :class:`Examples`, or a list of texts (the features alone,
            for ``predict``).
        tokenizer: the model's `Tokenizer`.
        batch_size: documents per batch.
        max_length: documents are cut to this many tokens.
        segment_len: the classifier's; ``L`` is a multiple of it.
        keep: which part a cut keeps: ``"start"`` or ``"end"``.
        pad_id: the id after each document.
        bucket: group documents with the same number of segments, so no
            batch carries a whole segment of padding.
        pad_to_max_length: ``L`` always ``max_length`` rounded up.
        shuffle: shuffle before ``repeat`` (a new order each epoch).
        seed: None, or an int that makes the shuffle reproducible.
        shuffle_buffer: None (the whole set), or the buffer size.
        repeat: repeat for ever.
        drop_remainder: a static batch size.
        tokenize_chunk: texts per tokenizer call with ``bucket`` (without
            it, whole batches are tokenized at once).

    Returns:
        A `tf.data.Dataset` of ``({"token_ids": int32 [B, L], "lengths":
        int32 [B]}, label_ids int32 [B])``, or the features alone.

    Raises:
        TxlError: no examples, an empty text or a bad option.
        TypeError: a tokenizer that is no `Tokenizer`, or a text no str.
    """
    opts = _Batching(batch_size, max_length, segment_len, keep, pad_id, bucket,
                     pad_to_max_length, drop_remainder)
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a txl_tf.text.Tokenizer, got "
                        f"{type(tokenizer).__name__}")
    if isinstance(examples, Examples):
        texts, label_ids = examples.texts, examples.label_ids
        sources = examples.sources
    else:
        texts, label_ids = list(examples), None
        sources = [f"text {i}" for i in range(len(texts))]
    if not texts:
        raise TxlError("no examples to make a dataset from")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{sources[i]}: expected str, got {type(text).__name__}")
        if not text.strip():
            raise TxlError(f"{sources[i]}: empty text (a document needs at least "
                           "one token)")
    if isinstance(tokenize_chunk, bool) or not isinstance(tokenize_chunk, int) \
            or tokenize_chunk <= 0:
        raise TxlError(f"tokenize_chunk must be a positive int, got {tokenize_chunk!r}")
    ds = _source(tf.constant(texts, tf.string), label_ids, shuffle, seed,
                 shuffle_buffer, repeat)

    def encode(texts):
        return opts.truncate(tokenizer.encode_tf(texts), batched=True)

    if opts.bucket:  # tokenize in chunks, then group single documents
        def chunk(texts, *label):
            ragged = encode(texts)
            return (ragged.to_tensor(default_value=opts.pad_id),
                    tf.cast(ragged.row_lengths(), tf.int32), *label)
        ds = (ds.batch(tokenize_chunk).map(chunk, num_parallel_calls=tf.data.AUTOTUNE)
              .unbatch().map(lambda ids, n, *label: (ids[:n], *label) if label else ids[:n]))
        ds = _bucket(ds, opts)
    else:  # tokenize whole batches
        ds = ds.batch(opts.batch_size, drop_remainder=opts.drop_remainder).map(
            lambda texts, *label: (_features(encode(texts), opts), *label) if label
            else _features(encode(texts), opts), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def _check_int32_ids(ids: np.ndarray, row_splits, first_row: int = 0) -> None:
    """Raises `TxlError` for an id (of the documents `ids` split at
    `row_splits`) that int32 cannot hold: the cast would wrap it."""
    bad = np.flatnonzero((ids < -2 ** 31) | (ids > MAX_POSITIONS))
    if bad.size:
        row = first_row + int(np.searchsorted(row_splits, bad[0], side="right")) - 1
        raise TxlError(f"document {row}: id {ids[bad[0]]} does not fit int32, the model's "
                       "id dtype (the cast would wrap it)")


def token_dataset(documents: Sequence[Sequence[int]] | tf.RaggedTensor,
                  label_ids: Sequence[int] | np.ndarray | None, batch_size: int, *,
                  max_length: int, segment_len: int, keep: str = "start",
                  pad_id: int = 0, bucket: bool = False, pad_to_max_length: bool = False,
                  shuffle: bool = False, seed: int | None = None,
                  shuffle_buffer: int | None = None, repeat: bool = False,
                  drop_remainder: bool = False) -> tf.data.Dataset:
    """:func:`classification_dataset` for documents that are already token ids.

    Args:
        documents: lists of ints, or an int RaggedTensor ``[N, None]``; none
            empty.
        label_ids: ``N`` ints, or None (the features alone).
        batch_size, max_length, segment_len, keep, pad_id, bucket,
            pad_to_max_length, shuffle, seed, shuffle_buffer, repeat,
            drop_remainder: as for :func:`classification_dataset`.

    Returns:
        A `tf.data.Dataset`, as :func:`classification_dataset`'s.

    Raises:
        TxlError: no documents, an empty one, or bad ids or labels.
    """
    opts = _Batching(batch_size, max_length, segment_len, keep, pad_id, bucket,
                     pad_to_max_length, drop_remainder)
    if not isinstance(documents, tf.RaggedTensor):
        rows = [np.asarray(d) for d in documents]
        for i, row in enumerate(rows):
            if row.ndim != 1 or (row.size and not is_integer_dtype(row.dtype)):
                raise TxlError(f"document {i} must be a 1-D sequence of ints, got "
                               f"shape {row.shape} dtype {row.dtype}")
            _check_int32_ids(row, [0, row.size], i)
        lengths = np.array([r.size for r in rows], np.int64)
        flat = np.concatenate(rows).astype(np.int32) if rows else np.zeros([0], np.int32)
        documents = tf.RaggedTensor.from_row_lengths(flat, lengths)
    elif not documents.dtype.is_integer:  # the cast would cut 1.5 to 1
        raise TxlError(f"documents must hold ints, got dtype {documents.dtype.name}")
    elif documents.dtype.size > 4 or documents.dtype == tf.uint32:
        _check_int32_ids(documents.flat_values.numpy(), documents.row_splits.numpy())
    documents = tf.cast(documents, tf.int32)
    if documents.ragged_rank != 1 or documents.shape.rank != 2:
        raise TxlError(f"documents must be [N, None], got shape {documents.shape}")
    lengths = documents.row_lengths().numpy()
    if lengths.size == 0:
        raise TxlError("no documents to make a dataset from")
    if (lengths == 0).any():
        raise TxlError(f"document {int(np.flatnonzero(lengths == 0)[0])} is empty "
                       "(a document needs at least one token)")
    if label_ids is not None:
        label_ids = np.asarray(label_ids)
        if label_ids.shape != (lengths.size,) or (
                label_ids.size and not is_integer_dtype(label_ids.dtype)):
            raise TxlError(f"label_ids must be {lengths.size} ints, got shape "
                           f"{label_ids.shape} dtype {label_ids.dtype}")
        bad = np.flatnonzero((label_ids < 0) | (label_ids > MAX_POSITIONS))
        if bad.size:  # the int32 cast would wrap it
            i = int(bad[0])
            raise TxlError(f"label_ids[{i}] = {label_ids[i]} is no class id (0 or more, "
                           "within int32)")
        label_ids = label_ids.astype(np.int32)
    ds = _source(documents, label_ids, shuffle, seed, shuffle_buffer, repeat)
    if opts.bucket:
        ds = _bucket(ds.map(lambda ids, *label: (opts.truncate(ids, batched=False), *label)
                            if label else opts.truncate(ids, batched=False)), opts)
    else:
        ds = ds.ragged_batch(opts.batch_size, drop_remainder=opts.drop_remainder).map(
            lambda ids, *label: (_features(opts.truncate(ids, batched=True), opts), *label)
            if label else _features(opts.truncate(ids, batched=True), opts))
    return ds.prefetch(tf.data.AUTOTUNE)
