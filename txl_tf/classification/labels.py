"""Class labels <-> ids, saved as ``labels.json`` so training and evaluation agree.

A :class:`LabelSet` is an ordered list of label names; a label's id is its
index. Built from training data it is sorted: numerically when every label is
a base-10 integer (so labels ``0..C-1`` keep their values as ids and ``1..C``
become ``0..C-1``), else by code point. The JSON file holds the names in id
order; nothing is pickled.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

from txl_tf.app.files import parse_json
from txl_tf.errors import TxlError

LABELS_FILE = "labels.json"
FORMAT_VERSION = 1
_INTEGER = re.compile(r"[+-]?[0-9]+")


class UnknownLabelError(KeyError, TxlError):
    """A label that is not in the :class:`LabelSet` (e.g. seen only at
    evaluation). ``path`` and ``line`` name where it was read, when known."""

    path = None
    line = None

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def _is_integer(name: str) -> bool:
    return _INTEGER.fullmatch(name) is not None


class LabelSet:
    """Ordered class names; ``id(name)`` and ``name(id)`` map between them.

    When every name is an integer (``integer`` is True) lookups compare the
    integer values, so ``"07"`` finds ``"7"``.

    Args:
        names: the class names in id order: non-empty strings without
            surrounding whitespace, none twice.

    Raises:
        TxlError: no names, a bad one, or one twice.
    """

    def __init__(self, names: Sequence[str]):
        names = list(names)
        if not names:
            raise TxlError("a LabelSet needs at least one label")
        for i, name in enumerate(names):
            if not isinstance(name, str) or not name or name != name.strip():
                raise TxlError(f"label {i} ({name!r}) must be a non-empty string "
                               "without surrounding whitespace")
        self.names = names
        self.integer = all(_is_integer(n) for n in names)
        self._index: dict = {}
        for i, name in enumerate(names):
            key = self._key(name)
            if key in self._index:
                raise TxlError(f"label {name!r} appears twice (ids {self._index[key]} "
                               f"and {i})")
            self._index[key] = i

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> "LabelSet":
        """The distinct labels, sorted (numerically if all are integers).

        Args:
            labels: label strings (surrounding whitespace dropped), e.g. one
                per example.

        Returns:
            A :class:`LabelSet`.
        """
        labels = [str(label).strip() for label in labels]
        if not labels:
            raise TxlError("no labels to build a LabelSet from")
        if all(_is_integer(label) for label in labels):
            return cls([str(k) for k in sorted({int(label) for label in labels})])
        return cls(sorted(set(labels)))

    def _key(self, name: str):
        return int(name) if self.integer and _is_integer(name) else name

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_classes(self) -> int:
        return len(self.names)

    def __contains__(self, name: str) -> bool:
        return self._key(str(name).strip()) in self._index

    def __eq__(self, other) -> bool:
        return isinstance(other, LabelSet) and self.names == other.names

    def id(self, name: str) -> int:
        """The id of a class name.

        Args:
            name: the name (surrounding whitespace dropped).

        Returns:
            Its int id.

        Raises:
            UnknownLabelError: it is not a label.
        """
        found = self._index.get(self._key(str(name).strip()))
        if found is None:
            raise UnknownLabelError(f"unknown label {name!r}; known labels: "
                                    f"{', '.join(self._preview())}")
        return found

    def name(self, label_id: int) -> str:
        """The name of a class id.

        Args:
            label_id: an int in ``[0, num_classes)``.

        Returns:
            The name.
        """
        if not 0 <= int(label_id) < len(self.names):
            raise TxlError(f"label id {label_id} is out of range for "
                           f"{len(self.names)} classes")
        return self.names[int(label_id)]

    def _preview(self, limit: int = 20) -> list[str]:
        shown = [repr(n) for n in self.names[:limit]]
        return shown + [f"... ({len(self.names)} in all)"] if len(self.names) > limit else shown

    # -- JSON ----------------------------------------------------------------
    def to_json(self) -> dict:
        """The labels as JSON data.

        Returns:
            ``{"format_version": ..., "labels": [name, ...]}``.
        """
        return {"format_version": FORMAT_VERSION, "labels": list(self.names)}

    @classmethod
    def from_json(cls, data: dict) -> "LabelSet":
        """The labels of :meth:`to_json`'s data.

        Args:
            data: ``{"labels": [name, ...]}`` (``format_version`` optional).

        Returns:
            A :class:`LabelSet`.
        """
        if not isinstance(data, dict) or not isinstance(data.get("labels"), list):
            raise TxlError('expected an object {"labels": [name, ...]}')
        if data.get("format_version", FORMAT_VERSION) > FORMAT_VERSION:
            raise TxlError(f"format_version {data['format_version']} is newer than "
                           f"this reader ({FORMAT_VERSION})")
        return cls(data["labels"])

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``labels.json``.

        Args:
            path: a directory (made if missing) or a ``.json`` file.

        Returns:
            The file written, a `Path`.
        """
        path = _json_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n",
                        encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LabelSet":
        """Read a file written by :meth:`save`.

        Args:
            path: the directory or the file itself.

        Returns:
            A :class:`LabelSet`.

        Raises:
            FileNotFoundError: no labels file there.
            TxlError: the file is not a labels file.
        """
        path = _json_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"labels file not found: {path} (written by "
                                    "LabelSet.save when the training data was read)")
        try:
            return cls.from_json(parse_json(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as err:
            raise TxlError(f"{path}: not a labels file: {err}") from None

    def __repr__(self) -> str:
        return f"LabelSet({', '.join(self._preview(8))})"


def _json_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path if path.suffix == ".json" else path / LABELS_FILE
