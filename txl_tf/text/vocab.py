"""Plain-text vocabularies: deterministic building, reading and writing.

A vocabulary is a list of tokens; a token's id is its index. Files hold one
token per line, UTF-8, lines separated by ``\\n`` only. Token kinds that may
contain whitespace or control characters (characters, for the char-level
tokenizer) are written with :func:`escape_token` so every token fits on one
line; word vocabularies are written raw (words never contain whitespace).
"""
from __future__ import annotations

import collections
import os
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from txl_tf.app.files import reading
from txl_tf.errors import TxlError

# Python's own notion of whitespace (str.split() with no argument); the
# tf-graph tokenizers split on exactly this set so both paths agree.
WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


def whitespace_regex(exclude: str = "") -> str:
    """An RE2 pattern matching runs of Python whitespace, minus ``exclude``."""
    chars = "".join("\\x{%x}" % ord(c) for c in WHITESPACE if c not in exclude)
    return "[" + chars + "]+"


def utf16_hint(head: bytes, form: str = "%s") -> str:
    """`form % why` for a file whose first bytes `head` are a UTF-16 byte-order
    mark (Windows' "Unicode" text), else ""."""
    if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return form % "UTF-16, by its byte-order mark: save it as UTF-8"
    return ""


def build_vocab(counts: Mapping[str, int], specials: Sequence[str] = (),
                min_count: int = 1, max_size: int | None = None) -> list[str]:
    """A vocabulary: ``specials``, then counted tokens, most frequent first.

    Ties are broken by the token itself (code-point order), so the result
    depends only on ``counts``, never on insertion order. Specials keep
    their given order and are not repeated.

    Args:
        counts: ``{token: count}``.
        specials: tokens that come first (none twice).
        min_count: tokens seen fewer times are dropped (an int >= 1).
        max_size: None, or the most non-special tokens (an int >= 0).

    Returns:
        The list of tokens (id = index).

    Raises:
        TxlError: a bad ``min_count`` or ``max_size``, or a special twice.
    """
    def integer(value):  # an int or numpy integer, not a bool or a float
        return not isinstance(value, bool) and hasattr(type(value), "__index__")
    if not integer(min_count) or min_count < 1:
        raise TxlError(f"min_count must be an integer >= 1, got {min_count!r}")
    if max_size is not None and (not integer(max_size) or max_size < 0):
        raise TxlError(f"max_size must be an integer >= 0 or None, got {max_size!r}")
    vocab = list(dict.fromkeys(specials))
    if len(vocab) != len(specials):
        raise TxlError(f"duplicate special tokens in {list(specials)}")
    taken = set(vocab)
    ranked = sorted((item for item in counts.items()
                     if item[1] >= min_count and item[0] not in taken),
                    key=lambda item: (-item[1], item[0]))
    if max_size is not None:
        ranked = ranked[:max_size]
    vocab.extend(token for token, _ in ranked)
    return vocab


def count_tokens(texts: Iterable[str]) -> collections.Counter:
    """Count whitespace-separated tokens over an iterable of text chunks."""
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(text.split())
    return counts


_ESCAPE = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def escape_token(token: str) -> str:
    """Make a token safe for a one-line-per-token file (reversible)."""
    out = []
    for ch in token:
        if ch == "\\":
            out.append("\\\\")
        elif (ch.isprintable() and not ch.isspace()) or ch == " ":
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append("\\U%08x" % ord(ch))
    return "".join(out)


def unescape_token(line: str) -> str:
    """Inverse of :func:`escape_token`."""
    def repl(match: re.Match) -> str:
        body = match.group(1)
        return "\\" if body == "\\" else chr(int(body[1:], 16))
    return _ESCAPE.sub(repl, line)


def write_vocab(path: str | os.PathLike, tokens: Sequence[str],
                escape: bool = False) -> Path:
    """Write one token per line.

    Args:
        path: the file.
        tokens: the tokens in id order.
        escape: escape each token (``escape_token``); without it a token
            that is empty or holds whitespace is an error.

    Returns:
        The path, a `Path`.
    """
    path = Path(path)
    lines = []
    for i, token in enumerate(tokens):
        text = escape_token(token) if escape else token
        if not escape and (not token or any(c in WHITESPACE for c in token)):
            raise TxlError(f"token {i} ({token!r}) is empty or contains "
                           "whitespace; it cannot be a word vocabulary entry")
        lines.append(text)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("".join(line + "\n" for line in lines))
    return path


def read_vocab(path: str | os.PathLike, escape: bool = False) -> list[str]:
    """Read a vocabulary file written by :func:`write_vocab`.

    Args:
        path: the file.
        escape: the file was written with ``escape=True``. Unescaped (word)
            files may carry extra whitespace-separated columns, e.g.
            ``word count``; only the first column is the token.

    A byte-order mark starting the file and ``\\r\\n`` line ends (a file saved
    on Windows) are not part of any token (escaped files hold no raw ``\\r``).

    Returns:
        The tokens in id order.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file not found: {path}")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        with open(path, "rb") as f:
            hint = utf16_hint(f.read(2), "; %s")
        raise TxlError(f"vocabulary file {path} is not UTF-8 text (byte {err.start}{hint}): "
                       "one token per line expected") from None
    except OSError as err:  # a read() error (EIO) names no file
        raise reading(err, path) from err
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if escape:
        tokens = [unescape_token(line.removesuffix("\r")) for line in lines]
    else:
        tokens = []
        for n, line in enumerate(lines, 1):
            fields = line.split()
            if not fields:
                raise TxlError(f"{path}:{n}: blank line in vocabulary file")
            tokens.append(fields[0])
    if not tokens:
        raise TxlError(f"vocabulary file is empty: {path}")
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise TxlError(f"{path}: token {token!r} appears twice "
                           f"(lines {seen[token] + 1} and {i + 1})")
        seen[token] = i
    return tokens
