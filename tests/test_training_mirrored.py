"""The training job on 2 replicas (MirroredStrategy over the 2 logical CPUs of
tests/conftest.py) trains like 1 replica with the same global batch (where
one replica runs 2 steps per call, which Keras cannot do on several), and
leaves no input iterator to a later garbage collection."""
import gc
import json

import numpy as np
import tensorflow as tf

from training import train
from job_helpers import write_text_corpus


def _input_iterators():
    """Ids of the tf.data iterator objects alive or awaiting collection."""
    return {id(o) for o in gc.get_objects()
            if type(o).__name__ in ("OwnedIterator", "OwnedMultiDeviceIterator")}


def _run(tmp_path, name, strategy):
    before = _input_iterators()
    result = train.run(
        model_dir=str(tmp_path / name), dataset="text", data_dir=str(tmp_path / "corpus.txt"),
        cache_dir=str(tmp_path / "cache"), preset="tiny", batch_size=4, train_steps=4,
        checkpoint_every=2, final_eval=False, verbose=0, learning_rate=0.01, seed=1,
        strategy=strategy, mixed_precision="none",  # float32 whatever the CPU: compared at 2e-5
        log_every=2)  # 2 steps per call on one replica; several replicas take 1
    assert not _input_iterators() - before, "the job left its input iterators to a later gc"
    assert result["steps_per_execution"] == (2 if strategy == "one_device" else 1)
    with open(tmp_path / name / "train_log.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["loss"] for line in f]


def test_two_replicas_match_one(tmp_path):
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "tests/conftest.py splits the CPU"
    write_text_corpus(tmp_path / "corpus.txt", 20_000, seed=3)
    one = _run(tmp_path, "one", "one_device")
    two = _run(tmp_path, "two", "mirrored")
    np.testing.assert_allclose(two, one, rtol=2e-5, atol=2e-5)
    assert one[-1] < one[0]
    for name in ("one", "two"):  # TensorBoard event files for training and validation
        assert list((tmp_path / name / "logs" / "train").glob("events.out.tfevents.*")), name
    with np.load(tmp_path / "one" / "export" / "weights.npz") as a, \
            np.load(tmp_path / "two" / "export" / "weights.npz") as b:
        for name in a.files:
            np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=2e-5, err_msg=name)
