"""`benchmarks/tf_parity.py` without the paper's code: its TF 1 stand-ins (names
and semantics of `tf.layers.dense` and `tf.contrib.layers.layer_norm`), how it
loads a `model.py`, its cases' configs, its comparison and its skip line."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import tf_parity
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights.checkpoints import get_weights


def test_the_stand_ins_name_and_compute_as_tf1():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 5)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf_parity.v1_namespace()
        with v1.variable_scope("layer_0"):
            with v1.variable_scope("ff"):
                hidden = v1.layers.dense(tf.constant(x), 4, activation=tf.nn.relu,
                                         kernel_initializer=v1.random_normal_initializer(),
                                         name="layer_1")
                normed = v1.contrib.layers.layer_norm(hidden, begin_norm_axis=-1)
        assert v1.layers.dropout(hidden, 0.5, training=False) is hidden
        names = sorted(v.op.name for v in v1.global_variables())
        assert names == ["layer_0/ff/LayerNorm/beta", "layer_0/ff/LayerNorm/gamma",
                         "layer_0/ff/layer_1/bias", "layer_0/ff/layer_1/kernel"]
        gamma = rng.normal(size=4).astype(np.float32)
        beta = rng.normal(size=4).astype(np.float32)
        bias = rng.normal(size=4).astype(np.float32)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            variables = {v.op.name: v for v in v1.global_variables()}
            variables["layer_0/ff/LayerNorm/gamma"].load(gamma, sess)
            variables["layer_0/ff/LayerNorm/beta"].load(beta, sess)
            variables["layer_0/ff/layer_1/bias"].load(bias, sess)
            kernel = sess.run(variables["layer_0/ff/layer_1/kernel"])
            got_hidden, got = sess.run([hidden, normed])
    want_hidden = np.maximum(x @ kernel + bias, 0)
    np.testing.assert_allclose(got_hidden, want_hidden, rtol=1e-5, atol=1e-6)
    mean = want_hidden.mean(-1, keepdims=True)
    var = want_hidden.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (want_hidden - mean) / np.sqrt(var + 1e-12) * gamma + beta,
                               rtol=1e-4, atol=1e-4)


def test_loads_a_model_py_with_tf_set_to_the_stand_ins(tmp_path):
    ref = tmp_path / "tf"
    ref.mkdir()
    (ref / "model.py").write_text("import tensorflow as tf\n\n\ndef norm():\n"
                                  "  return tf.contrib.layers.layer_norm\n")
    work = tmp_path / "work"
    work.mkdir()
    module = tf_parity.load_paper_model(str(ref), str(work))
    assert module.norm().__name__ == "layer_norm"
    assert "import tensorflow" not in (work / "paper_tf_model.py").read_text()
    (ref / "model.py").write_text("import numpy as np\n")
    with pytest.raises(SystemExit, match="^error: .* does not start with 'import tensorflow"):
        tf_parity.load_paper_model(str(ref), str(work))
    with pytest.raises(SystemExit, match="^error: .* has no model.py"):
        tf_parity.load_paper_model(str(work), str(work))


def test_every_case_is_a_config_with_train_gpus_tie_projs():
    assert tf_parity.tie_projs({"cutoffs": [5, 9], "proj_share_all_but_first": True}) == \
        [False, True, True]
    assert tf_parity.tie_projs({"cutoffs": [5], "proj_share_all_but_first": False}) == \
        [False, False]
    for case in tf_parity.CASES.values():
        cfg = TransformerXLConfig(**tf_parity.txl_config(case))
        assert cfg.dropout == 0.0 and cfg.n_layer == tf_parity.SIZES["n_layer"]


def paper_like_run(folder, case, perturb=0.0):
    """What the paper's stage writes, made by a txl_tf core with `case`'s config."""
    cfg = TransformerXLConfig(**tf_parity.txl_config(case), zero_filled_memory=True)
    core = TransformerXL(cfg)
    rng = np.random.default_rng(0)
    for var in core.weights:
        var.assign(rng.normal(0, 0.3, var.shape).astype(np.float32))
    variables = {k: tf.Variable(v) for k, v in get_weights(core).items()}
    os.makedirs(folder)
    tf.compat.v1.train.Saver(var_list=variables).save(None, os.path.join(folder, "model.ckpt"))
    batch, segments, tgt_len = tf_parity.BATCH, tf_parity.SEGMENTS, cfg.tgt_len
    ids = rng.integers(0, cfg.n_token, (segments, tgt_len + 1, batch))  # time-major
    memory, out = core.initial_memory(batch), {"ids": ids}
    for s in range(segments):
        x = ids[s].T
        nll, memory = core(x[:, :-1], memory, targets=x[:, 1:])
        out[f"nll/{s}"] = nll.numpy().T + perturb
        out[f"loss/{s}"] = nll.numpy().mean()
        out[f"mems/{s}"] = memory.mems.numpy().transpose(0, 2, 1, 3)
    np.savez(os.path.join(folder, "run.npz"), **out)
    names = {k: list(v.shape) for k, v in get_weights(core).items()}
    with open(os.path.join(folder, "variables.json"), "w", encoding="utf-8") as f:
        json.dump(names, f)


def test_compares_in_the_tf_codes_time_major_layout(tmp_path):
    case = tf_parity.CASES["div_val 1, shared projs"]
    paper_like_run(str(tmp_path / "same"), case)
    deltas = tf_parity.compare_case(str(tmp_path / "same"), case)
    assert deltas["nll"] < 1e-5 and deltas["mems"] < 1e-5 and deltas["nll_scale"] > 1
    paper_like_run(str(tmp_path / "off"), case, perturb=1e-3)
    assert tf_parity.compare_case(str(tmp_path / "off"), case)["nll"] > 5e-4
    assert tf_parity.table([{"case": "x", **deltas}]).splitlines()[2].startswith("| x | ")
    with open(tmp_path / "same" / "variables.json", "w", encoding="utf-8") as f:
        json.dump({**names_of(case), "transformer/r_w_bias/extra": [2, 8]}, f)
    with pytest.raises(AssertionError, match=r"read \['transformer/r_w_bias/extra'\]"):
        tf_parity.compare_case(str(tmp_path / "same"), case)


def names_of(case):
    core = TransformerXL(TransformerXLConfig(**tf_parity.txl_config(case)))
    return {k: list(v.shape) for k, v in get_weights(core).items()}


def test_without_ref_dir_it_says_it_was_skipped(jobs, tmp_path):
    done = jobs.run("benchmarks.tf_parity", [f"--output={tmp_path / 'out.json'}"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == [
        "tf_parity: skipped (no --ref_dir: pass the paper's tf/ folder to run it)"]
    assert not (tmp_path / "out.json").exists()


def test_the_recorded_results_are_float32_round_off():
    path = os.path.join(os.path.dirname(tf_parity.__file__), "results", "tf_parity.json")
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    assert [r["case"] for r in rows] == list(tf_parity.CASES)
    assert max(max(r["nll"], r["loss"], r["mems"]) for r in rows) < 1e-5
