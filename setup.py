"""Transformer-XL for TensorFlow 2 / Keras 3, with SavedModel and ONNX export."""
import re
from pathlib import Path

from setuptools import find_packages, setup

# One version, txl_tf.__version__ (read, not imported: importing txl_tf imports
# TensorFlow); CHANGELOG.md's newest release names it too.
VERSION = re.search(r'^__version__ = "(.+)"$',
                    Path(__file__).with_name("txl_tf").joinpath("__init__.py").read_text(),
                    re.M).group(1)

setup(
    name="txl_tf",
    version=VERSION,
    description="Transformer-XL for TensorFlow 2 / Keras 3 with an export pipeline",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",  # as the paper's code and TensorFlow
    license_files=["LICENSE"],
    python_requires=">=3.11",  # keras 3.15 and keras-hub 0.32 need it
    packages=find_packages(include=["txl_tf", "txl_tf.*", "training", "training.configs",
                                    "export"]),
    package_data={"training.configs": ["*.cfg"],
                  "txl_tf.weights": ["shipped/*/*.json", "shipped/*/*.npz", "shipped/*/*.md",
                                     "shipped/*/vocab/*"]},
    # Installed commands: unlike `python -m training.train`, which imports
    # `training` from the working directory first, these cannot be shadowed
    # by a user's own `training/` or `export/` folder.
    entry_points={"console_scripts": [
        "txl-train = training.train:console",
        "txl-train-lstm = training.train_lstm:console",
        "txl-evaluate = training.evaluate:console",
        "txl-generate = training.generate:console",
        "txl-classify = training.classify:console",
        "txl-demo = training.demo:console",
        "txl-attention = training.attention_picture:console",
        "txl-recl = training.recl:console",
        "txl-export = export.__main__:console",
        "txl-convert = txl_tf.weights.convert:console",
        "txl-configs = training.configs.__main__:console",
    ]},
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "keras>=3.15,<3.16",
        "keras-hub>=0.32,<0.33",
        # 2.21.0's wheel fails to import (undefined symbol icudt77_dat), and
        # `import txl_tf` with it: 2.21.1 is the first that loads.
        "tensorflow-text>=2.21.1,<2.22",
        "tf2onnx>=1.17,<1.18",
        "onnx>=1.17",
        "absl-py>=2.5,<2.6",
        "numpy>=1.26,<3",
        "sentencepiece>=0.2,<0.3",
        "tqdm>=4.66",
        "tensorboard>=2.21,<2.22",
        "safetensors>=0.4,<1",
    ],
    # onnxruntime and onnxruntime-gpu both provide the `onnxruntime` module:
    # install exactly one of the `cpu` and `gpu` extras.
    extras_require={
        "cpu": ["onnxruntime>=1.31,<1.32"],
        # TensorFlow's CUDA wheels (its own `and-cuda` extra), the ptxas XLA
        # accepts for Hopper (CUDA 12.6.3's is the wheel 12.6.85; the and-cuda
        # floor, 12.5.82, is older) and onnxruntime-gpu.
        "gpu": ["tensorflow[and-cuda]>=2.21,<2.22", "nvidia-cuda-nvcc-cu12>=12.6.85",
                "onnxruntime-gpu>=1.31,<1.32"],
        # Only to read PyTorch .bin/.pt state dicts (safetensors need no torch).
        # 2.3: torch 2.1 and 2.2 were built for numpy 1, and beside numpy 2
        # cannot hand a tensor to numpy ("Numpy is not available").
        "torch": ["torch>=2.3"],
        "bench": ["matplotlib>=3.8"],  # the benchmarks' PNG plots
        "viz": ["matplotlib>=3.8"],  # attention pictures (txl_tf.classification.attention_picture)
        # tritonclient: its model-config protobuf parses the Triton config in the tests
        # (2.73 pins protobuf < 7 and ml-dtypes <= 0.5.4, both inside TF 2.21's ranges).
        # sympy: onnxruntime's symbolic_shape_infer, which tests/test_shape_inference.py runs.
        "test": ["onnxruntime>=1.31,<1.32", "pytest>=8", "pytest-xdist>=3.5",
                 "tritonclient[grpc]>=2.73,<3", "matplotlib>=3.8", "sympy>=1.13"],
    },
)
