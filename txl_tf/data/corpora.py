"""Readers for the standard language-modelling corpora, encoded and cached.

``load_corpus(name, data_dir)`` returns a :class:`Corpus` with int32 id arrays
``train``/``valid``/``test`` and its tokenizer. Conventions follow the
Transformer-XL paper's code (kimiyoung/transformer-xl):

* enwik8: raw bytes, no end-of-line token; first 90% / next 5% / last 5%
  (90M / 5M / 5M bytes of the real file). The paper's preprocessing drops
  newline bytes and numbers symbols by frequency; we keep every byte, id = byte.
* text8: characters, split 90 / 5 / 5; vocabulary from the training part.
* wt2, wt103, ptb: words, ``<eos>`` after every line, ``<unk>`` for unknown
  words; vocabulary from the training file (``<eos>``, ``<unk>`` first).
* lm1b: each sentence wrapped as ``<S> words <S>`` (the paper's
  ``add_double_eos``) and the sentences joined in order, as the paper's TF
  code reads them (two ``<S>`` between sentences, both scored); the PyTorch
  code's ``LMShuffledIterator`` reads one ``<S>`` between sentences, so its
  perplexities score one token fewer a sentence. Unknown words ``<UNK>``;
  vocabulary from ``1b_word_vocab.txt`` when present, else built from the
  training shards.
  Training shards are concatenated in sorted order (no shuffling); valid is
  heldout shard 1 and test heldout shard 0 (the paper used shard 0 for both).
* text: any file or folder (all non-hidden files, sorted), bytes, 90 / 10
  (``test`` is empty).
* pystdlib: this Python's standard library ``*.py`` files (sorted, capped
  at ``max_bytes``), bytes, 90 / 5 / 5. Needs no download.

enwik8, text and pystdlib read with a trained model's word or SentencePiece
tokenizer (``load_corpus(tokenizer=...)``) move each split point on to the
start of the next line, so no line (and no word) is cut in two; where no
line starts after it, it stays, at a character boundary. Each file is then
whole lines: a byte-order mark starting it is skipped, and a last line
without its newline ends there, not in the next file's first line. Bytes and
characters split where the percentages fall. text8 read with such a
tokenizer is encoded in chunks that end at a line start or else at a space
(its split points too), so no word is cut and no ``<eos>`` added inside a
line; read as characters, it is cut where the chunk sizes fall.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sysconfig
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from txl_tf.app.files import naming, reading
from txl_tf.app.progress import log_lines, progress_bar
from txl_tf.data import cache as cache_lib
from txl_tf.errors import TxlError
from txl_tf.text import ByteTokenizer, CharTokenizer, Tokenizer, WordTokenizer, load_tokenizer
from txl_tf.text.vocab import count_tokens, utf16_hint

SPLITS = cache_lib.SPLITS
CHUNK_BYTES = 16 << 20
PROGRESS_MIN_BYTES = 32 << 20
LM1B_DIR = "1-billion-word-language-modeling-benchmark-r13output"
BOM = "\ufeff".encode("utf-8")


class CorpusNotFoundError(TxlError, FileNotFoundError):
    """A corpus file or folder is missing; the message shows the expected layout."""

    def __init__(self, path: Path | str | None, layout: str, what: str = "corpus file"):
        self.path = path
        where = f"{what} not found: {path}" if path is not None else f"{what} not given"
        super().__init__(f"{where}\nexpected layout: {layout}")


class EmptyCorpusError(TxlError):
    """A corpus (or one of its required splits) has no tokens."""


@dataclasses.dataclass
class Corpus:
    """An encoded corpus (:func:`load_corpus` makes one).

    Args:
        name: the corpus name.
        train: 1-D int32 ids (a read-only memory map when loaded from the
            cache with ``mmap=True``).
        valid: 1-D int32 ids.
        test: 1-D int32 ids.
        tokenizer: the `Tokenizer` that encoded them.
        cache_path: the cache entry, or None.
        from_cache: whether the ids were read from the cache.
    """

    name: str
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    cache_path: Path | None = None
    from_cache: bool = False

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: str) -> np.ndarray:
        """One split's ids.

        Args:
            name: ``train``, ``valid`` or ``test``.

        Returns:
            The 1-D int32 ids.
        """
        if name not in SPLITS:
            raise TxlError(f"unknown split {name!r}; known: {', '.join(SPLITS)}")
        return getattr(self, name)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={len(getattr(self, s)):,}" for s in SPLITS)
        return (f"Corpus({self.name!r}, {sizes}, vocab_size={self.vocab_size}, "
                f"from_cache={self.from_cache})")


@dataclasses.dataclass
class _Plan:
    """What a reader needs: sources (cache key), options (cache key), a build
    function writing the splits, and the splits that must not be empty."""

    sources: list[Path]
    options: dict
    build: Callable[[dict, bool | None, Tokenizer | None], Tokenizer]
    required: tuple[str, ...] = SPLITS
    describe: dict = dataclasses.field(default_factory=dict)
    byte_split: bool = False  # split by `_write_bytes` (see `_splits_at_lines`)
    space_cuts: bool = False  # cut by `_line_pieces` for words and pieces (text8)
    listed: Path | None = None  # a folder whose every non-hidden file is read (text)


# -- reading helpers ---------------------------------------------------------

def _bar(progress: bool | None, size: int, desc: str):
    """A bar over `size` bytes: tqdm's for files of `PROGRESS_MIN_BYTES` or
    more on a terminal, a line every 10% in a log (`progress_bar`)."""
    return progress_bar(progress, size >= PROGRESS_MIN_BYTES, total=size, unit="B",
                        unit_scale=True, desc=desc, leave=False)


def _decode(data: bytes, path: Path, offset: int = 0) -> str:
    """`data` (from byte `offset` of `path`) as text, else a `TxlError` naming the byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _not_utf8(path, offset + err.start, data[:2] if offset == 0 else b"") from None


def _not_utf8(path: Path, byte: int, head: bytes) -> TxlError:
    """The error for byte `byte` of `path`, whose first bytes are `head`."""
    return TxlError(f"{path}: not valid UTF-8 near byte {byte}{utf16_hint(head, ' (%s)')}")


def iter_text_chunks(path: Path, progress: bool | None = None, desc: str = "",
                     chunk_bytes: int | None = None) -> Iterator[str]:
    """Yield a UTF-8 file as str chunks of whole lines (``\\n``-terminated,
    except perhaps the last), with a tqdm bar over bytes for large files. A
    byte-order mark starting the file (U+FEFF, as Notepad writes) is dropped."""
    for text, _ in _text_pieces(path, progress, desc, chunk_bytes):
        yield text


def _text_pieces(path: Path, progress: bool | None = None, desc: str = "",
                 chunk_bytes: int | None = None, long_lines: bool = False
                 ) -> Iterator[tuple[str, bool]]:
    """`(text, goes_on)`: `iter_text_chunks`'s chunks (`goes_on` False); with
    `long_lines`, a line longer than a chunk comes in pieces cut just after a
    space (`_after_space`; `goes_on`: its line goes on in the next piece)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    size = path.stat().st_size
    with open(path, "rb") as f, _bar(progress, size, desc or path.name) as bar:
        def blocks():
            while True:
                try:
                    block = f.read(chunk_bytes)
                except OSError as err:
                    raise reading(err, path) from err
                if not block:
                    return
                bar.update(len(block))
                yield block

        def cut(block):
            return _line_cut(block, long_lines and len(block) >= chunk_bytes)

        yield from _pieces(blocks(), cut, lambda data, at: _decode(data, path, at), skip_bom=True)


def _pieces(blocks: Iterator[bytes], cut, decode, offset: int = 0, skip_bom: bool = False
            ) -> Iterator[tuple[str, bool]]:
    """`(text, goes_on)` from the bytes `blocks` yields in order (the first
    at byte `offset`): what a block leaves joins the next, and each is cut
    where `cut(block)` says, `(at, goes_on)`; `decode(data, at)` makes the
    text. With `skip_bom`, a byte-order mark at byte 0 is dropped."""
    rest = b""  # from byte `offset`
    for block in blocks:
        block = rest + block
        if skip_bom and offset == 0 and block.startswith(BOM):
            block, offset = block[len(BOM):], len(BOM)
        at, goes_on = cut(block)
        rest = block[at:]
        if at:
            yield decode(block[:at], offset), goes_on
            offset += at
    if rest:
        yield decode(rest, offset), False


def _line_cut(block: bytes, long_line: bool) -> tuple[int, bool]:
    """`(at, goes_on)`: `block` cut after its last line end; where it has
    none and `long_line`, just after its last space (`_after_space`), its
    line going on in the next piece."""
    at = block.rfind(b"\n") + 1
    if at or not long_line:
        return at, False
    at = _after_space(block)
    return at, at > 0


# Bytes that `str.split()` splits words at and a word tokenizer's line does not
# end at (not \r), each a whole character: a long line is cut after one.
_SPACE_BYTES = tuple(bytes([c]) for c in b" \t\x0b\x0c\x1c\x1d\x1e\x1f")


def _after_space(block: bytes) -> int:
    """Where `block` is cut in a long line: just after its last space byte
    (a tab, a form feed, ... too); 0 where it has none."""
    return max(block.rfind(space) for space in _SPACE_BYTES) + 1


def _cuts_at_spaces(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` reads a line cut at a space as the whole line, but
    for the markers of the cut (a word's line end and start; none for bytes
    and characters). Not SentencePiece: a space begins a piece."""
    return tokenizer.kind in ("word", "byte", "char")


def _encode_pieces(tokenizer: Tokenizer, pieces: Iterator[tuple[str, bool]]
                   ) -> Iterator[np.ndarray]:
    """The ids of `_text_pieces`' pieces: a piece whose line goes on loses the
    line end a word tokenizer adds, the next piece its line start (where no
    piece follows, the line end comes after all)."""
    word = tokenizer.kind == "word"
    head = 1 if word and tokenizer.bos_id >= 0 else 0
    tail = 1 if word else 0
    follows, end = False, None
    for text, goes_on in pieces:
        ids = tokenizer.encode(text)
        end = ids[len(ids) - tail:]
        yield ids[head if follows else 0:len(ids) - tail if goes_on else len(ids)]
        follows = goes_on
    if follows:
        yield end


def _encode_file(tokenizer: Tokenizer, path: Path, progress: bool | None = None,
                 desc: str = "") -> Iterator[np.ndarray]:
    """`path`'s ids, a chunk at a time (a long line in pieces, where
    `_cuts_at_spaces`)."""
    return _encode_pieces(tokenizer, _text_pieces(path, progress, desc,
                                                  long_lines=_cuts_at_spaces(tokenizer)))


def _count_file(path: Path, progress: bool | None = None, desc: str = "") -> Iterator[str]:
    """`path`'s text for counting words, a chunk at a time (a long line in pieces)."""
    return (text for text, _ in _text_pieces(path, progress, desc, long_lines=True))


def _read_bytes(path: Path) -> bytes:
    """`path`'s bytes; a failed read names `path` (`reading`)."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise reading(err, path) from err


def _require_dir(data_dir, layout: str) -> Path:
    if data_dir is None:
        raise CorpusNotFoundError(None, layout, "data_dir")
    data_dir = Path(data_dir)
    if not data_dir.exists():
        raise CorpusNotFoundError(data_dir, layout, "data directory")
    return data_dir


def _find(data_dir: Path, names: list[str], layout: str) -> Path:
    for name in names:
        if (data_dir / name).is_file():
            return data_dir / name
    raise CorpusNotFoundError(data_dir / names[0], layout)


def _split_points(n: int, percents: tuple[int, int, int]) -> tuple[int, int]:
    n_valid = n * percents[1] // 100
    n_test = n * percents[2] // 100
    return n - n_valid - n_test, n - n_test


def _char_start(data: bytes, i: int) -> int:
    """`i`, moved back to the first byte of the UTF-8 character it falls in."""
    while 0 < i < len(data) and data[i] & 0xC0 == 0x80:
        i -= 1
    return i


def _splits_at_lines(tokenizer: Tokenizer | None) -> bool:
    """Whether a byte split must fall between lines for `tokenizer`: words
    and pieces (a line cut in two would read as two lines, each with its
    end-of-line id, a word cut in two as two words); not bytes or characters."""
    return tokenizer is not None and tokenizer.kind not in ("byte", "char")


def _line_pieces(text: str, lo: int, hi: int, step: int,
                 can_cut: Callable[[int], bool] = lambda space: True
                 ) -> Iterator[tuple[int, int, bool]]:
    """`(start, end, inside)`: `text[lo:hi]` in pieces of about `step`
    characters for a word or SentencePiece tokenizer, each ending just after
    a `\n`, else at a space of the same line where `can_cut(space)` (`inside`: the line goes
    on after it; the space itself is in neither piece, a word tokenizer's
    separator and what a SentencePiece model's prefix stands for), else at
    the next line start or `hi`."""
    start = lo
    while start < hi:
        end, inside = min(start + step, hi), False
        if end < hi:
            newline = text.rfind("\n", start, end)
            ahead = text.find("\n", end, hi) if newline < 0 else -1  # the line's end
            # a space before that line end (a piece follows)
            space = text.find(" ", end, ahead if ahead >= 0 else hi - 1) if newline < 0 else -1
            if newline >= 0:
                end = newline + 1
            elif space >= 0 and can_cut(space):
                end, inside = space, True
            else:
                end = ahead + 1 if ahead >= 0 else hi
        yield start, end, inside
        start = end + 1 if inside else end


def _word_cut(text: str, i: int) -> tuple[int, int]:
    """`(end, start)`: where a part of `text` cut at `i` ends and the next
    starts, moved on to the next line start (not the text's end: a text of
    one line that ends in `\n` is cut at a space), else to the next space (in
    neither part), else `(i, i)`."""
    if i <= 0 or i >= len(text) or text[i - 1] == "\n":
        return i, i
    newline = text.find("\n", i)
    if 0 <= newline < len(text) - 1:
        return newline + 1, newline + 1
    space = text.find(" ", i)
    return (space, space + 1) if space >= 0 else (i, i)


def _encode_in_pieces(tokenizer: Tokenizer, text: str, lo: int, hi: int, step: int):
    """The ids `tokenizer` gives `text[lo:hi]`, encoded in `_line_pieces`: a
    piece ending inside a line loses the end-of-line id its encoding adds,
    the next piece its start-of-line id, so no `<eos>` is added that the
    text has not and no word is cut in two."""
    eos = tokenizer.eos_id if getattr(tokenizer, "add_eos", True) else None
    bos = getattr(tokenizer, "bos_id", -1)
    head, tail = [bos] if bos >= 0 else [], [eos] if eos is not None else []
    markers = tokenizer.encode("\n").tolist()
    if markers != head + tail:  # a line's markers, known
        raise TxlError(f"cannot read {tokenizer.kind} ids in pieces: a line's markers are "
                       f"{markers}, not {head + tail}")

    def exact(space):  # the words around `space` read alike whole and cut there
        left = max(lo, text.rfind(" ", lo, space) + 1, text.rfind("\n", lo, space) + 1)
        right = min([i for i in (text.find(" ", space + 1, hi), text.find("\n", space + 1, hi))
                     if i >= 0] or [hi])
        whole = tokenizer.encode(text[left:right]).tolist()
        cut = tokenizer.encode(text[left:space]).tolist()[:-len(tail) or None] + \
            tokenizer.encode(text[space + 1:right]).tolist()[len(head):]
        return whole == cut

    follows = False  # the piece goes on with the line of the one before
    for start, end, inside in _line_pieces(text, lo, hi, step, exact):
        ids = tokenizer.encode(text[start:end])
        yield ids[len(head) if follows else 0:len(ids) - len(tail) if inside else len(ids)]
        follows = inside


def _whole_characters(data: bytes) -> int:
    """The length of `data` without an incomplete UTF-8 character at its end."""
    last = _char_start(data, len(data) - 1) if data else 0
    lead = data[last] if data else 0
    need = 4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2 if lead >= 0xC0 else 1
    return last if last + need > len(data) else len(data)


class _Concat:
    """The first `limit` bytes of `files` joined, read by range: a reader holds
    a chunk of the corpus at a time, never the whole of it. With `lines` (for
    a word or SentencePiece tokenizer), each file is whole lines of text: a
    byte-order mark starting it is skipped, and a `\\n` ends a file but the
    last that does not end with one (its last line would run into the next
    file's first)."""

    def __init__(self, files: list[Path], limit: int | None = None, lines: bool = False):
        # (path, start, end, its bytes or None, where `start` is in the file) in the joined bytes
        self.spans, total = [], 0
        for n, path in enumerate(files):
            # a file that gives its size as 0 (/proc's) is read whole: its read says what it holds
            held = _read_bytes(path) if path.stat().st_size == 0 else None
            size = len(held) if held is not None else path.stat().st_size
            skip = 0
            if lines and size:
                skip = len(BOM) if self._bytes(path, held, 0, len(BOM)) == BOM else 0
            self.spans.append((path, total, total + size - skip, held, skip))
            total += size - skip
            if lines and size > skip and n < len(files) - 1 \
                    and self._bytes(path, held, size - 1, 1) != b"\n":
                self.spans.append((path, total, total + 1, b"\n", 0))
                total += 1
        self.size = total if limit is None else min(total, limit)

    @staticmethod
    def _bytes(path: Path, held: bytes | None, at: int, count: int) -> bytes:
        """`count` bytes of `path` (`held`, if read) from byte `at`."""
        if held is not None:
            return held[at:at + count]
        try:
            with open(path, "rb") as f:
                f.seek(at)
                return f.read(count)
        except OSError as err:
            raise reading(err, path) from err

    def read(self, lo: int, hi: int) -> bytes:
        """Bytes `[lo, hi)` of the joined files (clipped to `[0, size)`)."""
        lo, hi = max(lo, 0), min(hi, self.size)
        parts = []
        for path, start, end, held, skip in self.spans:
            if end <= lo or start >= hi or end == start:
                continue
            want = min(hi, end) - max(lo, start)
            at = skip + max(lo - start, 0)
            if held is not None:
                parts.append(held[at:at + want])
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(at)
                    data = f.read(want)
            except OSError as err:
                raise reading(err, path) from err
            if len(data) != want:
                raise TxlError(f"{path}: shorter than when it was listed (changed while read)")
            parts.append(data)
        return b"".join(parts)

    def where(self, i: int) -> tuple[Path, int]:
        """The file that byte `i` of the joined bytes comes from, and its place there."""
        for path, start, end, held, skip in self.spans:
            if start <= i < end:
                return path, skip + i - start
        raise IndexError(i)

    def decode(self, data: bytes, at: int) -> str:
        """`data` (from byte `at` of the joined bytes) as text, else a
        `TxlError` naming the bad byte by its file and its place there."""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            file, byte = self.where(at + err.start)
            head = self.read(at + err.start - byte, at + err.start - byte + 2) if byte < 2 \
                else b""
            raise _not_utf8(file, byte, head) from None

    def char_start(self, i: int, size: int) -> int:
        """`_char_start` at byte `i` of the first `size` bytes."""
        if i <= 0 or i >= size:
            return i
        head = max(i - 3, 0)
        return head + _char_start(self.read(head, i + 1), i - head)

    def whole_characters(self) -> int:
        """`_whole_characters` of the joined bytes."""
        head = max(self.size - 4, 0)
        return head + _whole_characters(self.read(head, self.size))

    def line_start(self, i: int, size: int) -> int:
        """`_line_start` at byte `i` of the first `size` bytes, looking for
        the line's end a chunk at a time."""
        if i <= 0 or i >= size or self.read(i - 1, i) == b"\n":
            return i
        for lo in range(i, size, CHUNK_BYTES):
            found = self.read(lo, min(lo + CHUNK_BYTES, size)).find(b"\n")
            if found >= 0:
                if lo + found + 1 < size:  # a line starts there, not the text's end
                    return lo + found + 1
                break
        return self.char_start(i, size)


def _write_bytes(source: _Concat, writers: dict, percents: tuple[int, int, int],
                 given: Tokenizer | None, path: Path, progress: bool | None = None,
                 chunk_bytes: int | None = None) -> Tokenizer:
    """Splits `source` by bytes; ids are the bytes unless another tokenizer
    (a trained model's) is `given`, which then encodes each split's text,
    a chunk of whole lines (characters, for a character tokenizer) at a time;
    `chunk_bytes` (default `CHUNK_BYTES`) are read at once."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    text = given is not None and not isinstance(given, ByteTokenizer)
    size = source.whole_characters() if text else source.size  # max_bytes may cut the last one
    a, b = _split_points(size, percents)
    if text and _splits_at_lines(given):
        a = source.line_start(a, size)
        b = source.line_start(max(a, b), size)
    elif text:
        a, b = source.char_start(a, size), source.char_start(b, size)  # each part decodes alone
    bar = _bar(progress, size, f"{path.name}: encoding")

    def blocks(lo, hi):
        for start in range(lo, hi, chunk_bytes):
            block = source.read(start, min(start + chunk_bytes, hi))
            bar.update(len(block))
            yield block

    def cut(block):  # a line's end for words and pieces (lines encode alone), else a character's
        if not _splits_at_lines(given):
            return _whole_characters(block), False
        return _line_cut(block, _cuts_at_spaces(given) and len(block) >= chunk_bytes)

    for split, lo, hi in zip(SPLITS, (0, a, b), (a, b, size)):
        if text:
            for ids in _encode_pieces(given, _pieces(blocks(lo, hi), cut, source.decode, lo)):
                writers[split].append(ids)
            continue
        for block in blocks(lo, hi):
            writers[split].append(np.frombuffer(block, dtype=np.uint8).astype(np.int32))
    bar.close()
    return given if text else ByteTokenizer()


def _list_files(root: Path, suffix: str = "", skip_dirs: tuple[str, ...] = ()) -> list[Path]:
    """Regular files under ``root`` (hidden ones and ``skip_dirs`` pruned),
    sorted by relative POSIX path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in skip_dirs]
        for name in filenames:
            if not name.startswith(".") and name.endswith(suffix):
                path = Path(dirpath) / name
                if path.is_file():
                    found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


# -- readers -----------------------------------------------------------------

def _bytes_file(name: str, data_dir, opts: dict) -> _Plan:
    layout = f"<data_dir>/{name} (the raw file from {name}.zip)"
    data_dir = _require_dir(data_dir, layout)
    path = data_dir if data_dir.is_file() else _find(data_dir, [name], layout)
    percents = (90, 5, 5)

    if name == "enwik8":
        def build(writers, progress, given):
            source = _Concat([path], lines=_splits_at_lines(given))
            return _write_bytes(source, writers, percents, given, path, progress)
    else:  # text8: characters with a vocabulary
        def build(writers, progress, given):
            text = _decode(_read_bytes(path), path)
            a, b = _split_points(len(text), percents)
            step = CHUNK_BYTES
            tokenizer = given if given is not None else CharTokenizer.build(
                text[i:min(i + step, a)] for i in range(0, a, step))
            if _splits_at_lines(tokenizer):  # words, pieces: no word cut, no <eos> added
                (a, valid), (b, test) = _word_cut(text, a), _word_cut(text, b)
                if b < valid:  # both in one word
                    b, test = valid, valid
                for split, lo, hi in zip(SPLITS, (0, valid, test), (a, b, len(text))):
                    for ids in _encode_in_pieces(tokenizer, text, lo, hi, step):
                        writers[split].append(ids)
                return tokenizer
            for split, lo, hi in zip(SPLITS, (0, a, b), (a, b, len(text))):
                for i in range(lo, hi, step):
                    writers[split].append(tokenizer.encode(text[i:min(i + step, hi)]))
            return tokenizer
    options = {"percents": percents}
    if name == "text8":  # a new cache key: entries cached before counted past the training part
        options["vocabulary_from"] = "train"
    return _Plan([path], options, build, describe={"all": str(path)},
                 byte_split=name == "enwik8", space_cuts=name == "text8")


def _word_files(name: str, data_dir, opts: dict) -> _Plan:
    if name == "ptb":
        names = {s: [f"ptb.{s}.txt", f"{s}.txt"] for s in SPLITS}
        layout = "<data_dir>/ptb.{train,valid,test}.txt (or {train,valid,test}.txt)"
    else:
        names = {s: [f"wiki.{s}.tokens", f"{s}.txt"] for s in SPLITS}
        layout = "<data_dir>/wiki.{train,valid,test}.tokens (or {train,valid,test}.txt)"
    data_dir = _require_dir(data_dir, layout)
    files = {s: _find(data_dir, names[s], layout) for s in SPLITS}

    def build(writers, progress, given):
        tokenizer = given if given is not None else WordTokenizer.from_counts(
            count_tokens(_count_file(files["train"], progress, f"{name}: counting")),
            min_count=opts["min_count"], max_size=opts["max_size"])
        for split in SPLITS:
            for ids in _encode_file(tokenizer, files[split], progress, f"{name}: {split}"):
                writers[split].append(ids)
        return tokenizer
    return _Plan(list(files.values()), dict(opts), build,
                 describe={s: str(p) for s, p in files.items()})


def _lm1b(name: str, data_dir, opts: dict) -> _Plan:
    layout = (f"<data_dir>/[{LM1B_DIR}/]training-monolingual.tokenized.shuffled/news.en-*"
              " and heldout-monolingual.tokenized.shuffled/news.en.heldout-NNNNN-of-00050;"
              " optional <data_dir>/1b_word_vocab.txt")
    shards = opts["max_train_shards"]
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or shards < 1):
        raise TxlError(f"max_train_shards must be an integer >= 1 (or None: all), got "
                       f"{shards!r}")
    for key in ("valid_shard", "test_shard"):
        shard = opts[key]
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < 50:
            raise TxlError(f"{key} must be a heldout shard number in [0, 49], got {shard!r}")
    data_dir = _require_dir(data_dir, layout)
    root = data_dir / LM1B_DIR if (data_dir / LM1B_DIR).is_dir() else data_dir
    train_dir = root / "training-monolingual.tokenized.shuffled"
    if not train_dir.is_dir():
        raise CorpusNotFoundError(train_dir, layout, "lm1b training folder")
    train = sorted(p for p in train_dir.glob("news.en-*") if p.is_file())
    if not train:
        raise CorpusNotFoundError(train_dir / "news.en-*", layout, "lm1b training shards")
    if opts["max_train_shards"] is not None:
        train = train[:opts["max_train_shards"]]
    heldout = root / "heldout-monolingual.tokenized.shuffled"
    held = {}
    for split, shard in (("valid", opts["valid_shard"]), ("test", opts["test_shard"])):
        held[split] = heldout / f"news.en.heldout-{shard:05d}-of-00050"
        if not held[split].is_file():
            raise CorpusNotFoundError(held[split], layout)
    vocab_file = opts["vocab_file"]
    if vocab_file is None and (data_dir / "1b_word_vocab.txt").is_file():
        vocab_file = data_dir / "1b_word_vocab.txt"
    elif vocab_file is not None:
        vocab_file = Path(vocab_file)
        if not vocab_file.is_file():
            raise CorpusNotFoundError(vocab_file, layout, "lm1b vocabulary file")
    tokens = dict(unk_token="<UNK>", eos_token="<S>", bos_token="<S>")

    def build(writers, progress, given):
        # In a log, lines over the shards: none for each shard (99, each read twice).
        each = False if log_lines(progress, len(train) > 1) else progress

        def shards(paths, desc):
            return progress_bar(progress, len(paths) > 1, paths, desc=desc, leave=False)

        if given is not None:
            tokenizer = given
        elif vocab_file is not None:
            tokenizer = WordTokenizer.from_vocab_file(vocab_file, **tokens)
        else:
            counts = count_tokens(chunk for path in shards(train, "lm1b: counting") for chunk in
                                  _count_file(path, each, f"lm1b: counting {path.name}"))
            tokenizer = WordTokenizer.from_counts(counts, min_count=opts["min_count"],
                                                  max_size=opts["max_size"], **tokens)
        for split, paths in (("train", train), ("valid", [held["valid"]]),
                             ("test", [held["test"]])):
            for path in shards(paths, f"lm1b: {split}"):
                for ids in _encode_file(tokenizer, path, each):
                    writers[split].append(ids)
        return tokenizer
    sources = train + [held["valid"], held["test"]] + ([vocab_file] if vocab_file else [])
    options = {k: v for k, v in opts.items() if k != "vocab_file"}
    return _Plan(sources, options, build,
                 describe={"train": f"{len(train)} shards in {train_dir}",
                           **{s: str(p) for s, p in held.items()}})


def _text(name: str, data_dir, opts: dict) -> _Plan:
    layout = "data_dir = a text file, or a folder whose non-hidden files are read in sorted order"
    data_dir = _require_dir(data_dir, layout)
    files = [data_dir] if data_dir.is_file() else _list_files(data_dir)
    if not files:
        raise EmptyCorpusError(f"no files in {data_dir} ({layout})")
    percents = (90, 10, 0)

    def build(writers, progress, given):
        source = _Concat(files, lines=_splits_at_lines(given))
        return _write_bytes(source, writers, percents, given, data_dir, progress)
    return _Plan(files, {"percents": percents}, build, required=("train", "valid"),
                 describe={"all": str(data_dir)}, byte_split=True,
                 listed=None if data_dir.is_file() else data_dir)


def stdlib_dir() -> Path:
    """Folder of this Python's standard library.

    Returns:
        ``sysconfig``'s 'stdlib' path, a `Path`.
    """
    return Path(sysconfig.get_paths()["stdlib"])


def _pystdlib(name: str, data_dir, opts: dict) -> _Plan:
    max_bytes = opts["max_bytes"]
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise TxlError(f"max_bytes must be a positive int, got {max_bytes!r}")
    root = Path(data_dir) if data_dir is not None else stdlib_dir()
    layout = f"*.py files under {root} (site-packages excluded)"
    if not root.is_dir():
        raise CorpusNotFoundError(root, layout, "Python source folder")
    files, total = [], 0
    for path in _list_files(root, ".py", ("site-packages", "dist-packages", "__pycache__")):
        if total >= max_bytes:
            break
        files.append(path)
        total += path.stat().st_size
    if not files:
        raise EmptyCorpusError(f"no .py files found ({layout})")
    percents = (90, 5, 5)

    def build(writers, progress, given):
        source = _Concat(files, max_bytes, _splits_at_lines(given))
        return _write_bytes(source, writers, percents, given, root,
                            progress)
    return _Plan(files, {"max_bytes": max_bytes, "percents": percents,
                         "root": str(root.resolve())}, build,
                 describe={"all": f"{len(files)} files under {root}"}, byte_split=True)


_WORD_OPTIONS = {"min_count": 1, "max_size": None}
_READERS: dict[str, tuple[Callable[..., _Plan], dict]] = {
    "enwik8": (_bytes_file, {}),
    "text8": (_bytes_file, {}),
    "wt2": (_word_files, _WORD_OPTIONS),
    "wt103": (_word_files, _WORD_OPTIONS),
    "ptb": (_word_files, _WORD_OPTIONS),
    "lm1b": (_lm1b, {**_WORD_OPTIONS, "vocab_file": None, "valid_shard": 1,
                     "test_shard": 0, "max_train_shards": None}),
    "text": (_text, {}),
    "pystdlib": (_pystdlib, {"max_bytes": 8_000_000}),
}
KNOWN_CORPORA = tuple(_READERS)
_WORD_CORPORA = ("wt2", "wt103", "ptb", "lm1b")


# -- entry point -------------------------------------------------------------

def load_corpus(name: str, data_dir: str | os.PathLike | None = None, *,
                cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                mmap: bool = True, progress: bool | None = None,
                tokenizer: Tokenizer | None = None, **options) -> Corpus:
    """Read, tokenize (once) and return a corpus.

    Args:
      name: one of :data:`KNOWN_CORPORA`.
      data_dir: the dataset's folder (see each layout in the module doc); for
        ``text`` a file or folder; for ``pystdlib`` optional (another folder of
        ``.py`` files instead of the standard library).
      cache_dir: where encoded corpora are kept; default
        ``$TXL_TF_CACHE``, else ``$XDG_CACHE_HOME/txl_tf`` or ``~/.cache/txl_tf``
        (never next to the data).
      use_cache: False to neither read nor write the cache.
      mmap: open cached arrays with ``np.load(mmap_mode='r')``.
      progress: tqdm bars: True / False, or None for files over 32 MiB when
        stderr is a terminal (in a log: a line at every 10% of such a file,
        or of lm1b's shards).
      tokenizer: read every split with this tokenizer (a trained model's own)
        instead of building one from the training split; words outside its
        vocabulary become its unknown token (see :func:`unknown_count`).
        A word or SentencePiece tokenizer moves the split points of enwik8,
        text and pystdlib to line starts (module doc).
        Building a vocabulary from a corpus is for training a new model only.
      **options: per dataset: word corpora ``min_count``, ``max_size``; lm1b
        also ``vocab_file``, ``valid_shard``, ``test_shard``,
        ``max_train_shards``; pystdlib ``max_bytes`` (default 8,000,000).

    Returns:
      The `Corpus`.

    Raises:
      CorpusNotFoundError (a FileNotFoundError) naming the missing path and the
      expected layout; EmptyCorpusError (a ValueError); ValueError for an
      unknown name (listing the known ones) or unknown options.
    """
    if name not in _READERS:
        raise TxlError(f"unknown corpus {name!r}; known: {', '.join(KNOWN_CORPORA)}")
    reader, defaults = _READERS[name]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) or "none"
        raise TxlError(f"unknown option(s) {unknown} for corpus {name!r}; valid: {valid}")
    opts = {**defaults, **options}
    plan = reader(name, data_dir, opts)
    given = tokenizer is not None

    info = {"format": cache_lib.CACHE_FORMAT, "dataset": name, "options": plan.options,
            "sources": cache_lib.file_stats(plan.sources)}
    if name in _WORD_CORPORA or (tokenizer is not None and tokenizer.kind == "word"):
        # entries before read a lone \r as a space and a leading BOM as text
        info["line_ends"] = "\\n, \\r\\n or \\r; a leading BOM dropped"
    if tokenizer is not None:
        info["tokenizer"] = tokenizer.fingerprint()
        if plan.byte_split and _splits_at_lines(tokenizer):  # entries before: cut lines, raw files
            info["split_points"] = "line starts; each file whole lines"
        if plan.space_cuts and _splits_at_lines(tokenizer):  # entries before cut words
            info["split_points"] = "line starts or spaces"
    root = None
    if use_cache:
        explicit = cache_dir is not None
        root = Path(cache_dir) if explicit else cache_lib.default_cache_root()
        if plan.listed is not None:
            _check_cache_outside(root, plan.listed)
        root = cache_lib.usable_root(root, explicit)
    if root is None:
        writers = {s: cache_lib.MemoryWriter() for s in SPLITS}
        tokenizer = plan.build(writers, progress, tokenizer)
        _check_not_empty(name, plan, writers)
        return Corpus(name, *(writers[s].array for s in SPLITS), tokenizer)

    entry = cache_lib.entry_dir(root, name, cache_lib.cache_key(info))
    found = cache_lib.read_entry(entry, mmap)
    if found is None:
        tmp = cache_lib.new_build_dir(root, name)
        try:
            writers = {s: cache_lib.NpyWriter(tmp / f"{s}.npy") for s in SPLITS}
            try:
                tokenizer = plan.build(writers, progress, tokenizer)
            finally:
                for writer in writers.values():
                    writer.close()
            _check_not_empty(name, plan, writers)
            tokenizer.save(tmp / "tokenizer")
            meta = {**info, "lengths": {s: writers[s].length for s in SPLITS},
                    "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size}
            cache_lib.commit_entry(tmp, entry, meta)
        except OSError as err:  # a full disk names no file: the cache folder is named
            raise naming(err, root) from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = cache_lib.read_entry(entry, mmap)
        from_cache = False
    else:
        from_cache = True
    arrays, _ = found
    return Corpus(name, *(arrays[s] for s in SPLITS),
                  tokenizer if given else load_tokenizer(entry / "tokenizer"),
                  cache_path=entry, from_cache=from_cache)


def corpus_sources(name: str, data_dir: str | os.PathLike | None = None,
                   **options) -> list[Path]:
    """The files :func:`load_corpus` would read for the corpus `name` (its
    splits' files, lm1b's shards and vocabulary), without reading them.

    Args:
      name: one of :data:`KNOWN_CORPORA`.
      data_dir: as :func:`load_corpus` takes it.
      **options: as :func:`load_corpus` takes them.

    Returns:
      The paths; none where the corpus is not found or not known (its load
      names the problem).
    """
    if name not in _READERS:
        return []
    reader, defaults = _READERS[name]
    try:
        return list(reader(name, data_dir, {**defaults, **options}).sources)
    except (OSError, ValueError, TxlError):
        return []


def read_as_text(path, folder) -> bool:
    """Whether a `text` corpus `folder`, whose every non-hidden file is read
    (`_list_files`), would read files at `path` (in it, not in a hidden
    folder there), both through their links."""
    try:
        inside = Path(path).resolve().relative_to(Path(folder).resolve())
    except ValueError:
        return False
    return not any(part.startswith(".") for part in inside.parts)


def _check_cache_outside(root: Path, folder: Path) -> None:
    """Raises unless the cache `root` lies outside `folder` (`read_as_text`):
    its entries would be read as text of the corpus by the next load."""
    if read_as_text(root, folder):
        raise TxlError(f"the cache folder {root} is inside the corpus folder {folder}, whose "
                       "files are all read as text: the next load would read the cache's "
                       "files as corpus text; use a cache folder outside it (or a hidden one "
                       f"there, such as {folder / '.cache'})")


def unknown_count(ids: np.ndarray, tokenizer: Tokenizer) -> int:
    """How many ids are the tokenizer's unknown token: out-of-vocabulary
    words, plus any literal unknown token in the text.

    Args:
        ids: integer ids.
        tokenizer: the `Tokenizer` that encoded them.

    Returns:
        The count (0 when the tokenizer has no unknown token).
    """
    unk = getattr(tokenizer, "unk_id", -1)
    return int(np.count_nonzero(np.asarray(ids) == unk)) if unk >= 0 else 0


def _check_not_empty(name: str, plan: _Plan, writers: dict) -> None:
    for split in plan.required:
        if writers[split].length == 0:
            source = plan.describe.get(split, plan.describe.get("all", "?"))
            raise EmptyCorpusError(f"corpus {name!r}: the {split} split is empty "
                                   f"(source: {source})")
