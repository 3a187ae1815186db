"""`python -m benchmarks.long_memory --part=onnx_weights` carries an export's graphs without
its weights and refills them: the skeleton is small, and filled it opens and
decodes like an export (the way the GPU timings were taken)."""

import numpy as np
import onnx

from export import open_runtime, run_export
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.weights import save_pretrained

CONFIG = TransformerXLConfig.preset("tiny", n_token=3000, mem_len=6, d_model=64, d_inner=128)




def test_a_skeleton_is_small_and_fills_into_a_working_export(tmp_path, jobs):
    save_pretrained(TransformerXL(CONFIG), tmp_path / "model")
    # Parity is not the point (test_export_job.py checks it): the skeleton's round trip is.
    run_export(str(tmp_path / "out"), str(tmp_path / "model"), formats=("onnx",), verify=False)
    skeleton = tmp_path / "skeleton"
    jobs.run("benchmarks.long_memory", ["--part=onnx_weights", f"--export_dir={tmp_path / 'out'}",
                                        f"--skeleton_dir={skeleton}"], check=True)
    assert {p.name for p in skeleton.glob("*.onnx")} == \
        {"model.onnx", "decode_init.onnx", "decode_step.onnx", "decode_read.onnx"}
    def size(folder):  # the graphs and any external weights file
        return sum(p.stat().st_size for p in folder.iterdir() if ".onnx" in p.name)
    assert size(skeleton) * 2 < size(tmp_path / "out")
    assert not list(skeleton.glob("*.data"))
    for name in ("model.onnx", "decode_step.onnx"):
        marked = [t for t in onnx.load(str(skeleton / name)).graph.initializer
                  if t.doc_string == "txl_tf:random"]
        assert marked and not any(t.raw_data for t in marked)
    jobs.run("benchmarks.long_memory", ["--part=onnx_weights", "--fill",
                                        f"--skeleton_dir={skeleton}"], check=True)
    runtime = open_runtime(str(skeleton), device="cpu")
    assert runtime.mem_len == CONFIG.mem_len and runtime.has_decode_cache
    out = runtime.generate([[1, 2, 3]], 8, temperature=0.0)
    assert out.ids.shape == (1, 8) and np.isfinite(out.log_probs).all()
