"""The paper's training configurations as absl flagfiles, found by name.

    python -m training.train --flagfile="$(python -m training.configs enwik8_base)" ...

`python -m training.configs` lists the names; with a name it prints the
file's path (inside the installed package, or this repository).
"""
import os

FOLDER = os.path.dirname(os.path.abspath(__file__))


def names():
    """The configurations shipped with the package."""
    return sorted(f[:-4] for f in os.listdir(FOLDER) if f.endswith(".cfg"))


def path(name):
    """The flagfile of configuration `name`; `ValueError` listing the known ones."""
    if name not in names():
        raise ValueError(f"unknown training configuration {name!r}; known: "
                         f"{', '.join(names())}")
    return os.path.join(FOLDER, name + ".cfg")
