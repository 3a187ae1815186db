"""On-disk cache of encoded corpora: ``.npy`` id arrays (mmap-able) plus the
tokenizer as plain text, keyed by dataset, options and source file stats.

Layout: ``<cache_root>/<name>-<key>/{train,valid,test}.npy``, ``tokenizer/``
and ``meta.json`` (written last; an entry without it is ignored). Entries are
built in a temporary directory and renamed into place, so concurrent jobs
never see half-written data; the temporary directory of a job killed before
the rename (its owner, a process of this host, is gone) is deleted by the next
build in that cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import tempfile
import tokenize
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np

from txl_tf.app.files import parse_json, process_alive
from txl_tf.errors import TxlError

CACHE_FORMAT = 1
SPLITS = ("train", "valid", "test")
_HEADER_BYTES = 128  # fixed .npy v1.0 header size so arrays can be streamed
OWNER_FILE = "owner.json"  # in a build folder: {"pid", "host"} of the job writing it


def file_stats(paths: Iterable[Path]) -> list[list]:
    """``[absolute path, size, mtime_ns]`` for each source file (the cache key)."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append([str(Path(path).resolve()), st.st_size, st.st_mtime_ns])
    return out


def cache_key(info: dict) -> str:
    blob = json.dumps(info, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:20]


def default_cache_root() -> Path:
    """The user's cache folder: ``$TXL_TF_CACHE``, else ``$XDG_CACHE_HOME/txl_tf``,
    else ``~/.cache/txl_tf``. Never a folder next to the data: a corpus may sit
    in a read-only or shared place that is not the user's to write."""
    env = os.environ.get("TXL_TF_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "txl_tf"


class NpyWriter:
    """Append int32 chunks to a 1-D ``.npy`` file without knowing its length."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.length = 0
        self._file = open(self.path, "wb")
        self._file.write(b"\0" * _HEADER_BYTES)

    def append(self, ids: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype="<i4")
        self._file.write(ids.tobytes())
        self.length += ids.size

    def close(self) -> None:
        body = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % self.length
        header_len = _HEADER_BYTES - 10
        header = body.ljust(header_len - 1).encode("latin1") + b"\n"
        self._file.seek(0)
        self._file.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", header_len) + header)
        self._file.close()


class MemoryWriter:
    """Same interface as :class:`NpyWriter`, collecting in memory (no cache):
    the ids grow one buffer in place, which :attr:`array` reads without a
    copy (not chunks joined at the end: two copies of the ids at once).
    Reading :attr:`array` closes the writer, as :meth:`close` does."""

    def __init__(self):
        self._buffer = bytearray()
        self._closed = False
        self.length = 0

    def append(self, ids: np.ndarray) -> None:
        if self._closed:  # the buffer, read by `array`, cannot grow
            raise TxlError("MemoryWriter.append after the writer was closed (its `array` read, "
                           "or `close()` called): append every chunk first, then read `array`")
        ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        self._buffer += ids.data
        self.length += ids.size

    def close(self) -> None:
        self._closed = True

    @property
    def array(self) -> np.ndarray:
        """The ids appended, int32, read-only (as the cache's memory-mapped
        arrays are); reading it closes the writer."""
        self._closed = True
        ids = np.frombuffer(self._buffer, dtype=np.int32)
        ids.flags.writeable = False
        return ids


def entry_dir(root: Path, name: str, key: str) -> Path:
    return root / f"{name}-{key}"


def read_entry(entry: Path, mmap: bool):
    """Return ``(arrays by split, meta)`` for a complete entry, else None.

    Raises:
        TxlError: the entry is damaged (a meta.json without the lengths and
            vocabulary size it records, or a split that is not those int32
            ids of the vocabulary: checked from the .npy header before the
            ids are read, then the ids' range).
    """
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = parse_json(meta_path.read_text(encoding="utf-8"))
        arrays = {s: _read_ids(entry / f"{s}.npy", int(meta["lengths"][s]),
                               int(meta["vocab_size"]), mmap) for s in SPLITS}
    # TokenError: numpy's parser of a .npy header whose brackets do not close
    except (ValueError, KeyError, TypeError, tokenize.TokenError) as err:
        raise TxlError(f"corpus cache entry {entry} is damaged ({err}): delete it, and the "
                       "next job rebuilds it") from None
    return arrays, meta


def _read_ids(path: Path, length: int, vocab_size: int, mmap: bool) -> np.ndarray:
    """The ``length`` int32 ids in [0, vocab_size) of the .npy at ``path``
    (a ValueError naming the split otherwise)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version != (1, 0):
            raise ValueError(f"{path.name}: .npy format version {version}")
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        data_bytes = os.fstat(f.fileno()).st_size - f.tell()
    if dtype != np.dtype("<i4") or shape != (length,) or data_bytes != 4 * length:
        raise ValueError(f"{path.name} holds {dtype} {shape} in {data_bytes} bytes, where "
                         f"meta.json records {length} int32 ids")
    ids = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    if length and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{path.name} holds ids outside [0, {vocab_size})")
    return ids


def new_build_dir(root: Path, name: str) -> Path:
    """A fresh build folder in ``root`` (``.tmp-<name>-*``) holding its owner
    (this process and host), after deleting those of killed builds."""
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    (tmp / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(),
                                              "host": socket.gethostname()}), encoding="utf-8")
    return tmp


def remove_stale_builds(root: Path) -> list[str]:
    """Deletes the build folders in ``root`` whose owner is a process of this
    host that is gone (a job killed while encoding); returns their names. A
    folder of another host, or without its owner (being made), is kept."""
    removed = []
    for build in sorted(root.glob(".tmp-*")):
        try:
            owner = parse_json((build / OWNER_FILE).read_text(encoding="utf-8"))
            pid, host = int(owner["pid"]), owner["host"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == socket.gethostname() and not process_alive(pid):
            shutil.rmtree(build, ignore_errors=True)
            removed.append(build.name)
    return removed


def commit_entry(tmp: Path, entry: Path, meta: dict) -> Path:
    """Write ``meta.json`` and move ``tmp`` to ``entry`` (first writer wins),
    then drop its owner file: until the rename the build folder keeps its
    owner, so a kill in between leaves one the next build deletes."""
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n",
                                   encoding="utf-8")
    if entry.exists() and not (entry / "meta.json").is_file():
        shutil.rmtree(entry, ignore_errors=True)  # leftover of a broken entry
    try:
        os.replace(tmp, entry)
    except OSError:
        if not (entry / "meta.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another job finished first
        return entry
    (entry / OWNER_FILE).unlink(missing_ok=True)
    return entry


def usable_root(root: Path, explicit: bool) -> Path | None:
    """``root`` if it can be created and written; None (with a warning) if not
    and the root was only a default; an error if it was asked for."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if os.access(root, os.W_OK):
            return root
        raise PermissionError(f"cache directory is not writable: {root}")
    except OSError as err:
        if explicit:
            raise
        warnings.warn(f"corpus cache disabled: {err}")
        return None
