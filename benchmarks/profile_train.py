r"""Where a training step's time goes: TensorFlow profiler trace of `fit`.

    python -m benchmarks.profile_train --shape=small --variants=f32,bf16 --steps=5 \
        --output=benchmarks/results/profile_train.json

Traces `--steps` `fit` batches of each variant (after warm-up) with
`tf.profiler.experimental`, reads the host plane of the trace and sums the
time of TensorFlow op events by op type and by op name; prints the top ones
per variant. Op times are summed over threads (the two inter-op/intra-op
pools run ops concurrently), so they are shares of CPU time, not of wall time.
"""
import collections
import glob
import os
import re
import tempfile
import time

from absl import app, flags

from benchmarks import throughput as tp

flags.DEFINE_string("shape", "small", "Shape.")
flags.DEFINE_list("variants", ["f32", "bf16"], "Variants.")
flags.DEFINE_integer("steps", 5, "Traced batches per variant.")
flags.DEFINE_integer("top", 25, "Rows printed per table.")
flags.DEFINE_string("logdir", None, "Trace folder (default: a temporary one).")
flags.DEFINE_string("output", "benchmarks/results/profile_train.json", "JSON results file.")
FLAGS = flags.FLAGS


def op_times(logdir):
    """`(by_type, by_name)`: picoseconds of TF op events in the host plane,
    summed by op type and by op name (layers merged)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type, by_name = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name or name.startswith(("__inference",
                                                                      "Iterator")):
                    continue  # op events are "name:Type"; "A::B" are executor spans
                op_name, op_type = name.rsplit(":", 1)
                if not op_type or " " in op_type:
                    continue
                by_type[op_type] += event.duration_ps
                # one row for the same op of every layer
                by_name[re.sub(r"layer_\d+(_\d+)?", "layer_*", op_name.replace(
                    "StatefulPartitionedCall/", "")) + ":" + op_type] += event.duration_ps
    return by_type, by_name


def main(argv):
    del argv
    import tensorflow as tf
    from txl_tf.data import segment_dataset
    cfg, batch, dataset = tp.shape_data(FLAGS.shape, segment_dataset)
    root = FLAGS.logdir or tempfile.mkdtemp(prefix="txl_profile_")
    report = {"shape": FLAGS.shape, "steps": FLAGS.steps, "environment": tp.environment(),
              "variants": {}}
    for v in FLAGS.variants:
        model = tp.build_model(cfg, batch, cfg.mem_len, *tp.VARIANTS[v])
        model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0, shuffle=False)
        logdir = os.path.join(root, v.replace("+", "_"))
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=FLAGS.steps, verbose=0, shuffle=False)
        wall = time.perf_counter() - start
        tf.profiler.experimental.stop()
        by_type, by_name = op_times(logdir)
        total = sum(by_type.values())
        print(f"\n{v}: {FLAGS.steps} steps in {wall:.2f}s wall ({wall / FLAGS.steps * 1e3:.0f} ms/step); "
              f"op time summed over threads {total / 1e12:.2f}s")
        for title, counter in (("op type", by_type), ("op name", by_name)):
            rows = [{"op": k, "ms_per_step": t / 1e9 / FLAGS.steps, "share": t / total}
                    for k, t in counter.most_common(FLAGS.top)]
            print(tp.format_table(rows, [(title, "op", ""), ("ms/step", "ms_per_step", ".1f"),
                                         ("share", "share", ".1%")]))
            report["variants"].setdefault(v, {})[title] = rows
        report["variants"][v].update(wall_s=wall, op_s_per_step=total / 1e12 / FLAGS.steps,
                                     logdir=logdir)
        del model
    tp.write_json(FLAGS.output, report)


if __name__ == "__main__":
    app.run(main)
