r"""A/B of the attention layer: the working tree against a git revision's
`txl_tf/layers/attention.py` + `rel_shift.py`, training tokens/s, interleaved.

    python -m benchmarks.ab_attention --rev=fba6bfd --shape=small --variants=f32,bf16 \
        --iters=30 --output=benchmarks/results/ab_attention.json

Both models are `TransformerXLLM`s compiled as in `train_throughput.py`; in
the "rev" one every `rel_attn.call` is replaced by the revision's (with its
own `rel_shift`), so the two differ in nothing else. `fit` batches alternate
between them in blocks.
"""
import subprocess
import types

from absl import app, flags

from benchmarks import throughput as tp

flags.DEFINE_string("rev", "HEAD", "Git revision of the reference attention.")
flags.DEFINE_string("shape", "small", "Shape.")
flags.DEFINE_list("variants", ["f32", "bf16"], f"Variants: {list(tp.VARIANTS)}.")
flags.DEFINE_integer("iters", 30, "Timed batches per model.")
flags.DEFINE_integer("warmup", 4, "Untimed batches per model first.")
flags.DEFINE_integer("block", 5, "Batches per model per round.")
flags.DEFINE_string("output", "benchmarks/results/ab_attention.json", "JSON results file.")
FLAGS = flags.FLAGS


def revision_call(rev):
    """`RelativeMultiHeadAttention.call` as of `rev`, using `rev`'s rel_shift."""
    def source(path):
        text = subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
        return text.replace("@keras.saving.register_keras_serializable", "# ")
    shift, attention = {}, {}
    exec(compile(source("txl_tf/layers/rel_shift.py"), "rev_rel_shift", "exec"), shift)
    exec(compile(source("txl_tf/layers/attention.py"), "rev_attention", "exec"), attention)
    attention["rel_shift"] = shift["rel_shift"]
    return attention["RelativeMultiHeadAttention"].call


def main(argv):
    del argv
    from txl_tf.data import segment_dataset
    env_before = tp.environment()
    old_call = revision_call(FLAGS.rev)
    cfg, batch, dataset = tp.shape_data(FLAGS.shape, segment_dataset)
    models = {}
    for v in FLAGS.variants:
        for which in ("rev", "tree"):
            model = tp.build_model(cfg, batch, cfg.mem_len, *tp.VARIANTS[v])
            if which == "rev":
                for block in model.core.blocks:
                    block.rel_attn.call = types.MethodType(old_call, block.rel_attn)
            models[f"{v} {which}"] = model
    times = tp.interleave({k: tp.fit_runner(m, dataset) for k, m in models.items()},
                          FLAGS.iters, FLAGS.warmup, FLAGS.block)
    rows = []
    for key, seconds in times.items():
        v, which = key.split()
        stats = tp.summarize(seconds, batch * cfg.tgt_len, 1.0, 1.0)
        for unused in ("model_gflops_per_s", "mfu"):
            stats.pop(unused)
        rows.append({"variant": v, "attention": FLAGS.rev if which == "rev" else "worktree",
                     **stats})
    for r in rows:
        ref = next(x for x in rows if x["variant"] == r["variant"])
        r["vs_rev"] = r["tokens_per_s"] / ref["tokens_per_s"]
    table = tp.format_table(rows, [
        ("variant", "variant", ""), ("attention", "attention", ""),
        ("median ms", "median_step_ms", ".1f"), ("p90 ms", "p90_step_ms", ".1f"),
        ("tok/s", "tokens_per_s", ",.0f"), ("x rev", "vs_rev", ".3f")])
    env = tp.environment()
    env["loadavg_before"] = env_before["loadavg"]
    print(f"loadavg before {env['loadavg_before']}, after {env['loadavg']}")
    print(table)
    tp.write_json(FLAGS.output, {
        "question": f"training tokens/s, attention of the working tree vs {FLAGS.rev}",
        "settings": {"shape": tp.SHAPES[FLAGS.shape], "iters": FLAGS.iters,
                     "warmup": FLAGS.warmup, "block": FLAGS.block, "rev": FLAGS.rev},
        "environment": env, "results": rows, "table": table})


if __name__ == "__main__":
    app.run(main)
