"""Exports a txl_tf model directory to a SavedModel and/or an ONNX model.

    python -m export --model_dir=DIR --output_dir=OUT [--formats=saved_model,onnx]
        [--mem_len=N] [--opset=17] [--log_probs=all|last] [--config=... --weights=...]
"""
from absl import app, flags

from export import job

if __name__ == "__main__":
    job.define_flags(flags.FLAGS)
    flags.adopt_module_key_flags(job)  # list the job's flags under --help
    app.run(job.main)
