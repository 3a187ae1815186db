r"""PNG bar charts of the throughput benchmarks' JSON results.

    python -m benchmarks.throughput_chart benchmarks/results/train_throughput.json \
        benchmarks/results/eval_throughput.json

One chart per file, next to it (`.png`): tokens/s per variant, grouped by
shape (training) or memory length (evaluation), the paper's PyTorch code
first where the run had it, each bar labelled with its ratio to the group's
first bar. Needs matplotlib (the `bench` extra).
"""
import json
import os
import sys


def chart(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    rows = result["results"]
    group_key = "mem_len" if "evaluation" in result["question"] else "shape"
    groups = list(dict.fromkeys(r[group_key] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(groups) * len(variants) * width * 2.5, 4))
    for v, variant in enumerate(variants):
        xs, ys, ratios = [], [], []
        for g, group in enumerate(groups):
            row = next((r for r in rows if r[group_key] == group and r["variant"] == variant),
                       None)
            if row is not None:
                xs.append(g + (v - (len(variants) - 1) / 2) * width)
                ys.append(row["tokens_per_s"])
                ratios.append(row["vs_first"])
        bars = ax.bar(xs, ys, width, label=variant)
        for bar, ratio in zip(bars, ratios):
            ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
    label = "memory" if group_key == "mem_len" else "shape"
    ax.set_xticks(range(len(groups)), [f"{label} {g}" for g in groups])
    ax.set_ylabel("tokens / s")
    ax.set_title(result["question"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    output = os.path.splitext(path)[0] + ".png"
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(paths):
    for path in paths:
        print(f"wrote {chart(path)}")


if __name__ == "__main__":
    main(sys.argv[1:])
