"""Where a TensorFlow step spends its time: a few steps recorded with
TensorFlow's profiler, summarized from its own tool tables (the ones
TensorBoard's profile plugin shows).

On a GPU under XLA the table is `hlo_stats`: each compiled op's device time,
with its category (a matmul fusion, an elementwise loop fusion, a copy...).
Where it has no rows (TensorFlow's CPU does not trace XLA's ops) the table
is `framework_op_stats`: TensorFlow's ops (or, compiled, the whole function),
host and device.
"""
import glob
import json
import os

TOP_OPS = 8


def profiled(run, steps, folder):
    """Runs `run(steps)` under TensorFlow's profiler, its trace in `folder`;
    returns `summarize(folder, steps)`."""
    import tensorflow as tf
    tf.profiler.experimental.start(folder)
    try:
        run(steps)
    finally:
        tf.profiler.experimental.stop()
    return summarize(folder, steps)


def tool_table(paths, tool):
    """`(columns, rows)` of the profiler tool `tool` over the trace files
    `paths` (`*.xplane.pb`): column ids, and each row as a dict by them."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as plugin
    data, ok = plugin.xspace_to_tools_data(paths, tool, {})
    if not ok:
        return [], []
    table = json.loads(data)
    table = table[0] if isinstance(table, list) else table  # some tools give [device, host]
    columns = [c["id"] for c in table.get("cols", [])]
    return columns, [dict(zip(columns, (cell.get("v") if cell else None
                                         for cell in row["c"])))
                     for row in table.get("rows", [])]


def summarize_rows(rows, steps, source):
    """The summary of a tool table's `rows` (`total_self_time` in µs, a
    `category` or `type` and a name each) over `steps` steps: ms a step by
    category, largest first, and the `TOP_OPS` ops of most self time."""
    name_key = "hlo_op_name" if source == "hlo_stats" else "operation"
    category_key = "category" if source == "hlo_stats" else "type"
    total = sum(r["total_self_time"] or 0.0 for r in rows) or 1.0
    categories = {}
    for r in rows:
        key = str(r.get(category_key))
        categories[key] = categories.get(key, 0.0) + (r["total_self_time"] or 0.0) / 1e3 / steps
    top = sorted(rows, key=lambda r: -(r["total_self_time"] or 0.0))[:TOP_OPS]
    return {"source": source, "ms_per_step": total / 1e3 / steps,
            "by_category_ms": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "top": [{"name": r.get(name_key), "category": r.get(category_key),
                     "ms": (r["total_self_time"] or 0.0) / 1e3 / steps,
                     "share": (r["total_self_time"] or 0.0) / total} for r in top]}


def summarize(folder, steps):
    """The summary (`summarize_rows`) of the trace TensorFlow's profiler
    wrote under `folder` over `steps` steps: XLA's ops (`hlo_stats`) where
    the trace has them, else TensorFlow's (`framework_op_stats`, the IDLE
    row left out); `{"source": None}` where it holds neither."""
    paths = sorted(glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        return {"source": None, "why": f"no trace under {folder}"}
    _, rows = tool_table(paths, "hlo_stats")
    if rows:
        return summarize_rows(rows, steps, "hlo_stats")
    _, rows = tool_table(paths, "framework_op_stats")
    rows = [r for r in rows if r.get("operation") != "IDLE"]
    if rows:
        return summarize_rows(rows, steps, "framework_op_stats")
    return {"source": None, "why": "the trace has no op table"}


def one_line(summary, categories=4):
    """`summary` as one line: ms a step and its largest categories."""
    if not summary.get("source"):
        return f"no profile ({summary.get('why', 'none')})"
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in
                      list(summary["by_category_ms"].items())[:categories])
    return f"{summary['ms_per_step']:.1f} ms a step ({summary['source']}): {parts}"
