"""`needs_bfloat16_matmuls`: a mark for tests that compute in bfloat16.

Under `ONEDNN_MAX_CPU_ISA=AVX2` on a CPU with native bfloat16 (how
docs/training.md reproduces an AVX2 machine's round-off), TensorFlow still
sends bfloat16 matmuls to oneDNN, which has no kernel for them under the
cap: the process aborts (`txl_tf.keras_support.precision.bfloat16_would_abort`).
Those tests are skipped there, with the reason; a real AVX2 machine emulates
bfloat16 and runs them, as does every uncapped CPU.
"""
import pytest

from txl_tf.keras_support.precision import bfloat16_would_abort

_WHY = bfloat16_would_abort()

needs_bfloat16_matmuls = pytest.mark.skipif(
    bool(_WHY), reason=f"bfloat16 matmuls would abort this process: {_WHY}")
