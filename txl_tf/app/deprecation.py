"""Deprecated names keep working for one release, with a DeprecationWarning
that names what replaces each and the release that removes it (CHANGELOG.md
lists them under "Deprecated"). A removed method or keyword argument then
says what replaces it (`REMOVED`; CHANGELOG.md lists them under "Removed")."""
import warnings

# The release that removes the names deprecated now.
REMOVED_IN = "0.5.0"

# A log_probs="last" export's step gives the last position alone ([B, n_token]).
_STEP_LAST = ("step(ids, memory) (the last position's log-probs: [:, -1] of them; all of them "
              "on a log_probs='last' export)")

# Removed names -> what replaces each: `Class.method` (the class declares
# it with `answers_removed_names`) and `Class.method(keyword=)` (the method
# passes its unknown keywords to `check_no_removed_keywords`).
REMOVED = {
    "TransformerXL.cached_read": "call_with_cache(token_ids, cache, write=False)",
    "TransformerXL.cached_step": "call_with_cache(token_ids, cache, stopped=stopped)",
    "TransformerXL.cached_segment": "call_with_cache(token_ids, cache) (ids [B, T])",
    "TransformerXL.segment_on_keys":
        "call_with_cache(token_ids, KeysValues(keys, values, mem_mask))",
    "TransformerXL.call_with_cache(position_keys=)":
        "call_with_cache(token_ids, cache._replace(position_keys=keys)) "
        "(keys = core.decode_position_keys(cache))",
    "RelativeMultiHeadAttention.call_on_keys":
        "call_with_cache(inputs, mem_keys, mem_values, pos_emb, visible, r_w_bias, r_r_bias)",
    "RelativeMultiHeadAttention.token_call":
        "call_with_cache(inputs, keys, values, positions, visible, r_w_bias, r_r_bias, "
        "at_slot=at_slot) (visible: bool [B, S])",
    "Runtime.step_last": _STEP_LAST,
    "Runtime.next_log_probs": _STEP_LAST,
    "Runtime.adopt": "take(memory, range(batch)) (checked, in this runtime's tensors)",
    "Runtime.split": "take(memory, [row]) for each row",
    "Runtime.decode": "generate(None, n, resume=state)",
    "Runtime.next_cached": "decode_step(ids, cache, stopped)",
    "Runtime.read_cached": "decode_read(ids, cache)",
    "Runtime.take_cache": "take(cache, rows)",
    "Runtime.concat_caches": "concat(caches)",
    "Runtime.copy_cache": "take(cache, range(batch)) (a copy of every row)",
}


def warn_deprecated(old, new):
    """Warns, at the line that called the deprecated `old`, to use `new`."""
    warnings.warn(f"{old} is deprecated and removed in {REMOVED_IN}: use {new}",
                  DeprecationWarning, stacklevel=3)


def removed_error(name):
    """The error for the removed `name` (a key of `REMOVED`): an
    AttributeError for a method, a TypeError for a keyword argument."""
    error = TypeError if name.endswith("=)") else AttributeError
    return error(f"{name} was removed; use {REMOVED[name]}")


class _Removed:
    """A removed method on its class: reading it raises `removed_error`
    (`help()` of the class, which lists it among the methods, says so)."""

    def __init__(self, name):
        self.name = name
        self.__doc__ = str(removed_error(name))

    def __get__(self, obj, owner=None):
        raise removed_error(self.name)


def answers_removed_names(owner):
    """A class decorator: each `owner.method` of `REMOVED` raises
    `removed_error` on the class and its subclasses.

    Args:
        owner: the class's name in `REMOVED` (the name the methods had).

    Returns:
        The decorator.
    """
    def declare(cls):
        for name in REMOVED:
            if name.startswith(f"{owner}.") and not name.endswith(")"):
                setattr(cls, name.split(".", 1)[1], _Removed(name))
        return cls
    return declare


def check_no_removed_keywords(owner, keywords):
    """Raises for keyword arguments that `owner` does not take: a removed
    one's `removed_error`, else Python's own TypeError.

    Args:
        owner: `Class.method`.
        keywords: the unknown keyword arguments (a dict; empty passes).
    """
    for keyword in keywords:
        if f"{owner}({keyword}=)" in REMOVED:
            raise removed_error(f"{owner}({keyword}=)")
        raise TypeError(f"{owner}() got an unexpected keyword argument {keyword!r}")
