"""How much context a model uses: the loss given exactly c tokens of context,
and the relative effective context length (RECL) of Dai et al. (2019),
Appendix C, for a group of models.

For models i, context lengths c and target positions t:

* `l_i(c, t)`: the loss of model i on token t given exactly the c tokens
  before it (`context_losses`);
* `b(c, t) = min_i l_i(c, t)`, the best model at context c;
* `f_i(c, c') = mean over T_r of min(b(c, t), l_i(c', t))`, T_r the fraction
  r of the positions with the largest `b(c, t)` (the hard tokens);
* `g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)`, the
  relative gain of model i from context c to c' over the group's best at c;
* RECL_i: starting at the first context, c grows by the step while
  `g_i(c, c + step) >= threshold` (0.01); RECL_i is the c where it stops.

A model that uses more context than the others keeps gaining over the
group's best at c, so its RECL is longer. The paper leaves open how
"exactly c tokens" is imposed and the grid of c; here a Transformer-XL
reads the c tokens from an empty memory of c slots, segment by segment
(`transformer_xl_scorer`), so no state carries older text.
"""
import functools
import math
from fractions import Fraction

import numpy as np

from txl_tf.checks.numpy_checks import check_count
from txl_tf.errors import TxlError


def sample_positions(n_ids, max_context, count, seed=0):
    """`count` target positions of a text of `n_ids` ids, each with at least
    `max_context` ids before it, sorted (a fixed sample: every model and
    context is scored on the same tokens).

    Raises:
        TxlError: the text is too short for `max_context`.
    """
    available = n_ids - max_context
    if available < 1:
        raise TxlError(f"the text has {n_ids} ids: too few for a context of {max_context} "
                       "(need at least one more)")
    count = min(int(count), available)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(available, size=count, replace=False) + max_context)


def context_losses(scorer, ids, positions, contexts, batch_size=32, progress=None):
    """`l(c, t) = -log p(ids[t] | ids[t - c : t])` for each context length
    and position.

    Args:
        scorer: `scorer(windows)` for int32 windows `[N, c]`: the
            log-probabilities `[N, n_token]` of the id after each window,
            read from that window alone.
        ids: the text, 1-D ids.
        positions: target positions (each at least `max(contexts)`).
        contexts: context lengths, each >= 1.
        batch_size: windows scored together (a short last batch is padded
            with copies of its last window, so all have one shape).
        progress: `progress(done, total)` after each batch, or None.

    Returns:
        float64 `[len(contexts), len(positions)]` losses in nats.
    """
    ids, positions = np.asarray(ids), np.asarray(positions)
    if min(contexts) < 1:
        raise TxlError(f"context lengths must be >= 1, got {min(contexts)}")
    if positions.min() < max(contexts):
        raise TxlError(f"position {int(positions.min())} has fewer than {max(contexts)} ids "
                       "before it")
    losses = np.zeros([len(contexts), len(positions)])
    total = len(contexts) * math.ceil(len(positions) / batch_size)
    done = 0
    for k, c in enumerate(contexts):
        for start in range(0, len(positions), batch_size):
            targets = positions[start:start + batch_size]
            # A short last batch repeats its last window: every batch of a
            # context length has one shape (one compiled graph, not two).
            rows = min(batch_size, len(positions))
            padded = np.pad(targets, (0, rows - len(targets)), mode="edge")
            windows = np.stack([ids[t - c:t] for t in padded]).astype(np.int32)
            log_probs = np.asarray(scorer(windows), np.float64)[:len(targets)]
            losses[k, start:start + len(targets)] = -log_probs[np.arange(len(targets)),
                                                                ids[targets]]
            done += 1
            if progress is not None:
                progress(done, total)
    return losses


def transformer_xl_scorer(core, segment_len=None):
    """A `context_losses` scorer for a `TransformerXL`: each window read
    segment by segment (`segment_len`, default the config's `tgt_len`) from
    an empty memory of as many slots as the window has ids, so every id of
    the window is attended and nothing older exists."""
    import tensorflow as tf
    from txl_tf.keras_support.placement import on_device, weights_device
    segment_len = core.config.tgt_len if segment_len is None else check_count(
        "segment_len", segment_len, low=1)
    compiled = {}

    def read(ids, width):
        lengths = tf.fill([tf.shape(ids)[0]], width)
        hidden = core.read_documents(ids, lengths, segment_len, mem_len=width)
        return core.crit.log_probs(hidden)

    def score(windows):
        width = windows.shape[1]
        if width not in compiled:  # one graph per context length
            # A partial per width: TensorFlow counts the traces of functions
            # of one code object together and, past five, warns of retracing.
            compiled[width] = on_device(
                tf.function(functools.partial(read, width=width), jit_compile=True,
                            autograph=False),
                weights_device(core))
        return compiled[width](tf.constant(windows)).numpy()

    return score


def relative_gain(losses, model, c, c_next, ratio):
    """`g_model(c, c_next)` over the fraction `ratio` of hardest positions.

    Args:
        losses: `[models, contexts, positions]` (`context_losses` of each model).
        model: index of the model.
        c, c_next: indices into the contexts.
        ratio: the fraction r of positions kept (those where the group's best
            loss at `c` is largest), in (0, 1].

    Returns:
        The relative gain, a float.

    Raises:
        TxlError: a ratio outside (0, 1], a table not 3-D, or a NaN or
            infinite loss.
    """
    if not 0 < ratio <= 1:
        raise TxlError(f"ratio must be in (0, 1], got {ratio}")
    losses = np.asarray(losses, np.float64)
    _check_table(losses)
    best = losses[:, c].min(0)  # b(c, t)
    # ceil(r x positions) of the decimal r, not of the float product (0.07 x 100 is 7.000...01)
    keep = max(1, math.ceil(Fraction(str(float(ratio))) * best.size))
    hard = np.argsort(-best, kind="stable")[:keep]
    f_same = np.minimum(best[hard], losses[model, c, hard]).mean()
    f_next = np.minimum(best[hard], losses[model, c_next, hard]).mean()
    return (math.exp(f_same) - math.exp(f_next)) / math.exp(f_same)


def _check_table(losses):
    """Raises `TxlError` unless `losses` is `[models, contexts, positions]`
    with a position, and at the first NaN or infinite loss: the best loss,
    the means and the gains of the definition are undefined there."""
    if np.ndim(losses) != 3 or not np.size(losses):
        raise TxlError(f"losses must be [models, contexts, positions] with a position, got "
                       f"shape {np.shape(losses)}")
    bad = np.argwhere(~np.isfinite(losses))
    if bad.size:
        model, c, t = (int(v) for v in bad[0])
        raise TxlError(f"model {model}'s loss at context index {c}, position {t} is "
                       f"{losses[model, c, t]}: RECL needs finite losses")


def recl(losses, contexts, ratio, threshold=0.01):
    """Each model's relative effective context length, and its gain curve.

    Args:
        losses: `[models, contexts, positions]`.
        contexts: the context lengths, increasing by a fixed step.
        ratio: as in `relative_gain`.
        threshold: the gain below which c stops growing.

    Returns:
        `(lengths, gains)`: RECL per model (a context length; the last one
        where the gain never fell below the threshold: then RECL is at least
        that), and `gains [models, len(contexts) - 1]`, `g_i(c_k, c_{k+1})`.

    Raises:
        TxlError: a threshold outside (0, 1), contexts that are not the
            table's, or as `relative_gain`.
    """
    if not 0 < threshold < 1:  # the gain is in [0, 1): else every RECL is an end of the grid
        raise TxlError(f"threshold must be in (0, 1), got {threshold}")
    losses = np.asarray(losses, np.float64)
    _check_table(losses)
    n_models, n_contexts = losses.shape[:2]
    if len(contexts) != n_contexts:
        raise TxlError(f"{len(contexts)} context lengths for a table of {n_contexts}")
    gains = np.array([[relative_gain(losses, i, k, k + 1, ratio) for k in range(n_contexts - 1)]
                      for i in range(n_models)]).reshape(n_models, n_contexts - 1)
    lengths = []
    for i in range(n_models):
        below = np.flatnonzero(gains[i] < threshold)
        lengths.append(int(contexts[below[0] if below.size else n_contexts - 1]))
    return lengths, gains
