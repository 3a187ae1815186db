"""`benchmarks/onnx_weights.py` carries an export's graphs without its
weights and refills them: the skeleton is small, and filled it opens and
decodes like an export (the way the GPU timings were taken)."""
import shutil
import subprocess
import sys

import numpy as np
import onnx

from benchmarks.onnx_weights import MARK, fill, strip
from export import open_runtime, run_export
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained

CONFIG = TransformerXLConfig.preset("tiny", n_token=3000, mem_len=6, d_model=64, d_inner=128)


def test_a_skeleton_is_small_and_fills_into_a_working_export(tmp_path):
    save_pretrained(TransformerXL(CONFIG), tmp_path / "model")
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=("onnx",))
    written = strip(str(tmp_path / "out"), str(tmp_path / "skeleton"))
    assert {p.rsplit("/", 1)[-1] for p in written} == \
        {"model.onnx", "decode_init.onnx", "decode_step.onnx", "decode_read.onnx"}
    for name in ("model.onnx", "decode_step.onnx"):
        full, bare = (tmp_path / d / name for d in ("out", "skeleton"))
        assert bare.stat().st_size * 4 < full.stat().st_size
        marked = [t for t in onnx.load(str(bare)).graph.initializer if t.doc_string == MARK]
        assert marked and not any(t.raw_data for t in marked)
    assert fill(str(tmp_path / "skeleton"), seed=1) > 0
    runtime = open_runtime(str(tmp_path / "skeleton"), device="cpu")
    assert runtime.mem_len == CONFIG.mem_len and runtime.has_decode_cache
    out = runtime.generate([[1, 2, 3]], 8, temperature=0.0)
    assert out.ids.shape == (1, 8) and np.isfinite(out.log_probs).all()
    # The command line does the same.
    shutil.rmtree(tmp_path / "skeleton")
    for flags in ([f"--export_dir={tmp_path / 'out'}"], ["--fill"]):
        done = subprocess.run([sys.executable, "-m", "benchmarks.onnx_weights", *flags,
                               f"--skeleton_dir={tmp_path / 'skeleton'}"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    assert open_runtime(str(tmp_path / "skeleton"), device="cpu").generate(
        [[4]], 3, temperature=0.0).ids.shape == (1, 3)
