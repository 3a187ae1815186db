"""Deprecated names keep working for one release, with a DeprecationWarning
that names what replaces each and the release that removes it (CHANGELOG.md
lists them under "Deprecated")."""
import warnings

REMOVED_IN = "0.4.0"


def warn_deprecated(old, new):
    """Warns, at the line that called the deprecated `old`, to use `new`."""
    warnings.warn(f"{old} is deprecated and removed in {REMOVED_IN}: use {new}",
                  DeprecationWarning, stacklevel=3)
