"""The error that ends a generation at a row whose log-probs are no
distribution (NaN or +inf anywhere, or nothing finite: `sampling.usable_rows`
False), on every backend: the compiled `Decoder` (whose loop cannot raise:
such a row draws nothing more and the host raises once the loop returns),
the runtimes' host loops and the session table."""
import numpy as np

from txl_tf.checks.numpy_checks import InputError, NonFiniteMemoryError

CAUSES = ("usually weights that hold NaN or inf (a diverged fine-tune), a float16 or "
          "bfloat16 overflow, or a memory passed in that holds NaN or inf")


class NonFiniteLogProbsError(NonFiniteMemoryError):
    """The model produced NaN (or +inf, or no finite) log-probs for some rows
    while generating: nothing is returned for the call.

    Attributes:
        rows: the rows (or session ids) whose log-probs are not a distribution.
        steps: for each of `rows`, the index of the new id it could not draw
            (0: right after its prompt).
        ids: numpy `[B, n]`, what each row drew in this call before the
            error (`pad_id` after), or None; `lengths`: `[B]`, how many.
    """

    def __init__(self, rows, steps, ids=None, lengths=None, dtype=None):
        self.rows = [r.item() if hasattr(r, "item") else r for r in rows]
        self.steps = [int(s) for s in steps]
        self.ids, self.lengths, self.dtype = ids, lengths, dtype
        self.what, self.cause = "log-probs", CAUSES
        hint = (f" (the model computes in {dtype}: decode in float32)"
                if dtype in ("float16", "bfloat16") else "")
        drawn = ("" if lengths is None else
                 f"; the ids drawn before it (per row: {_listed(lengths)}) are on this "
                 "error's .ids and .lengths, not returned as a finished generation")
        InputError.__init__(
            self, f"stream(s) {_listed(self.rows)}: the model produced NaN or inf log-probs at "
                  f"new id {_listed(self.steps)} (counted from 0 in this call), so "
                  f"generation stopped: {CAUSES}{hint}{drawn}")

    def in_batch(self, rows):
        """The same error for rows numbered by `rows` (a sub-batch's map to
        the caller's batch, a session table's session ids)."""
        return NonFiniteLogProbsError([rows[r] for r in self.rows], self.steps, self.ids,
                                      self.lengths, self.dtype)


def raise_for_rows(broken, counters, start_counters, ids, pad_id, dtype=None):
    """Raises `NonFiniteLogProbsError` if any row is set in `broken` (numpy
    bool `[B]`). `counters - start_counters`: each row's ids drawn in this
    call, `ids` `[B, >= n]` their buffer; `dtype`: the model's compute dtype."""
    if not broken.any():
        return
    lengths = (np.asarray(counters) - np.asarray(start_counters)).astype(np.int32)
    width = int(lengths.max()) if lengths.size else 0
    drawn = np.asarray(ids)[:, :width].copy()
    drawn[np.arange(width)[None, :] >= lengths[:, None]] = pad_id
    rows = np.flatnonzero(broken)
    raise NonFiniteLogProbsError(rows, lengths[rows], drawn, lengths, dtype)


def _listed(values):
    values = [v.item() if hasattr(v, "item") else v for v in values]
    return ", ".join(map(str, values[:10])) + (", ..." if len(values) > 10 else "")
