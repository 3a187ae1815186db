"""The private-Keras workarounds: version guard and the global-step TensorBoard."""
import glob
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from training.callbacks import GlobalStepTensorBoard
from txl_tf import TransformerXLConfig, TransformerXLLM
from txl_tf.keras_support.keras_compat import check_keras_version


def test_version_guard_raises_on_another_major_and_warns_on_another_minor():
    with pytest.raises(ImportError, match="Keras 3.x"):
        check_keras_version("4.0.0")
    with pytest.warns(UserWarning, match="written for Keras 3.15, found 3.16.0"):
        check_keras_version("3.16.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_keras_version("3.15.7")


def test_resumed_fit_logs_batches_at_the_global_step(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = TransformerXLConfig.preset("tiny", tgt_len=4, mem_len=4)
    model = TransformerXLLM(cfg, batch_size=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(5)  # as if restored from a checkpoint at step 5
    x = np.random.default_rng(0).integers(0, 256, (4, 4)).astype(np.int32)
    model.fit(x, x, batch_size=2, verbose=0,
              callbacks=[GlobalStepTensorBoard(log_dir=str(tmp_path), update_freq=1)])
    steps = []
    for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps += [event.step for v in event.summary.value if v.tag == "batch_loss"]
    assert sorted(steps) == [6, 7]
