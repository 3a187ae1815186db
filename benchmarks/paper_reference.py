r"""The paper's PyTorch code as a same-run baseline (a worker process).

Run by `throughput.py` (both parts) with `--reference_dir`
(the `pytorch/` folder of kimiyoung/transformer-xl) and `--reference_python`
(an interpreter with torch, e.g. a venv made by `pip install torch numpy`).
Nothing of that code is part of txl_tf: this file copies the folder into a
temporary directory and applies the two patches it needs on a current CPU
build of torch there:

1. `utils/proj_adaptive_softmax.py` parses `torch.version.cuda`, which is
   None on a CPU build: read it as "0.0".
2. `mem_transformer.py` builds its attention masks with `.byte()`; current
   torch wants boolean masks: `.bool()`.

Protocol (JSON lines on stdin / stdout, so that the parent can interleave
this worker's steps with its own while the worker waits idle):

    {"setup": {"mode": "train" | "eval", "n_token", "n_layer", "d_model",
               "n_head", "d_head", "d_inner", "dropout", "dropatt",
               "tgt_len", "mem_len", "batch_size", "threads",
               "cutoffs": [...], "device": "cpu" | "cuda",
               "precision": "float32" | "tf32" | "bf16" | "fp16"}} -> {"ok": ...}
    {"run": n}   -> {"seconds": [n per-step seconds], "peak_bytes": int | null}

Training steps do what the paper's `train.py` does per batch: zero_grad,
forward with the memory carried, mean loss, backward, clip the gradient norm
to 0.25, Adam step, cosine scheduler step. Evaluation steps run under
`torch.no_grad()` in eval mode with `reset_length(tgt_len, 0, mem_len)`, as
its `eval.py`. Data: random token ids, time-major `[tgt_len, batch]`.

On `cuda` each step ends with `torch.cuda.synchronize()`; `peak_bytes` is
`torch.cuda.max_memory_allocated()` since setup (null on the CPU). Precision:
`tf32` allows TF32 matmuls and convolutions (TensorFlow's default on a GPU),
`float32` forbids them; `bf16` / `fp16` run the forward pass under
`torch.autocast` (the paper's own fp16 path needs apex), `fp16` with a
`GradScaler` (unscaled before the clip), and allow TF32 for what stays in
float32 (as TensorFlow's mixed policies do: `tf32_allowed`). With `cutoffs`
the output is the paper's adaptive softmax (`div_val` 1; `tie_projs` as its
`train.py` sets them for wt103).
This file uses only the standard library, numpy and torch.
"""
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

PATCHES = {
    "utils/proj_adaptive_softmax.py": [("torch.version.cuda.split",
                                        "(torch.version.cuda or '0.0').split")],
    "mem_transformer.py": [(".byte()", ".bool()")],
}


def patched_copy(reference_dir):
    """A temporary copy of `reference_dir` with `PATCHES` applied (removed
    when this interpreter exits)."""
    if not os.path.isfile(os.path.join(reference_dir, "mem_transformer.py")):
        raise SystemExit(f"error: {reference_dir} has no mem_transformer.py "
                         "(pass the pytorch/ folder of kimiyoung/transformer-xl)")
    folder = tempfile.mkdtemp(prefix="txl_reference_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    target = os.path.join(folder, "pytorch")
    shutil.copytree(reference_dir, target)
    for name, replacements in PATCHES.items():
        path = os.path.join(target, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for old, new in replacements:
            if old not in text and new not in text:
                raise SystemExit(f"error: {name} has no {old!r}: not the expected revision")
            text = text.replace(old, new)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return target


def tf32_allowed(precision):
    """Whether a run in `precision` lets float32 matmuls and convolutions use
    TF32: all but `float32` (torch's defaults differ for the two, so both are
    set), as TensorFlow on a GPU does, also under `mixed_bfloat16` and
    `mixed_float16` for the ops they keep in float32."""
    return precision != "float32"


class Worker:
    def __init__(self, reference_dir):
        copy = patched_copy(reference_dir)
        os.chdir(copy)  # its mem_transformer.py appends 'utils' to sys.path
        sys.path.insert(0, copy)

    def setup(self, mode, n_token, n_layer, d_model, n_head, d_head, d_inner, dropout,
              dropatt, tgt_len, mem_len, batch_size, threads, cutoffs=(), device="cpu",
              precision="float32", seed=0):
        import numpy as np
        import torch
        from mem_transformer import MemTransformerLM
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.torch, self.mode, self.mems, self.device = torch, mode, tuple(), device
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32_allowed(precision)
            torch.backends.cudnn.allow_tf32 = tf32_allowed(precision)
        self.autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
        self.model = MemTransformerLM(
            n_token, n_layer, n_head, d_model, d_head, d_inner, dropout, dropatt,
            tie_weight=True, d_embed=d_model, div_val=1,
            tie_projs=[False] + [True] * len(cutoffs), pre_lnorm=False,
            tgt_len=tgt_len, ext_len=0, mem_len=mem_len, cutoffs=list(cutoffs),
            same_length=False, attn_type=0, clamp_len=-1, sample_softmax=-1).to(device)
        ids = np.random.default_rng(seed).integers(0, n_token, (64 * tgt_len + 1, batch_size))
        self.data = torch.from_numpy(ids.astype(np.int64)).to(device)
        self.tgt_len, self.position = tgt_len, 0
        if mode == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=2.5e-4)
            self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, 10 ** 6, eta_min=0.0)
        else:
            self.model.eval()
            self.model.reset_length(tgt_len, 0, mem_len)
        if device == "cuda":
            torch.cuda.synchronize()  # the first step's clock starts on an idle GPU
            torch.cuda.reset_peak_memory_stats()
        params = sum(p.numel() for p in self.model.parameters())
        return {"ok": True, "parameters": params, "torch": torch.__version__,
                "threads": torch.get_num_threads(), "device": device, "precision": precision}

    def _batch(self):
        if self.position + self.tgt_len + 1 > len(self.data):
            self.position = 0
        i = self.position
        self.position += self.tgt_len
        return self.data[i:i + self.tgt_len], self.data[i + 1:i + 1 + self.tgt_len]

    def _forward(self, data, target):
        with self.torch.autocast(self.device, dtype=self.autocast,
                                 enabled=self.autocast is not None):
            ret = self.model(data, target, *self.mems)
        self.mems = ret[1:]
        return ret[0].float().mean()

    def _train_step(self):
        data, target = self._batch()
        self.model.zero_grad()
        loss = self._forward(data, target)
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.25)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.scheduler.step()

    def _eval_step(self):
        data, target = self._batch()
        with self.torch.no_grad():
            self._forward(data, target).item()

    def run(self, n):
        step = self._train_step if self.mode == "train" else self._eval_step
        seconds = []
        cuda = self.device == "cuda"
        for _ in range(n):
            start = time.perf_counter()
            step()
            if cuda:
                self.torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        peak = self.torch.cuda.max_memory_allocated() if cuda else None
        return {"seconds": seconds, "peak_bytes": peak}


def main():
    worker = Worker(sys.argv[1])
    for line in sys.stdin:
        request = json.loads(line)
        reply = (worker.setup(**request["setup"]) if "setup" in request
                 else worker.run(request["run"]))
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
