"""`TokenNLL`: token-weighted NLL as nats, bits per token or perplexity."""
import math

import numpy as np
import pytest

from txl_tf.errors import TxlError
from txl_tf.learning.metrics import TokenNLL


def test_each_kind_is_the_weighted_mean_and_survives_its_config():
    nll, weight = np.array([[1.0, 3.0], [2.0, 7.0]]), np.array([[1.0, 1.0], [1.0, 0.0]])
    mean = 2.0  # (1 + 3 + 2) / 3: the padded 7 counts for nothing
    for kind, want in (("nll", mean), ("bpc", mean / math.log(2)), ("ppl", math.exp(mean))):
        metric = TokenNLL(kind)
        metric.update_state(nll, sample_weight=weight)
        assert float(metric.result()) == pytest.approx(want, rel=1e-6)
        again = TokenNLL.from_config(metric.get_config())
        assert (again.kind, again.name) == (kind, kind)
    assert float(TokenNLL("ppl").result()) == 1.0  # no tokens: a mean NLL of 0
    with pytest.raises(TxlError, match=r"^kind must be one of \('nll', 'bpc', 'ppl'\), got "
                                       r"'acc'$"):
        TokenNLL("acc")
