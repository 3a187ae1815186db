r"""Checkpoints of the paper's own TF code, imported, against that code (run by hand).

    python -m benchmarks.tf_parity --ref_dir=/path/to/kimiyoung/transformer-xl/tf

For each tiny case below, a child process builds the paper's graph
(`model.transformer(...)` as `tf/train_gpu.py` builds it: its flags,
`use_tpu=False`, `mems` placeholders of `[mem_len, batch, d_model]` fed zeros
first and then the `new_mems` it returned) under this TensorFlow's
`tf.compat.v1` in graph mode, gives every variable random values, saves a TF1
checkpoint with `tf.compat.v1.train.Saver` and runs a few segments. Here the
checkpoint is imported with `txl_tf.weights.import_tf_checkpoint` and the
float32 core reads the same segments from `initial_memory()`; the table gives
max |Δ| of the per-token NLL (the TF code's `nll` before its mean), of the
mean `loss` and of the new memories, each over all segments. The weights the
import reads must be the graph's trainable variables, names and shapes (the
checkpoint also holds train_gpu.py's Adam slots and step).

Without `--ref_dir` the benchmark prints one line saying it was skipped. The
paper's code is only read and run, never copied into this project: the child
writes `model.py` into a temporary folder without its `import tensorflow as
tf` and runs it with `tf` set to `v1_namespace()`: `tf.compat.v1` plus
stand-ins for what TF 2 lacks (`tf.layers.dense` / `dropout`,
`tf.contrib.layers.layer_norm`, with TF 1's variable names and semantics).
Results: `benchmarks/results/tf_parity.json`.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

try:
    from txl_tf.app.flagspec import option
except ImportError:  # pragma: no cover - the child imports this file by path
    def option(*fields):
        return fields

SPEC = (
    option("string", "ref_dir", None,
           "The paper's tf/ folder (model.py); without it the benchmark is skipped."),
    option("string", "output", "benchmarks/results/tf_parity.json", "JSON results file."),
)
SIZES = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24)
BATCH, SEGMENTS = 3, 3
# train_gpu.py's flags of each case (tie_projs from proj_share_all_but_first).
CASES = {
    "no cutoffs": dict(n_token=30, cutoffs=[], div_val=1, d_embed=16, tgt_len=5, mem_len=7),
    "no cutoffs, d_embed 12": dict(n_token=30, cutoffs=[], div_val=1, d_embed=12, tgt_len=5,
                                   mem_len=7, untie_r=True),
    "div_val 1, shared projs": dict(n_token=40, cutoffs=[10, 25], div_val=1, d_embed=12,
                                    proj_share_all_but_first=True, tgt_len=5, mem_len=3,
                                    same_length=True),
    "div_val 1, own projs": dict(n_token=40, cutoffs=[10, 25], div_val=1, d_embed=12,
                                 tgt_len=4, mem_len=6, clamp_len=3, untie_r=True),
    "div_val 1, d_embed = d_model": dict(n_token=40, cutoffs=[10], div_val=1, d_embed=16,
                                         tgt_len=4, mem_len=4, same_length=True, clamp_len=2),
    "div_val 2, proj_same_dim": dict(n_token=40, cutoffs=[10, 25], div_val=2, d_embed=16,
                                     proj_share_all_but_first=True, tgt_len=5, mem_len=8,
                                     same_length=True, untie_r=True),
    "div_val 2, not proj_same_dim": dict(n_token=40, cutoffs=[10, 25], div_val=2, d_embed=16,
                                         proj_same_dim=False, tgt_len=5, mem_len=2,
                                         clamp_len=4),
    "div_val 2, shared, not proj_same_dim": dict(
        n_token=40, cutoffs=[10, 25], div_val=2, d_embed=16, proj_same_dim=False,
        proj_share_all_but_first=True, tgt_len=4, mem_len=5, untie_r=True),
    "div_val 2, d_embed 32": dict(n_token=40, cutoffs=[10, 25], div_val=2, d_embed=32,
                                  proj_share_all_but_first=True, tgt_len=4, mem_len=6,
                                  same_length=True, clamp_len=3),
    "lm1b-like (div_val 4)": dict(n_token=60, cutoffs=[10, 25, 40], div_val=4, d_embed=64,
                                  proj_same_dim=False, untie_r=True, same_length=True,
                                  tgt_len=4, mem_len=6, clamp_len=5),
    "wt103-like (div_val 4)": dict(n_token=60, cutoffs=[10, 25, 40], div_val=4, d_embed=64,
                                   proj_share_all_but_first=True, untie_r=True,
                                   same_length=True, tgt_len=5, mem_len=9, clamp_len=3),
    "mem_len 0": dict(n_token=40, cutoffs=[10], div_val=2, d_embed=16, tgt_len=4, mem_len=0),
}


def flags_of(case):
    """All of train_gpu.py's model flags for `case` (its defaults filled in)."""
    return {"proj_share_all_but_first": False, "proj_same_dim": True, "untie_r": False,
            "same_length": False, "clamp_len": -1, **SIZES, **case}


def tie_projs(flags):
    """`tie_projs` as train_gpu.py derives it from `proj_share_all_but_first`."""
    return [i > 0 and flags["proj_share_all_but_first"] for i in range(len(flags["cutoffs"]) + 1)]


def txl_config(case):
    """The `TransformerXLConfig` fields that describe `case`'s checkpoint."""
    f = flags_of(case)
    return dict(n_token=f["n_token"], n_layer=f["n_layer"], d_model=f["d_model"],
                n_head=f["n_head"], d_head=f["d_head"], d_inner=f["d_inner"],
                d_embed=f["d_embed"], div_val=f["div_val"], cutoffs=list(f["cutoffs"]),
                tie_projs=tie_projs(f), proj_same_dim=f["proj_same_dim"], untie_r=f["untie_r"],
                same_length=f["same_length"], clamp_len=f["clamp_len"], tgt_len=f["tgt_len"],
                mem_len=f["mem_len"], dropout=0.0, dropatt=0.0)


# ------------------------------------------------------- TF 1 stand-ins
def v1_namespace():
    """`tf.compat.v1` with what TF 2 removed from it, as the paper's code uses it."""
    import tensorflow as tf
    v1 = tf.compat.v1

    def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None,
              name=None):
        """TF 1's `tf.layers.dense`: `name/kernel` `[in, units]`, `name/bias`."""
        with v1.variable_scope(name, default_name="dense"):
            kernel = v1.get_variable("kernel", [inputs.shape[-1], units],
                                     initializer=kernel_initializer)
            out = tf.tensordot(inputs, kernel, [[inputs.shape.ndims - 1], [0]])
            if use_bias:
                out = tf.nn.bias_add(out, v1.get_variable("bias", [units],
                                                          initializer=v1.zeros_initializer()))
            return out if activation is None else activation(out)

    def dropout(inputs, rate=0.5, training=False, name=None):
        if training:
            raise NotImplementedError("this stand-in runs inference only")
        return inputs

    def layer_norm(inputs, begin_norm_axis=1, scope=None):
        """TF 1's `tf.contrib.layers.layer_norm` (center and scale, epsilon 1e-12)."""
        with v1.variable_scope(scope, default_name="LayerNorm"):
            shape = inputs.shape[-1:]
            beta = v1.get_variable("beta", shape, initializer=v1.zeros_initializer())
            gamma = v1.get_variable("gamma", shape, initializer=v1.ones_initializer())
            axes = list(range(begin_norm_axis % inputs.shape.ndims, inputs.shape.ndims))
            mean, variance = tf.nn.moments(inputs, axes, keepdims=True)
            return tf.nn.batch_normalization(inputs, mean, variance, offset=beta, scale=gamma,
                                             variance_epsilon=1e-12)

    namespace = types.SimpleNamespace(**{k: getattr(v1, k) for k in dir(v1)
                                         if not k.startswith("__")})
    namespace.layers = types.SimpleNamespace(dense=dense, dropout=dropout)
    namespace.contrib = types.SimpleNamespace(layers=types.SimpleNamespace(layer_norm=layer_norm))
    return namespace


IMPORT_LINE = "import tensorflow as tf\n"


def load_paper_model(ref_dir, folder):
    """The paper's `model.py`, copied into `folder` with its TF import removed,
    as a module whose `tf` is `v1_namespace()`."""
    source = os.path.join(ref_dir, "model.py")
    if not os.path.isfile(source):
        raise SystemExit(f"error: {ref_dir} has no model.py (pass the tf/ folder of "
                         "kimiyoung/transformer-xl)")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    if not text.startswith(IMPORT_LINE):
        raise SystemExit(f"error: {source} does not start with {IMPORT_LINE.strip()!r}: "
                         "not the expected revision")
    path = os.path.join(folder, "paper_tf_model.py")
    text = "tf = None  # set by benchmarks.tf_parity: v1_namespace()\n" + text[len(IMPORT_LINE):]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    module = types.ModuleType("paper_tf_model")
    module.__file__ = path
    exec(compile(text, path, "exec"), module.__dict__)
    module.tf = v1_namespace()
    return module


def paper_stage(ref_dir, out_dir):
    """In a fresh interpreter (graph mode for the whole process): each case's
    checkpoint and its outputs, `out_dir/<i>/model.ckpt*` and `out_dir/<i>/run.npz`."""
    import tensorflow as tf
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    model = load_paper_model(ref_dir, out_dir)
    per_token = []

    def logsoftmax(**kwargs):  # the TF code's own function; its mean is `loss`
        kwargs.pop("return_mean", None)
        nll = mask_adaptive_logsoftmax(return_mean=False, **kwargs)
        per_token.append(nll)
        return tf.reduce_mean(nll)

    mask_adaptive_logsoftmax = model.mask_adaptive_logsoftmax
    model.mask_adaptive_logsoftmax = logsoftmax
    for c, case in enumerate(CASES.values()):
        f = flags_of(case)
        rng = np.random.default_rng(c)
        graph = tf.Graph()
        with graph.as_default():
            inp = v1.placeholder(tf.int32, [f["tgt_len"], BATCH])
            tgt = v1.placeholder(tf.int32, [f["tgt_len"], BATCH])
            mems = [v1.placeholder(tf.float32, [f["mem_len"], BATCH, f["d_model"]])
                    for _ in range(f["n_layer"])]
            per_token.clear()
            loss, new_mems = model.transformer(
                dec_inp=inp, target=tgt, mems=mems, n_token=f["n_token"],
                n_layer=f["n_layer"], d_model=f["d_model"], d_embed=f["d_embed"],
                n_head=f["n_head"], d_head=f["d_head"], d_inner=f["d_inner"], dropout=0.0,
                dropatt=0.0, initializer=v1.initializers.random_normal(stddev=0.02),
                proj_initializer=v1.initializers.random_normal(stddev=0.01),
                is_training=False, mem_len=f["mem_len"], cutoffs=list(f["cutoffs"]),
                div_val=f["div_val"], tie_projs=tie_projs(f), input_perms=None,
                target_perms=None, head_target=None, same_length=f["same_length"],
                clamp_len=f["clamp_len"], use_tpu=False, untie_r=f["untie_r"],
                proj_same_dim=f["proj_same_dim"])
            nll = per_token[0]
            # train_gpu.py's optimizer: its slots (`<weight>/Adam`, `/Adam_1`) and
            # beta powers are in the checkpoint as in the paper's own.
            v1.train.AdamOptimizer(1e-4).minimize(
                loss, global_step=v1.train.get_or_create_global_step())
            variables = v1.global_variables()
            trainable = {v.op.name for v in v1.trainable_variables()}
            saver = v1.train.Saver()
            with v1.Session(graph=graph) as sess:
                sess.run(v1.global_variables_initializer())
                names = {}
                for v in variables:
                    if v.dtype.base_dtype != tf.float32:
                        continue
                    scale = 0.1 if "LayerNorm/gamma" in v.name else 0.3
                    value = rng.normal(0, scale, v.shape.as_list()).astype(np.float32)
                    if "LayerNorm/gamma" in v.name:
                        value += 1
                    v.load(value, sess)
                    if v.op.name in trainable:
                        names[v.op.name] = v.shape.as_list()
                folder = os.path.join(out_dir, str(c))
                os.makedirs(folder)
                saver.save(sess, os.path.join(folder, "model.ckpt"))
                ids = rng.integers(0, f["n_token"], (SEGMENTS, f["tgt_len"] + 1, BATCH))
                memory = [np.zeros(m.shape.as_list(), np.float32) for m in mems]
                out = {"ids": ids}
                for s in range(SEGMENTS):
                    feed = {inp: ids[s, :-1], tgt: ids[s, 1:]}
                    feed.update(zip(mems, memory))
                    loss_s, nll_s, memory = sess.run([loss, nll, new_mems], feed)
                    out[f"loss/{s}"], out[f"nll/{s}"] = loss_s, nll_s
                    out[f"mems/{s}"] = np.stack(memory)
                np.savez(os.path.join(folder, "run.npz"), **out)
                with open(os.path.join(folder, "variables.json"), "w", encoding="utf-8") as fh:
                    json.dump(names, fh)


# ----------------------------------------------------------------- our side
def compare_case(folder, case):
    """max |Δ| of the imported core against the paper's outputs in `folder`."""
    from txl_tf.weights import get_weights, import_tf_checkpoint

    core = import_tf_checkpoint(os.path.join(folder, "model.ckpt"), txl_config(case))
    with open(os.path.join(folder, "variables.json"), encoding="utf-8") as f:
        paper = json.load(f)  # its trainable variables: what the import must read
    read = {name: list(value.shape) for name, value in get_weights(core).items()}
    if read != paper:
        raise AssertionError(f"the import read {sorted(set(read) ^ set(paper))} or other "
                             "shapes than the paper's trainable variables")
    with np.load(os.path.join(folder, "run.npz"), allow_pickle=False) as data:
        run = {k: data[k] for k in data.files}
    ids = run["ids"].transpose(0, 2, 1)  # [segment, B, T + 1]
    memory = core.initial_memory(BATCH)
    deltas = {"nll": 0.0, "loss": 0.0, "mems": 0.0, "nll_scale": 0.0}
    for s in range(SEGMENTS):
        nll, memory = core(ids[s, :, :-1], memory, targets=ids[s, :, 1:])
        nll = np.asarray(nll, np.float64).T  # time-major, as the TF code's
        want = run[f"nll/{s}"]
        deltas["nll"] = max(deltas["nll"], float(np.abs(nll - want).max()))
        deltas["nll_scale"] = max(deltas["nll_scale"], float(np.abs(want).max()))
        deltas["loss"] = max(deltas["loss"], abs(float(nll.mean()) - float(run[f"loss/{s}"])))
        mems = np.asarray(memory.mems).transpose(0, 2, 1, 3)  # [layer, M, B, d]
        want = run[f"mems/{s}"]
        if mems.shape != want.shape:
            raise AssertionError(f"memory shape {mems.shape}, the paper's {want.shape}")
        deltas["mems"] = max(deltas["mems"], float(np.abs(mems - want).max()) if mems.size
                             else 0.0)
    return deltas


def table(rows):
    lines = ["| case | NLL max |Δ| (max NLL) | loss |Δ| | memories max |Δ| |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['nll']:.1e} ({r['nll_scale']:.1f}) | {r['loss']:.1e} "
                     f"| {r['mems']:.1e} |")
    return "\n".join(lines)


def main(argv):
    del argv
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    if not o["ref_dir"]:
        print("tf_parity: skipped (no --ref_dir: pass the paper's tf/ folder to run it)")
        return
    ref_dir = os.path.abspath(o["ref_dir"])
    if not os.path.isfile(os.path.join(ref_dir, "model.py")):
        from benchmarks.common import BenchmarkError
        raise BenchmarkError(f"--ref_dir={o['ref_dir']} has no model.py (pass the tf/ folder "
                             "of kimiyoung/transformer-xl)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([sys.executable, os.path.abspath(__file__), "paper_stage", ref_dir, tmp],
                       check=True, env=env)
        rows = [{"case": name, **compare_case(os.path.join(tmp, str(c)), case)}
                for c, (name, case) in enumerate(CASES.items())]
    print(table(rows))
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"sizes": SIZES, "batch": BATCH, "segments": SEGMENTS,
                   "cases": {name: flags_of(case) for name, case in CASES.items()},
                   "rows": rows}, f, indent=2)
    print(f"wrote {o['output']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["paper_stage"]:  # run by main() in a graph-mode child
        paper_stage(*sys.argv[2:4])
    else:
        from txl_tf.app import cli
        cli.run(main, SPEC)
