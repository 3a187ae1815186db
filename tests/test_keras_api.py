"""The Keras Model API a user tries first, on the public models: `summary`,
`export`, symbolic calls, `fit` options; each gives Keras's behaviour or one
clear error naming the limitation."""
import keras
import numpy as np
import pytest

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
