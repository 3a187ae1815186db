"""Attention pictures: one layer's attention on one segment, memory marked.

```python
attn = segment_attention(core, ids, layer=1, segment=-1, seg_len=32, mem_len=64)
write_attention_png("attn.png", attn.weights(head=None), attn.visible, attn.n_memory)
```
The probabilities are the core's own (`TransformerXL.attention_probabilities`).
Keys run along x (the memory slots, then the segment, a red line between
them), queries (the segment's positions) down y. A cell a query cannot see
(a future key, an empty memory slot) is drawn in `BLANK`, a light grey that
no colormap value takes, so the causal triangle and the unfilled memory stand
out from attention that is merely small. `attention_image` is the raw picture
(each cell a `cell` x `cell` block of pixels, see `cell_slices`);
`attention_figure` puts it, pixel for pixel, between axes, labels and a
colorbar.
"""
from typing import NamedTuple

import numpy as np

from txl_tf.app.files import replacing
from txl_tf.app.reprs import fields_repr
from txl_tf.checks.numpy_checks import check_count, is_integer_dtype
from txl_tf.errors import TxlError

CMAP = "viridis"
BLANK = (232, 232, 232)  # a hidden cell; viridis has no grey
LINE = (220, 20, 60)     # the memory | segment boundary; viridis has no red


class SegmentAttention(NamedTuple):
    """One layer's attention on one segment of one sequence.

    probs: float32 `[n_head, T, M + T]`, keys = the M memory slots then the
        T segment positions; hidden keys hold 0.
    visible: bool `[T, M + T]`, True where the query may attend to the key.
    key_ids: int32 `[M + T]`, the token behind each key (-1: a memory slot
        holding no token yet).
    n_memory: M.
    layer, segment: which layer and segment (0-based).
    """

    probs: np.ndarray
    visible: np.ndarray
    key_ids: np.ndarray
    n_memory: int
    layer: int
    segment: int

    __repr__ = fields_repr

    @property
    def query_ids(self):
        return self.key_ids[self.n_memory:]

    def weights(self, head=None):
        """`[T, M + T]`: head `head`'s probabilities, or (None) their mean over heads."""
        if head is None:
            return self.probs.mean(axis=0)
        n_head = self.probs.shape[0]
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)) \
                or not 0 <= head < n_head:
            raise TxlError(f"head must be None (the mean) or an integer in [0, {n_head}), "
                             f"got {head!r}")
        return self.probs[head]


def segment_attention(core, token_ids, layer, segment=-1, seg_len=None, mem_len=None):
    """Layer `layer`'s attention on segment `segment` (negative: from the end)
    of the 1-D `token_ids` cut into segments of `seg_len` (default the
    model's `tgt_len`). The earlier segments are read first, carrying a
    memory of `mem_len` (default the model's) positions, so the picture shows
    the model reading that memory."""
    from txl_tf.layers.masks import attention_visibility
    from txl_tf.checks.inputs import InputError, out_of_range_message
    cfg = core.config
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or not is_integer_dtype(ids.dtype):
        raise TxlError(f"token_ids must be a non-empty 1-D sequence of integers, got shape "
                       f"{ids.shape} and dtype {ids.dtype}")
    problem = out_of_range_message(ids, cfg.n_token)  # before the int32 cast wraps them
    if problem:
        raise InputError(problem)
    seg_len = cfg.tgt_len if seg_len is None else check_count("seg_len", seg_len, low=1)
    n_segments = -(-ids.size // seg_len)
    if isinstance(segment, (bool, np.bool_)) or not isinstance(segment, (int, np.integer)) \
            or not -n_segments <= segment < n_segments:
        raise TxlError(f"segment must be an integer in [{-n_segments}, {n_segments}): "
                       f"{ids.size} tokens make {n_segments} segments of {seg_len}, "
                       f"got {segment!r}")
    segment = int(segment) % n_segments
    ids = ids.astype(np.int32)
    memory = core.initial_memory(1, mem_len)
    for start in range(0, segment * seg_len, seg_len):
        _, memory = core.hidden_states(ids[None, start:start + seg_len], memory, training=False)
    current = ids[None, segment * seg_len:(segment + 1) * seg_len]
    probs, _ = core.attention_probabilities(current, memory, layer)
    qlen, n_memory = current.shape[1], memory.mem_len
    visible = attention_visibility(qlen, memory.mem_mask, cfg.same_length,
                                   cfg.same_length_convention)[0, 0]
    start = segment * seg_len
    filled = min(n_memory, start)
    memory_ids = np.full([n_memory], -1, np.int32)
    memory_ids[n_memory - filled:] = ids[start - filled:start]
    return SegmentAttention(probs.numpy()[0], visible.numpy(),
                            np.concatenate([memory_ids, current[0]]), n_memory, int(layer),
                            segment)


# ----------------------------------------------------------------- drawing
def _checked(weights, visible, n_memory):
    weights = np.asarray(weights, np.float64)
    visible = np.asarray(visible, bool)
    if weights.ndim != 2 or visible.shape != weights.shape:
        raise TxlError(f"weights must be [T, M + T] and visible the same shape, got "
                       f"{weights.shape} and {visible.shape}")
    if not 0 <= int(n_memory) <= weights.shape[1]:
        raise TxlError(f"n_memory must be in [0, {weights.shape[1]}], got {n_memory}")
    return weights, visible, int(n_memory)


def _vmax(weights, visible, vmax):
    if vmax is None:
        vmax = weights[visible].max() if visible.any() else 1.0
    return float(vmax) if vmax > 0 else 1.0


def cell_slices(row, col, n_memory, cell=8, line=2):
    """`(rows, cols)` slices of cell (query `row`, key `col`) in `attention_image`."""
    left = col * cell + (line if col >= n_memory else 0)
    return slice(row * cell, (row + 1) * cell), slice(left, left + cell)


def require_matplotlib():
    """The `matplotlib` module, or an ImportError that says how to get it
    (an optional dependency: `pip install "txl_tf[viz]"`)."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError('attention pictures need matplotlib: pip install "txl_tf[viz]" '
                          '(or pip install matplotlib)') from None
    return matplotlib


def attention_image(weights, visible, n_memory, cell=8, line=2, vmax=None, cmap=CMAP):
    """The picture as uint8 RGB `[T * cell, (M + T) * cell + line, 3]`.

    Cell (query i, key j) is a `cell` x `cell` block (`cell_slices`) coloured
    by `cmap` scaled to `[0, vmax]` (default: the largest visible weight), or
    `BLANK` where `visible` is False; `line` columns of `LINE` part the M
    memory keys from the segment's."""
    matplotlib = require_matplotlib()
    weights, visible, n_memory = _checked(weights, visible, n_memory)
    if int(cell) < 1 or int(line) < 0:
        raise TxlError(f"cell must be >= 1 and line >= 0, got {cell} and {line}")
    scaled = np.clip(weights / _vmax(weights, visible, vmax), 0.0, 1.0)
    colors = matplotlib.colormaps[cmap](scaled, bytes=True)[..., :3]
    colors[~visible] = BLANK
    grid = np.repeat(np.repeat(colors, cell, axis=0), cell, axis=1)
    bar = np.broadcast_to(np.array(LINE, np.uint8), (grid.shape[0], int(line), 3))
    split = n_memory * cell
    return np.concatenate([grid[:, :split], bar, grid[:, split:]], axis=1)


def _ticks(n, offset, cell, line, n_memory, labels, most=12):
    """Tick positions (pixel centres) and labels for n cells."""
    step = 1 if labels is not None else max(1, -(-n // most))
    index = np.arange(0, n, step)
    centres = index * cell + cell / 2 - 0.5 + np.where(index >= n_memory, line, 0)
    text = [labels[i] for i in index] if labels is not None else [str(i - offset) for i in index]
    return centres, text


def attention_figure(weights, visible, n_memory, key_labels=None, query_labels=None,
                     title=None, cell=None, vmax=None, cmap=CMAP):
    """A matplotlib `Figure` holding `attention_image` pixel for pixel (at
    the figure's 100 dpi its image is a sub-array of the PNG): keys on x
    (numbered from the segment's start, memory negative, or `key_labels`),
    queries on y (or `query_labels`), "memory" and "segment" over their
    regions, a colorbar and a key for hidden cells. `cell` defaults to fit
    about 1200 pixels."""
    require_matplotlib()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    weights, visible, n_memory = _checked(weights, visible, n_memory)
    qlen, klen = weights.shape
    for name, labels, size in (("key_labels", key_labels, klen),
                               ("query_labels", query_labels, qlen)):
        if labels is not None and len(labels) != size:
            raise TxlError(f"{name} needs {size} labels, got {len(labels)}")
    if cell is None:
        cell = int(np.clip(1200 // max(klen, qlen), 2, 24))
    line = max(1, cell // 4)
    vmax = _vmax(weights, visible, vmax)
    image = attention_image(weights, visible, n_memory, cell, line, vmax, cmap)
    height, width = image.shape[:2]
    labelled = key_labels is not None or query_labels is not None
    widest = max((len(str(t)) for t in [*(key_labels or ()), *(query_labels or ())]), default=0)
    rotate = widest > 2
    left, right = 60 + 7 * max(widest, 3), 130
    bottom, top = 50 + 7 * (widest if rotate else 1), (70 if title else 45)
    fig_w, fig_h = width + left + right, height + bottom + top
    dpi = 100
    fig = Figure(figsize=(fig_w / dpi, fig_h / dpi), dpi=dpi)
    # The image goes in unresampled (figimage); the axes over it only carry
    # ticks and labels, in image pixel coordinates, without a frame.
    fig.figimage(image, xo=left, yo=bottom, origin="upper")
    ax = fig.add_axes([left / fig_w, bottom / fig_h, width / fig_w, height / fig_h])
    ax.set_xlim(-0.5, width - 0.5)
    ax.set_ylim(height - 0.5, -0.5)
    ax.patch.set_visible(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    font = 7 if labelled else 9
    xs, xl = _ticks(klen, n_memory, cell, line, n_memory, key_labels)
    ax.set_xticks(xs, xl, rotation=90 if rotate else 0, fontsize=font)
    ys, yl = _ticks(qlen, 0, cell, 0, 0, query_labels)
    ax.set_yticks(ys, yl, fontsize=font)
    ax.set_xlabel("keys: memory, then segment" + (" (position)" if key_labels is None else ""))
    ax.set_ylabel("queries")
    split = n_memory * cell + line / 2 - 0.5
    if n_memory:
        ax.text(split / 2, -4, f"memory ({n_memory})", ha="center", va="bottom", fontsize=10)
    ax.text((split + width) / 2, -4, f"segment ({qlen})", ha="center", va="bottom",
            fontsize=10)
    if title:
        fig.suptitle(title, y=1 - 8 / fig_h, va="top", fontsize=11)
    cax = fig.add_axes([(left + width + 20) / fig_w, bottom / fig_h, 14 / fig_w,
                        height / fig_h])
    fig.colorbar(ScalarMappable(Normalize(0.0, vmax), cmap), cax=cax,
                 label="attention probability")
    hidden = Patch(facecolor=np.array(BLANK) / 255, edgecolor="0.5", label="hidden")
    fig.legend(handles=[hidden], loc="upper left", fontsize=8, frameon=False,
               bbox_to_anchor=((left + width + 8) / fig_w, (bottom - 6) / fig_h),
               handlelength=1.2, borderaxespad=0)
    return fig


def write_attention_png(path, weights, visible, n_memory, **figure_options):
    """Writes `attention_figure(weights, visible, n_memory, **figure_options)`
    as a PNG at `path`; returns the path."""
    fig = attention_figure(weights, visible, n_memory, **figure_options)
    with replacing(path) as temporary:  # a kill never leaves half a picture
        fig.savefig(temporary, format="png", dpi=fig.dpi)
    return path
