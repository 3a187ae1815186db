r"""Evaluation tokens/s of `TransformerXLLM.evaluate` at memory 128 and 512.

    python -m benchmarks.eval_throughput --shapes=small --mem_lens=128,512 \
        --variants=f32,f32+jit,bf16,bf16+jit --iters=30 \
        [--reference_dir=.../transformer-xl/pytorch --reference_python=.../bin/python] \
        --output=benchmarks/results/eval_throughput.json

One model per variant and memory length (random weights, the shape's
`tgt_len` and batch), compiled as the training job compiles it; `evaluate`
runs `--block` batches of `txl_tf.data.eval_segment_dataset` per model in
turn (interleaved) and a callback times each batch. Every `evaluate` call
starts from an empty memory; the work per batch does not depend on how full
it is. Model FLOPs per token are the forward formula of `throughput.py`.
With `--reference_dir`, the paper's PyTorch code (`paper_reference.py`) is
the first row of each memory length, interleaved likewise. Prints a table
and writes JSON and its PNG chart.
"""
from benchmarks import throughput as tp
from benchmarks.common import integer_list
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

SPEC = (
    option("list", "shapes", ["small"], f"Shapes: {sorted(tp.SHAPES)}."),
    option("list", "mem_lens", ["128", "512"], "Evaluation memory lengths."),
    option("list", "variants", list(tp.VARIANTS), f"Variants: {list(tp.VARIANTS)}."),
    option("integer", "iters", 30, "Timed batches per model."),
    option("integer", "warmup", 3, "Untimed batches per model first."),
    option("integer", "block", 5, "Batches per model per round."),
    option("string", "output", "benchmarks/results/eval_throughput.json", "JSON results file."),
) + tp.REFERENCE_OPTIONS


def evaluate_runner(model, dataset):
    def run(n):
        timer = tp.batch_timer()
        model.evaluate(dataset, steps=n, verbose=0, callbacks=[timer])
        return timer.times
    return run


def main(argv):
    del argv
    o = tp.check_options(values(SPEC))
    mem_lens = integer_list(o["mem_lens"], "mem_lens", 0, "comma-separated integers >= 0")
    from txl_tf.data import eval_segment_dataset
    env_before, peak = tp.environment(), tp.peaks()
    rows = []
    for shape in o["shapes"]:
        cfg, batch, dataset = tp.shape_data(shape, eval_segment_dataset)
        variants = (["paper"] if o["reference_dir"] else []) + o["variants"]
        keys = [(v, m) for m in mem_lens for v in variants]
        runners = {}
        for v, m in keys:
            if v == "paper":
                runners[f"{v} mem{m}"] = tp.ReferenceRunner(
                    o["reference_python"], o["reference_dir"], "eval", shape, m)
            else:
                model = tp.build_model(cfg, batch, m, *tp.VARIANTS[v])
                runners[f"{v} mem{m}"] = evaluate_runner(model, dataset)
        times = tp.interleave(runners, o["iters"], o["warmup"], o["block"])
        for runner in runners.values():
            if isinstance(runner, tp.ReferenceRunner):
                runner.close()
        group = []
        for (v, mem), seconds in zip(keys, times.values()):
            policy, jit = tp.VARIANTS.get(v, ("PyTorch float32", False))
            dtype = "bfloat16" if "bfloat16" in policy else "float32"
            flops = tp.model_flops_per_token(cfg, cfg.tgt_len, mem, batch, training=False)
            group.append({"shape": shape, "variant": v, "policy": policy, "jit_compile": jit,
                          "mem_len": mem, "batch_size": batch, "tgt_len": cfg.tgt_len,
                          "model_mflop_per_token": flops / 1e6, "peak_dtype": dtype,
                          "peak_gflops": peak[dtype],
                          **tp.summarize(seconds, batch * cfg.tgt_len, flops, peak[dtype])})
        for r in group:
            base = next(g for g in group if g["mem_len"] == r["mem_len"])
            r["vs_first"] = r["tokens_per_s"] / base["tokens_per_s"]
        rows.extend(group)
        del runners
    columns = [("shape", "shape", ""), ("mem", "mem_len", "d"), ("variant", "variant", ""),
               ("median ms", "median_step_ms", ".1f"), ("p90 ms", "p90_step_ms", ".1f"),
               ("tok/s", "tokens_per_s", ",.0f"), (f"x {rows[0]['variant']}", "vs_first", ".2f"),
               ("MFLOP/tok", "model_mflop_per_token", ".1f"), ("GFLOP/s", "model_gflops_per_s", ".1f"),
               ("MFU", "mfu", ".1%")]
    settings = {"iters": o["iters"], "warmup": o["warmup"], "block": o["block"],
                "mem_lens": mem_lens,
                "shapes": {s: tp.SHAPES[s] for s in o["shapes"]}}
    tp.report(rows, peak, env_before, columns, o["output"],
              "evaluation tokens/s of TransformerXLLM.evaluate, memory carried", settings)


if __name__ == "__main__":
    cli.run(main, SPEC)
