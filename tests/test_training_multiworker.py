"""Two MultiWorkerMirroredStrategy workers (processes on localhost, CPU) train
like one process with the same global batch: same losses step by step, same
final weights (dropout 0, gradient clip active)."""
import json
import os
import subprocess

import numpy as np

from job_helpers import free_port, job_command, job_env, tail, write_text_corpus

STEPS = 6


def _args(tmp_path, model_dir, strategy):
    return [f"--model_dir={model_dir}", "--dataset=text",
            f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
            "--preset=tiny", "--batch_size=4", f"--train_steps={STEPS}",
            "--checkpoint_every=3", "--log_every=1", "--nofinal_eval", "--verbose=0",
            "--learning_rate=0.01", "--clip=0.25", "--seed=0", f"--strategy={strategy}",
            "--mixed_precision=none"]  # float32 whatever the CPU: compared at 1e-4


def _losses(model_dir):
    with open(os.path.join(model_dir, "train_log.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_two_workers_match_one_process(tmp_path):
    write_text_corpus(tmp_path / "corpus.txt", 30_000, seed=2)
    ports = [free_port(), free_port()]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    jobs = {}
    scratch = tmp_path / "tmp"  # the workers' temporary folder
    scratch.mkdir()
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        jobs[f"worker {index}"] = subprocess.Popen(
            job_command("training.train", _args(tmp_path, tmp_path / "multi", "multi_worker")),
            env=job_env(TF_CONFIG=tf_config, TMPDIR=str(scratch)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
    jobs["single"] = subprocess.Popen(
        job_command("training.train", _args(tmp_path, tmp_path / "single", "one_device")),
        env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = {}
    try:
        for name, job in jobs.items():
            outputs[name] = job.communicate(timeout=300)[0]
    finally:
        for job in jobs.values():
            if job.poll() is None:
                job.kill()
    failed = {n: j.returncode for n, j in jobs.items() if j.returncode != 0}
    assert not failed, f"jobs failed: {failed}\n" + "\n".join(
        f"--- {n} ---\n{tail(outputs.get(n, ''), 25)}" for n in jobs)
    assert "CollectiveAllReduceStrategy with 2 replica(s) x batch 2" in outputs["worker 0"]
    assert not list(scratch.glob("txl-worker*")), "a worker left its TensorBoard logs"

    multi, single = _losses(tmp_path / "multi"), _losses(tmp_path / "single")
    assert [r["step"] for r in multi] == [r["step"] for r in single] == list(range(1, STEPS + 1))
    for key in ("loss", "lr"):
        np.testing.assert_allclose([r[key] for r in multi], [r[key] for r in single],
                                   rtol=2e-5, atol=2e-5, err_msg=key)
    assert single[-1]["loss"] < single[0]["loss"] - 0.2, "the runs did not train"

    # Each worker checkpoints its own replica's memory; the chief exports.
    assert (tmp_path / "multi" / "checkpoints" / "worker-1" / "checkpoint").exists()
    with np.load(tmp_path / "multi" / "export" / "weights.npz") as a, \
            np.load(tmp_path / "single" / "export" / "weights.npz") as b:
        for name in b.files:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=2e-5, err_msg=name)
