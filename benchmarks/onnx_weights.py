r"""Carries an ONNX export to a machine without TensorFlow, for timing.

    python -m benchmarks.onnx_weights --export_dir=EXPORT_DIR --skeleton_dir=SKELETON_DIR
    python -m benchmarks.onnx_weights --fill --skeleton_dir=SKELETON_DIR [--seed=0]

`strip` writes every `.onnx` file of an export with its large float weights
emptied (shapes and names kept, marked `txl_tf:random`) beside the export's
JSON files: megabytes instead of gigabytes. `fill` gives those weights
random values (normal, std 0.02, seeded) in place. The graphs are the
export's, so a runtime times the same work; the numbers they compute are
a random model's. `bench_long_memory --reuse_exports` then times them where
only onnxruntime is installed (the GPU machine, where TensorFlow cannot be).
"""
import glob
import os
import shutil
import sys

import numpy as np


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402
from txl_tf.errors import TxlError  # noqa: E402

MARK = "txl_tf:random"
MIN_ELEMENTS = 4096  # smaller weights (and every integer constant) are kept

SPEC = (
    option("string", "export_dir", None, "The export to strip (its .onnx and .json files)."),
    option("string", "skeleton_dir", None, "Where the skeleton goes (strip) or is (fill)."),
    option("bool", "fill", False, "Fill the skeleton's weights instead of stripping."),
    option("integer", "seed", 0, "Seed of the random weights (fill)."),
)


def strip(export_dir, skeleton_dir):
    """Writes the skeleton of `export_dir` into `skeleton_dir`; returns its files."""
    import onnx
    files = sorted(glob.glob(os.path.join(export_dir, "*.onnx")))
    if not files:
        raise TxlError(f"no .onnx files in {export_dir}")
    os.makedirs(skeleton_dir, exist_ok=True)
    written = []
    for path in files:
        model = onnx.load(path)
        for tensor in model.graph.initializer:
            if tensor.data_type == onnx.TensorProto.FLOAT and \
                    int(np.prod(tensor.dims, dtype=np.int64)) >= MIN_ELEMENTS:
                tensor.ClearField("raw_data")
                tensor.ClearField("float_data")
                tensor.doc_string = MARK
        target = os.path.join(skeleton_dir, os.path.basename(path))
        onnx.save(model, target)
        written.append(target)
    for path in glob.glob(os.path.join(export_dir, "*.json")):
        shutil.copy(path, skeleton_dir)
    return written


def fill(skeleton_dir, seed=0):
    """Gives the marked weights of every `.onnx` file in `skeleton_dir`
    random values, in place; returns the number of weights filled."""
    import onnx
    rng = np.random.default_rng(seed)
    filled = 0
    for path in sorted(glob.glob(os.path.join(skeleton_dir, "*.onnx"))):
        model = onnx.load(path)
        for tensor in model.graph.initializer:
            if tensor.doc_string == MARK:
                values = rng.normal(0, 0.02, size=tuple(tensor.dims)).astype(np.float32)
                tensor.raw_data = values.tobytes()
                tensor.doc_string = ""
                filled += 1
        onnx.save(model, path)
    return filled


def run(o):
    if not o["skeleton_dir"]:
        raise TxlError("--skeleton_dir is required")
    if o["fill"]:
        print(f"filled {fill(o['skeleton_dir'], o['seed'])} weights in {o['skeleton_dir']}")
    elif not o["export_dir"]:
        raise TxlError("--export_dir is required (or --fill)")
    else:
        written = strip(o["export_dir"], o["skeleton_dir"])
        print(f"wrote {len(written)} skeleton files to {o['skeleton_dir']}")


def main(argv):
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
