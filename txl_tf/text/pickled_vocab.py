"""Pickled vocabularies → plain text, through a restricted unpickler.

The transfo-xl-wt103 port ships `vocab.pkl` (its tokenizer's attributes:
`idx2sym`, `sym2idx`, a `Counter`, ...) and the paper's scripts cache
vocabularies with pickle. None of txl_tf's loaders unpickle anything; this
converter is the one place that reads such a file, and its unpickler builds
only plain containers (dict, list, tuple, str, int, float, bool, None,
`collections.Counter` / `OrderedDict`). Any other class or function named in
the pickle, which is how a pickle runs code, is refused before it is looked
up, but for the few that a tokenizer saved by transformers 4.x holds (its
regexes and Moses tokenizers: `_SKIPPED`), which become inert placeholders,
never the real classes. Files written by `torch.save` (a zip holding `data.pkl`, or the legacy
sequence of pickles) are read the same way, without PyTorch.

    python -m txl_tf.text.pickled_vocab vocab.pkl vocab.txt
"""
import io
import os
import pickle
import sys
import zipfile
import zlib

from txl_tf.errors import TxlError
from txl_tf.text.vocab import write_vocab

# Counter and OrderedDict are read as plain dicts: handing out the real
# (mutable) classes would let a pickle's BUILD opcode set attributes on them
# for the whole process. Built-in types refuse that (TypeError).
_ALLOWED = {
    ("collections", "Counter"): dict,
    ("collections", "OrderedDict"): dict,
    ("builtins", "dict"): dict, ("builtins", "list"): list, ("builtins", "tuple"): tuple,
    ("builtins", "str"): str, ("builtins", "int"): int,
    ("__builtin__", "dict"): dict, ("__builtin__", "list"): list,  # Python 2 pickles
}
# What transformers 4.x's TransfoXLTokenizer pickles beside idx2sym (its whole
# `__dict__`): compiled regexes, its Moses tokenizers, a Trie, AddedTokens.
# They are skipped: `_Skipped` stands in for each, never the real one.
_SKIPPED = {("re", "_compile"), ("sacremoses.tokenize", "MosesTokenizer"),
            ("sacremoses.tokenize", "MosesDetokenizer"),
            ("sacremoses.normalize", "MosesPunctNormalizer"),
            ("transformers.tokenization_utils", "Trie"), ("tokenizers", "AddedToken")}
# torch.save's legacy format starts with this number, its own pickle.
_TORCH_MAGIC = 0x1950a86a20f9469cfc6c


class PickledVocabError(TxlError):
    """A pickled vocabulary holds something other than plain containers, or no symbol list."""


class _Skipped:
    """A skipped tokenizer object: its arguments and state are dropped."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(*state):  # also on the class itself: nothing is set
        pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SKIPPED:
            return _Skipped
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise PickledVocabError(
                f"refusing to unpickle {module}.{name}: a vocabulary pickle may hold only "
                "dict, list, tuple, str, int and collections.Counter/OrderedDict") from None

    def persistent_load(self, pid):
        raise PickledVocabError("refusing a persistent id (a tensor storage): not a vocabulary")


def _loads(data):
    return _PlainUnpickler(io.BytesIO(data), encoding="utf-8").load()


def load_plain_pickle(path):
    """The object in a pickle (or a `torch.save` file) of plain containers."""
    path = os.fspath(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                member = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if len(member) != 1:
                    raise PickledVocabError(f"{path}: a zip without one data.pkl")
                return _loads(archive.read(member[0]))
        with open(path, "rb") as f:
            stream = _PlainUnpickler(f, encoding="utf-8")
            first = stream.load()
            if first == _TORCH_MAGIC:  # legacy torch.save: magic, version, info, object
                stream.load()
                stream.load()
                return stream.load()
            return first
    except PickledVocabError as err:
        raise PickledVocabError(f"{path}: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, zlib.error) as err:
        raise PickledVocabError(f"{path}: not a readable pickle of plain containers ({err})") \
            from None


def symbols_of(obj, path="vocabulary"):
    """The symbols in id order: a list of str, an `idx2sym` list, or a
    `sym2idx` mapping with ids 0..n-1."""
    if isinstance(obj, dict) and "idx2sym" in obj:
        obj = obj["idx2sym"]
    elif isinstance(obj, dict) and "sym2idx" in obj:
        obj = obj["sym2idx"]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in obj.items()):
            raise PickledVocabError(f"{path}: a dict that is not symbol → id (keys: "
                                    f"{sorted(map(str, obj))[:8]})")
        ordered = sorted(obj.items(), key=lambda kv: kv[1])
        if [v for _, v in ordered] != list(range(len(ordered))):
            raise PickledVocabError(f"{path}: symbol ids are not 0..{len(ordered) - 1}")
        obj = [k for k, _ in ordered]
    if not isinstance(obj, (list, tuple)) or not obj or \
            not all(isinstance(s, str) for s in obj):
        raise PickledVocabError(f"{path}: no symbol list (idx2sym, sym2idx or a list of str)")
    first = {}
    for i, symbol in enumerate(obj):
        if symbol in first:  # two ids for one symbol: a vocabulary file cannot hold that
            raise PickledVocabError(f"{path}: symbol {symbol!r} appears twice (ids "
                                    f"{first[symbol]} and {i})")
        first[symbol] = i
    return list(obj)


def convert_pickled_vocab(pickle_path, text_path):
    """Writes the symbols of `pickle_path` to `text_path`, one per line; returns them."""
    symbols = symbols_of(load_plain_pickle(pickle_path), os.fspath(pickle_path))
    write_vocab(text_path, symbols)
    return symbols


USAGE = "usage: python -m txl_tf.text.pickled_vocab VOCAB.pkl VOCAB.txt"


def main(argv):
    if argv[1:] in (["--help"], ["-h"]):
        print(f"{USAGE}\n\nWrites the symbols of a pickled vocabulary (vocab.pkl) as plain "
              "text, one a line, in id order.")
        return 0
    if len(argv) != 3:
        print(f"error: {USAGE}", file=sys.stderr)
        return 2
    try:
        symbols = convert_pickled_vocab(argv[1], argv[2])
    except (PickledVocabError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(symbols)} symbols to {argv[2]}")
    return 0


if __name__ == "__main__":
    from txl_tf.app.exits import reader_gone
    try:
        status = main(sys.argv)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head -n 1`: status 141, no message, as the jobs
        reader_gone()
    sys.exit(status)
