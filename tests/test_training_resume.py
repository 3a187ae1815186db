"""A training job killed (SIGKILL) after a checkpoint and restarted ends exactly
where an uninterrupted job ends: same batches at the same steps, same weights."""
import json
import os
import re
import signal
import subprocess
import time

import numpy as np

from job_helpers import job_command, job_env, tail, write_text_corpus

STEPS, EVERY = 100, 20


def _args(tmp_path, model_dir):
    return [f"--model_dir={model_dir}", "--dataset=text",
            f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
            "--preset=tiny", "--batch_size=4", f"--train_steps={STEPS}",
            f"--checkpoint_every={EVERY}", "--log_every=1", "--log_batches", "--nofinal_eval",
            "--strategy=one_device", "--verbose=0", "--learning_rate=0.001",
            "--warmup_steps=10", "--seed=3", "--mixed_precision=none"]


def _batches(model_dir):
    with open(os.path.join(model_dir, "batches.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_killed_job_resumes_at_its_checkpoint(tmp_path, jobs):
    write_text_corpus(tmp_path / "corpus.txt", 40_000, seed=1)
    full, broken = tmp_path / "full", tmp_path / "broken"
    first = subprocess.Popen(job_command("training.train", _args(tmp_path, broken)),
                             env=job_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    state = broken / "checkpoints" / "checkpoint"
    deadline = time.time() + 300
    while not state.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first_out = first.communicate(timeout=60)[0]
    assert first.returncode == -signal.SIGKILL, (
        f"the job was not killed mid-run (exit {first.returncode}):\n{tail(first_out)}")
    assert not (broken / "export").exists(), "the killed job got to the end"

    second = jobs.run("training.train", _args(tmp_path, broken), check=True)
    found = re.search(r"resumed from \S+ckpt-(\d+) at step (\d+)", second.stdout)
    assert found, f"no resume line:\n{tail(second.stdout)}"
    resumed = int(found.group(2))
    assert resumed == int(found.group(1)) and resumed % EVERY == 0 and 0 < resumed < STEPS

    jobs.run("training.train", _args(tmp_path, full), check=True)  # the uninterrupted run

    expected = {b["step"]: b["first_ids"] for b in _batches(full)}
    assert sorted(expected)[:STEPS] == list(range(STEPS))
    log = _batches(broken)
    pids = list(dict.fromkeys(b["pid"] for b in log))
    assert len(pids) == 2, f"expected batches from 2 processes, got {len(pids)}"
    before = [b for b in log if b["pid"] == pids[0]]
    after = [b for b in log if b["pid"] == pids[1]]
    # The restarted job starts its data exactly at the checkpoint's step...
    assert after[0]["step"] == resumed
    after_steps = [b["step"] for b in after]
    assert after_steps[:STEPS - resumed] == list(range(resumed, STEPS))
    # ...the killed job had fed every step before it, in order...
    assert [b["step"] for b in before][:resumed] == list(range(resumed))
    # ...so steps 0..STEPS-1 were trained once each, on the reference's batches.
    trained = before[:resumed] + after[:STEPS - resumed]
    assert [b["step"] for b in trained] == list(range(STEPS))
    for b in trained:
        assert b["first_ids"] == expected[b["step"]], f"step {b['step']} got another batch"

    # The lines the killed job logged past its checkpoint were dropped: each
    # step once, as in the uninterrupted run's log.
    with open(broken / "train_log.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, STEPS + 1))
    with np.load(full / "export" / "weights.npz") as a, \
            np.load(broken / "export" / "weights.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, jobs):
    write_text_corpus(tmp_path / "corpus.txt", 20_000, seed=4)
    run = tmp_path / "run"
    args = [f"--model_dir={run}", "--dataset=text", f"--data_dir={tmp_path / 'corpus.txt'}",
            f"--cache_dir={tmp_path / 'cache'}", "--preset=tiny", "--batch_size=4",
            "--train_steps=30", "--checkpoint_every=10", "--log_every=1", "--nofinal_eval",
            "--strategy=one_device", "--verbose=0", "--learning_rate=0.003", "--seed=5"]
    jobs.run("training.train", args, check=True)
    with np.load(run / "export" / "weights.npz") as f:
        uninterrupted = {name: f[name] for name in f.files}
    checkpoints = run / "checkpoints"
    newest = next(checkpoints.glob("ckpt-30.data-*"))
    newest.write_bytes(newest.read_bytes()[:len(newest.read_bytes()) // 2])  # truncated
    (checkpoints / "ckpt-40_temp").mkdir()  # what a kill during a save leaves
    (checkpoints / "ckpt-40_temp" / "part-00000-of-00001.index").write_bytes(b"\0")
    (checkpoints / "checkpoint.tmp5f3a").write_text("partial")

    second = jobs.run("training.train", args, check=True)
    assert re.search(r"warning: checkpoint \S+ckpt-30 cannot be restored .*trying the "
                     r"previous one", second.stderr), tail(second.stderr)
    assert re.search(r"resumed from \S+ckpt-20 at step 20", second.stdout), tail(second.stdout)
    assert not list(checkpoints.glob("*tmp*")) and not list(checkpoints.glob("*_temp*"))
    with np.load(run / "export" / "weights.npz") as f:
        for name, value in uninterrupted.items():
            np.testing.assert_allclose(f[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_ctrl_c_checkpoints_the_step_reached_and_resumes_bit_identically(tmp_path, jobs):
    """SIGINT with the next checkpoint far away: the job saves the step it
    reached, says so in one line, exits 130 (the shell's code for SIGINT: the
    run is not finished), and the same command ends with the weights and the
    logged losses of an uninterrupted run."""
    write_text_corpus(tmp_path / "corpus.txt", 20_000, seed=6)

    def args(model_dir):
        return [f"--model_dir={model_dir}", "--dataset=text",
                f"--data_dir={tmp_path / 'corpus.txt'}", f"--cache_dir={tmp_path / 'cache'}",
                "--preset=tiny", "--batch_size=4", "--train_steps=80",
                "--checkpoint_every=70", "--log_every=1", "--nofinal_eval",
                "--strategy=one_device", "--verbose=0", "--learning_rate=0.003", "--seed=2",
                "--mixed_precision=none"]

    jobs.run("training.train", args(tmp_path / "full"), check=True)
    broken = tmp_path / "broken"
    first = subprocess.Popen(job_command("training.train", args(broken)), env=job_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log, deadline, reached = broken / "train_log.jsonl", time.time() + 300, 0
    while reached < 20 and first.poll() is None and time.time() < deadline:
        time.sleep(0.02)
        reached = len(log.read_text().splitlines()) if log.exists() else 0
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 130, f"exit {first.returncode}:\n{tail(out)}\n{tail(err)}"
    found = re.search(r"stopped by SIGINT at step (\d+): saved \S+ckpt-(\d+)", out)
    assert found, tail(out)
    step = int(found.group(1))
    assert int(found.group(2)) == step and 20 <= step < 80
    assert "Traceback" not in err and "Traceback" not in out
    assert "SIGINT: stopping after the step in flight, which is then saved" in err, tail(err)
    assert not (broken / "export").exists()

    second = jobs.run("training.train", args(broken), check=True)
    assert re.search(rf"resumed from \S+ckpt-{step} at step {step}", second.stdout)
    with np.load(tmp_path / "full" / "export" / "weights.npz") as a, \
            np.load(broken / "export" / "weights.npz") as b:
        for name in a.files:
            np.testing.assert_array_equal(b[name], a[name], err_msg=name)
    # The running loss logged after the resume is the uninterrupted run's: the
    # metrics' sums resume from the checkpoint, and they restart at step 70
    # (--checkpoint_every), not at the resumed run's first Keras epoch.
    def logged(model_dir):
        with open(model_dir / "train_log.jsonl", encoding="utf-8") as f:
            return {r["step"]: (r["loss"], r["bpc"], r["ppl"], r["lr"])
                    for r in map(json.loads, f)}
    full_log, broken_log = logged(tmp_path / "full"), logged(broken)
    assert sorted(broken_log) == sorted(full_log) == list(range(1, 81))
    assert broken_log == full_log


def test_checkpoints_hold_the_running_metrics_and_older_ones_still_restore(tmp_path):
    """The running loss sums are in the checkpoint (a run resumed between two
    checkpoints logs what an uninterrupted one logs); a checkpoint written
    before they were (no `metrics/`) restores the rest and leaves them empty."""
    import tensorflow as tf
    from training.checkpointing import TrainingCheckpoint
    from txl_tf import TransformerXLConfig, TransformerXLLM
    from txl_tf.learning.optimizer import ReplicaClippedAdam
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=1)
    optimizer = ReplicaClippedAdam(0.1)
    optimizer.build(model.trainable_variables)
    loss = next(m for m in model.metrics if m.name == "loss")
    loss.update_state(tf.constant([[2.0, 4.0, 6.0]]))
    TrainingCheckpoint(model, optimizer, str(tmp_path / "new"), strategy).save()
    older = TrainingCheckpoint(model, optimizer, str(tmp_path / "old"), strategy)
    tf.train.CheckpointManager(older._without_metrics, str(tmp_path / "old"),
                               max_to_keep=1).save(checkpoint_number=0)
    model.reset_metrics()
    assert float(loss.result()) == 0.0
    TrainingCheckpoint(model, optimizer, str(tmp_path / "new"), strategy).restore_latest()
    assert float(loss.result()) == 4.0 and float(loss.count.numpy()) == 3.0
    model.reset_metrics()
    assert TrainingCheckpoint(model, optimizer, str(tmp_path / "old"), strategy).restore_latest()
    assert float(loss.count.numpy()) == 0.0


def test_each_replica_resumes_its_own_memory_and_metric_sums(tmp_path):
    """Two replicas hold different memories and running sums (their own
    streams): a save and a restore give each replica back its own, not
    replica 0's."""
    import tensorflow as tf
    from training.checkpointing import TrainingCheckpoint
    from training.strategy import mirrored_strategy
    from txl_tf import TransformerXLConfig, TransformerXLLM
    from txl_tf.learning.optimizer import ReplicaClippedAdam
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "tests/conftest.py splits the CPU"
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = TransformerXLLM(TransformerXLConfig.preset("tiny"), batch_size=1)
        optimizer = ReplicaClippedAdam(0.1)
        optimizer.build(model.trainable_variables)
    loss = next(m for m in model.metrics if m.name == "loss")

    def parts(variable):
        return strategy.experimental_local_results(getattr(variable, "value", variable))

    for r, (mem, mask, total) in enumerate(zip(parts(model.mems), parts(model.mem_mask),
                                               parts(loss.total))):
        mem.assign(tf.fill(mem.shape, float(r + 1)))
        mask.assign(tf.fill(mask.shape, float(r + 3)))
        total.assign(float(10 * (r + 1)))
    TrainingCheckpoint(model, optimizer, str(tmp_path), strategy).save()
    for variable in (model.mems, model.mem_mask, loss.total):
        for part in parts(variable):
            part.assign(tf.zeros_like(part))
    TrainingCheckpoint(model, optimizer, str(tmp_path), strategy).restore_latest()
    for r in range(2):
        assert float(tf.reduce_min(parts(model.mems)[r])) == \
            float(tf.reduce_max(parts(model.mems)[r])) == r + 1, f"replica {r}'s memory"
        assert float(tf.reduce_min(parts(model.mem_mask)[r])) == \
            float(tf.reduce_max(parts(model.mem_mask)[r])) == r + 3, f"replica {r}'s mask"
        assert float(parts(loss.total)[r]) == 10 * (r + 1), f"replica {r}'s loss sum"


def test_the_training_input_resumes_at_its_step_and_logs_each_rows_first_id(tmp_path):
    """`training_input` from step 3: the continuous stream (distributed, or
    logged: the log names the global step and each row's first input id)
    and the documents' stream (the layout's step 3, 4, memory resets
    included) start there."""
    import tensorflow as tf
    from training.train_data import training_input
    from txl_tf.data import document_segments, split_documents, segment_dataset
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    ids = np.arange(1, 203, dtype=np.int32)
    log = tmp_path / "batches.jsonl"
    got = [batch[0].numpy() for batch in
           training_input(strategy, ids, 4, 5, start_step=3, batch_log=str(log)).take(2)]
    expected = [batch[0].numpy() for batch in segment_dataset(ids, 4, 5, start_step=3).take(2)]
    np.testing.assert_array_equal(got, expected)
    plain = iter(training_input(strategy, ids, 4, 5, start_step=3))
    for want in expected:  # the distributed stream, no log
        np.testing.assert_array_equal(
            strategy.experimental_local_results(next(plain)[0])[0], want)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    # 4 streams of 50 ids (1, 51, 101, 151 first); step s starts at position 5 s
    assert [(r["step"], r["first_ids"]) for r in records[:2]] == [
        (3, [16, 66, 116, 166]), (4, [21, 71, 121, 171])]
    ids[::7] = 0  # a document ends at every 0
    layout = document_segments(split_documents(ids, 0), 4, 5)
    batches = iter(training_input(strategy, ids, 4, 5, start_step=3, document_separator=0))
    for step in (3, 4):
        inputs, labels, weights = next(batches)
        for got, want in zip((inputs["token_ids"], labels, weights, inputs["document_start"]),
                             layout):
            np.testing.assert_array_equal(strategy.experimental_local_results(got)[0],
                                          want[step], err_msg=f"step {step}")
