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
never the real classes. Those callables take only plain arguments and copy at
most as many items as the pickle has bytes; dict keys and set items are strings,
numbers (ints under 2**61) or short tuples of strings (hashes that are cheap and
that a file cannot make collide). Files written by `torch.save` (a zip holding
`data.pkl`, or the legacy sequence of pickles) are read the same way, without
PyTorch; a pickle over 64 MiB is refused before it is read.

    python -m txl_tf.text.pickled_vocab vocab.pkl vocab.txt
"""
import io
import os
import pickle
import struct
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


# A pickle (a file, or a zip's data.pkl) is read whole, up to this size: its
# objects may take some 70 times its bytes (an empty dict per byte `}`); a
# vocab.pkl of 267,735 symbols is 5 MB.
_MAX_BYTES = 64 << 20
# The encodings a pickle's str(bytes, encoding) may name (any other name is
# looked up, and its codec module imported, by the codec registry).
_ENCODINGS = {"utf-8", "utf8", "latin-1", "latin1", "iso-8859-1", "ascii"}
# What a dict key or set item may be: cheap to hash, and no two values with
# one hash but a few (a file of keys that collide costs every key probed for
# every other: quadratic). An int hashes as itself below the modulus; str and
# bytes hashes are seeded per process, so a tuple key holds only those (an int
# or float item lets a file choose colliding tuples), up to _KEY_ITEMS of them
# (an int's or tuple's hash is not kept: it is computed each time reached).
_ATOMS = (str, bytes, int, float, bool, type(None))
_SEEDED = (str, bytes, bool, type(None))
_KEY_ITEMS = 64


def _flat(value):
    kind = type(value)
    if kind is int:
        return abs(value) < sys.hash_info.modulus
    return kind in _ATOMS or (kind is tuple and len(value) <= _KEY_ITEMS
                              and all(type(v) in _SEEDED for v in value))


def _plain_calls(budget):
    """The allowed callables for one load. Each takes only plain arguments, and
    all together copy at most `budget` items: a pickle naming one big list can
    copy it again and again for a few bytes each."""
    left = [budget]

    def charge(n):
        left[0] -= n
        if left[0] < 0:
            raise PickledVocabError("its calls copy more items than the pickle has bytes")

    def one_of(name, args, types):
        if len(args) > 1 or (args and type(args[0]) not in types):
            raise PickledVocabError(f"refusing {name}() of " + ", ".join(
                type(a).__name__ for a in args))
        charge(len(args[0]) if args else 0)

    def plain_dict(*args):  # dict(mapping), as Counter pickles; Python 2's OrderedDict: pairs
        one_of("dict", args, (dict, list, tuple))
        if args and type(args[0]) is not dict and not all(
                type(p) in (list, tuple) and len(p) == 2 and _flat(p[0]) for p in args[0]):
            raise PickledVocabError("refusing dict() of other than pairs with plain keys")
        return dict(*args)

    def plain_list(*args):
        one_of("list", args, (list, tuple, dict, str))
        return list(*args)

    def plain_tuple(*args):
        one_of("tuple", args, (list, tuple, dict, str))
        return tuple(*args)

    def plain_str(*args):  # str(atom), or str(bytes, encoding[, errors]) of a text encoding
        if not (len(args) <= 1 and all(type(a) in _ATOMS for a in args)
                or 2 <= len(args) <= 3 and type(args[0]) is bytes
                and all(type(a) is str for a in args[1:])
                and args[1].lower().replace("_", "-") in _ENCODINGS):
            raise PickledVocabError("refusing str() of " + ", ".join(
                type(a).__name__ for a in args))
        text = str(*args)
        charge(len(text))
        return text

    def plain_int(*args):  # int(atom), or int(text, base)
        if len(args) > 2 or not all(type(a) in _ATOMS for a in args):
            raise PickledVocabError("refusing int() of " + ", ".join(
                type(a).__name__ for a in args))
        return int(*args)

    return {dict: plain_dict, list: plain_list, tuple: plain_tuple, str: plain_str,
            int: plain_int}


def _keys(items):
    for item in items:
        if not _flat(item):
            raise PickledVocabError(f"refusing a dict key or set item of type "
                                    f"{type(item).__name__} (only strings, numbers, ints under "
                                    f"2**61 and tuples of up to {_KEY_ITEMS} strings)")


class _PlainUnpickler(pickle._Unpickler):
    """CPython's pure-Python unpickler (its memo is a dict: the C one sizes a
    list by the largest memo index it is given), with the allowed callables
    only, and dict keys and set items refused unless they are flat."""
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self._calls = _plain_calls(len(data))

    def find_class(self, module, name):
        if (module, name) in _SKIPPED:
            return _Skipped
        try:
            return self._calls[_ALLOWED[(module, name)]]
        except KeyError:
            raise PickledVocabError(
                f"refusing to unpickle {module}.{name}: a vocabulary pickle may hold only "
                "dict, list, tuple, str, int and collections.Counter/OrderedDict") from None

    def persistent_load(self, pid):
        raise PickledVocabError("refusing a persistent id (a tensor storage): not a vocabulary")

    def load_setitem(self):
        _keys(self.stack[-2:-1])
        pickle._Unpickler.load_setitem(self)

    def load_setitems(self):  # the stack holds what follows the mark
        _keys(self.stack[0::2])
        pickle._Unpickler.load_setitems(self)

    def load_dict(self):
        _keys(self.stack[0::2])
        pickle._Unpickler.load_dict(self)

    def load_additems(self):
        _keys(self.stack)
        pickle._Unpickler.load_additems(self)

    def load_frozenset(self):
        _keys(self.stack)
        pickle._Unpickler.load_frozenset(self)

    def load_build(self):  # state for a placeholder only (dropped); the callables take none
        if not (isinstance(self.stack[-2], _Skipped) or self.stack[-2] is _Skipped):
            raise pickle.UnpicklingError(f"state given to a {type(self.stack[-2]).__name__}")
        pickle._Unpickler.load_build(self)

    def load_bytearray8(self):  # it allocated the length given before reading
        size, = struct.unpack("<Q", self.read(8))
        data = self.read(size)  # at most what is there
        if len(data) != size:
            raise pickle.UnpicklingError(f"BYTEARRAY8 of {size} bytes past the end")
        self.append(bytearray(data))

    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.DICT[0]] = load_dict
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.FROZENSET[0]] = load_frozenset


def _read(file):
    data = file.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        raise PickledVocabError(f"more than {_MAX_BYTES} bytes: not a vocabulary")
    return data


def load_plain_pickle(path):
    """The object in a pickle (or a `torch.save` file) of plain containers."""
    path = os.fspath(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                member = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if len(member) != 1:
                    raise PickledVocabError("a zip without one data.pkl")
                size = archive.getinfo(member[0]).file_size
                if size > _MAX_BYTES:  # checked before inflating: a zip bomb
                    raise PickledVocabError(f"{member[0]} inflates to {size} bytes; a "
                                            f"vocabulary pickle is at most {_MAX_BYTES}")
                with archive.open(member[0]) as f:
                    return _PlainUnpickler(_read(f)).load()
        with open(path, "rb") as f:
            stream = _PlainUnpickler(_read(f))
        first = stream.load()
        if first == _TORCH_MAGIC:  # legacy torch.save: magic, version, info, object
            stream.load()
            stream.load()
            return stream.load()
        return first
    except PickledVocabError as err:
        raise PickledVocabError(f"{path}: {err}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, LookupError, struct.error, OverflowError,
            zipfile.BadZipFile, zlib.error) as err:
        raise PickledVocabError(f"{path}: not a readable pickle of plain containers ({err})") \
            from None


def symbols_of(obj, path="vocabulary"):
    """The symbols in id order: a list of str, an `idx2sym` list, or a
    `sym2idx` mapping with ids 0..n-1."""
    if isinstance(obj, dict) and "idx2sym" in obj:
        if isinstance(obj.get("sym2idx"), dict):  # the port encodes with it: both must agree
            by_id = symbols_of({"sym2idx": obj["sym2idx"]}, path)
            listed = symbols_of(obj["idx2sym"], path)
            for i, symbol in enumerate(listed):
                if i >= len(by_id) or by_id[i] != symbol:
                    raise PickledVocabError(
                        f"{path}: idx2sym and sym2idx disagree: idx2sym[{i}] is {symbol!r}, "
                        f"sym2idx[{symbol!r}] is {obj['sym2idx'].get(symbol)}")
            if len(by_id) != len(listed):
                raise PickledVocabError(f"{path}: idx2sym and sym2idx disagree: "
                                        f"{len(listed)} and {len(by_id)} symbols")
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
        if not symbol.isascii():  # a pickled str may hold a lone surrogate
            try:
                symbol.encode("utf-8")
            except UnicodeEncodeError:
                raise PickledVocabError(f"{path}: symbol {i} ({symbol!r}) is not UTF-8 "
                                        "text (a lone surrogate)") from None
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
