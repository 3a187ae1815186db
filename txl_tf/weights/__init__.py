"""Weights in and out: model directories (`config.json` + `weights.npz` +
`vocab/`), the paper's TF checkpoints, PyTorch state dicts, and the converter.

    from txl_tf import weights
    weights.save_pretrained(core, "model_dir", tokenizer)
    core = weights.load_pretrained("model_dir", clamp_len=400, same_length=True)
    core = weights.import_tf_checkpoint("model.ckpt-400000", config)
    core = weights.import_pytorch("pytorch_model.bin")
"""
from txl_tf.weights.checkpoints import get_weights, import_tf_checkpoint, set_weights
from txl_tf.weights.model_dir import load_pretrained, save_pretrained
from txl_tf.weights.pytorch_import import import_pytorch

__all__ = ["get_weights", "import_pytorch", "import_tf_checkpoint", "load_pretrained",
           "save_pretrained", "set_weights"]
