r"""Training tokens/s of the real `TransformerXLLM.fit` step, memory carried.

    python -m benchmarks.train_throughput --shapes=small,medium \
        --variants=f32,f32+jit,bf16,bf16+jit --iters=30 \
        [--reference_dir=.../transformer-xl/pytorch --reference_python=.../bin/python] \
        --output=benchmarks/results/train_throughput.json

For each shape (`benchmarks.throughput.SHAPES`) one model per variant
(float32 / mixed_bfloat16 x jit_compile off / on), compiled as the training
job compiles it (ReplicaClippedAdam, clip 0.25, cosine schedule), is trained
on random bytes through `txl_tf.data.segment_dataset`; `fit` is called for
`--block` batches per variant in turn (interleaved, so that load from
elsewhere hits every variant alike) and a callback times each batch. Reports
the median step, tokens/s, model GFLOP/s (formula in `throughput.py`) and MFU
against the large-matmul peak of the row's compute dtype measured in the same
run; prints a table and writes JSON and its PNG chart. With `--reference_dir`,
the paper's PyTorch code (`paper_reference.py`) is the first row, interleaved
likewise.
"""

from benchmarks import throughput as tp
from txl_tf.app import cli
from txl_tf.app.flagspec import option, values

SPEC = (
    option("list", "shapes", ["small", "medium"], f"Shapes: {sorted(tp.SHAPES)}."),
    option("list", "variants", list(tp.VARIANTS), f"Variants: {list(tp.VARIANTS)}."),
    option("integer", "iters", 30, "Timed batches per variant."),
    option("integer", "warmup", 4, "Untimed batches per variant first (tracing, compiling)."),
    option("integer", "block", 5, "Batches per variant per round."),
    option("integer", "steps_per_execution", 1, "Keras steps_per_execution."),
    option("string", "output", "benchmarks/results/train_throughput.json", "JSON results file."),
) + tp.REFERENCE_OPTIONS


def main(argv):
    del argv
    o = tp.check_options(values(SPEC))
    from txl_tf.data import segment_dataset
    env_before, peak = tp.environment(), tp.peaks()
    rows = []
    for shape in o["shapes"]:
        cfg, batch, dataset = tp.shape_data(shape, segment_dataset)
        models = {v: tp.build_model(cfg, batch, cfg.mem_len, *tp.VARIANTS[v],
                                    steps_per_execution=o["steps_per_execution"])
                  for v in o["variants"]}
        params = sum(int(w.numpy().size) for w in next(iter(models.values())).trainable_weights)
        flops = tp.model_flops_per_token(cfg, cfg.tgt_len, cfg.mem_len, batch, training=True)
        runners = {v: tp.fit_runner(m, dataset) for v, m in models.items()}
        if o["reference_dir"]:  # first, so that the ratio column is "x paper"
            reference = tp.ReferenceRunner(o["reference_python"], o["reference_dir"],
                                           "train", shape, cfg.mem_len)
            runners = {"paper": reference, **runners}
        times = tp.interleave(runners, o["iters"], o["warmup"], o["block"])
        if o["reference_dir"]:
            reference.close()
        group = []
        for v, seconds in times.items():
            policy, jit = tp.VARIANTS.get(v, ("PyTorch float32", False))
            dtype = "bfloat16" if "bfloat16" in policy else "float32"
            group.append({"shape": shape, "variant": v, "policy": policy, "jit_compile": jit,
                          "steps_per_execution": o["steps_per_execution"],
                          "parameters": params, "batch_size": batch, "tgt_len": cfg.tgt_len,
                          "mem_len": cfg.mem_len, "model_mflop_per_token": flops / 1e6,
                          "peak_dtype": dtype, "peak_gflops": peak[dtype],
                          **tp.summarize(seconds, batch * cfg.tgt_len, flops, peak[dtype])})
        base = group[0]["tokens_per_s"]
        for r in group:
            r["vs_first"] = r["tokens_per_s"] / base
        rows.extend(group)
        del models
    columns = [("shape", "shape", ""), ("variant", "variant", ""), ("params", "parameters", ","),
               ("median ms", "median_step_ms", ".1f"), ("p90 ms", "p90_step_ms", ".1f"),
               ("tok/s", "tokens_per_s", ",.0f"), (f"x {rows[0]['variant']}", "vs_first", ".2f"),
               ("MFLOP/tok", "model_mflop_per_token", ".1f"), ("GFLOP/s", "model_gflops_per_s", ".1f"),
               ("MFU", "mfu", ".1%")]
    settings = {"iters": o["iters"], "warmup": o["warmup"], "block": o["block"],
                "steps_per_execution": o["steps_per_execution"],
                "shapes": {s: tp.SHAPES[s] for s in o["shapes"]}}
    tp.report(rows, peak, env_before, columns, o["output"],
              "training tokens/s of TransformerXLLM.fit, memory carried", settings)


if __name__ == "__main__":
    cli.run(main, SPEC)
