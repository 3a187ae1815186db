"""The Keras Model API a user tries first, on the public models: `summary`,
`export`, symbolic calls, `fit` options; each gives Keras's behaviour or one
clear error naming the limitation."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from txl_tf import TransformerXLClassifier, TransformerXLConfig

N_TOKEN, T, B = 40, 4, 2


def config():
    return TransformerXLConfig.preset("tiny", n_token=N_TOKEN, tgt_len=T, mem_len=T, dropout=0.0)


def test_the_classifier_summary_lists_its_layers_before_any_call(capsys):
    """Its head dropout was built on no shape, which Keras's summary could
    not print (a TypeError)."""
    model = TransformerXLClassifier(config(), num_classes=3)
    model.summary(expand_nested=True)
    out = capsys.readouterr().out
    assert "head_dropout" in out and "classifier" in out
    assert "Total params: {:,}".format(model.count_params()) in out


def test_the_classifiers_keras_export_serves_its_logits(tmp_path):
    """`model.export(path)` (Keras's SavedModel) needs no `input_signature`:
    Keras looks for the shapes of a first call, which a model built at
    construction never records ("The model provided has never called")."""
    model = TransformerXLClassifier(config(), num_classes=3, segment_len=3)
    inputs = {"token_ids": np.random.default_rng(0).integers(0, N_TOKEN, (3, 7)).astype(np.int32),
              "lengths": np.array([7, 2, 5], np.int32)}
    model(inputs)
    model.export(str(tmp_path / "saved"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_allclose(served.serve(inputs).numpy(), model.predict(inputs, verbose=0),
                               atol=1e-5)
