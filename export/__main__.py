"""Exports a txl_tf model directory to a SavedModel, an ONNX model and/or a
Triton model repository.

    python -m export --model_dir=DIR --output_dir=OUT [--formats=saved_model,onnx,triton]
        [--mem_len=N] [--opset=17] [--log_probs=all|last] [--config=... --weights=...]
        [--triton_model_name=txl] [--triton_max_batch_size=16]

`DIR` is a model directory or a training run directory. Bad input ends in
one `error:` line on stderr and exit status 2 (`txl_tf.app.cli`).
"""
import os

# TensorFlow's oneDNN CPU allocator keeps every freed buffer for reuse and never
# gives it back: the job would hold on to the largest transient copies of the
# weights while onnxruntime loads its own. Read when TensorFlow starts, which
# importing txl_tf (below) does.
os.environ.setdefault("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", "1")

from txl_tf.app import cli  # noqa: E402

from export import job  # noqa: E402


def console():
    """The job (`python -m export`, or the installed `txl-export`)."""
    cli.run(job.main, job.SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
