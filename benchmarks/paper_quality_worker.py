r"""The paper's PyTorch code trained and scored on the quality recipe (a worker).

    REFERENCE_PYTHON benchmarks/paper_quality_worker.py REFERENCE_DIR JOB.json

Run by `bench_quality.py --reference_dir=... --reference_python=...` with an
interpreter that has torch and numpy (no TensorFlow). `JOB.json` names an
`.npz` of token ids (`train`, `test`, made by txl_tf's tokenizer so that both
implementations see the same ids and the same vocabulary) and the settings:
the model (`n_token`, `n_layer`, `n_head`, `d_model`, `d_head`, `d_inner`,
`dropout`, `dropatt`, `div_val`, `cutoffs`, `tie_projs`, `tgt_len`, `mem_len`),
the run (`seed`, `batch_size`, `train_steps`, `learning_rate`, `warmup_steps`,
`clip`, `threads`) and the scoring (`eval_batch_size`, `eval_mem_lens`).

What it does is what the paper's `train.py` does with `--optim=adam
--scheduler=cosine --init=normal`: the same initialisation (normal 0.02,
projections 0.01, LayerNorm gains around 1), its ordered iterator over the
training stream (epochs until `train_steps`, the memory reset at each epoch),
the mean loss, the gradient-norm clip, Adam, a linear warm-up to the peak over
`warmup_steps` and then `CosineAnnealingLR(max_step)` stepped with the step
count, floor 0. Scoring is its `evaluate()`: eval mode, `reset_length(tgt_len,
0, mem_len)`, the loss of each segment weighted by its length. Prints one JSON
line: `{"ppl": {mem_len: ppl}, "train_seconds": s}`.
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paper_reference import patched_copy  # noqa: E402


def initialise(model, torch, std=0.02, proj_std=0.01):
    """The initialisation of the paper's `train.py` (`--init=normal`)."""
    normal, zero = torch.nn.init.normal_, torch.nn.init.zeros_
    for module in model.modules():
        kind = type(module).__name__
        if "Linear" in kind:
            normal(module.weight, 0.0, std)
            if module.bias is not None:
                zero(module.bias)
        elif kind == "AdaptiveEmbedding":
            for p in module.emb_projs:
                normal(p, 0.0, proj_std)
            for layer in module.emb_layers:
                normal(layer.weight, 0.0, std)
        elif kind == "ProjectedAdaptiveLogSoftmax":
            if getattr(module, "cluster_weight", None) is not None:
                normal(module.cluster_weight, 0.0, std)
                zero(module.cluster_bias)
            for p in module.out_projs:
                if p is not None:
                    normal(p, 0.0, proj_std)
        elif kind == "LayerNorm":
            normal(module.weight, 1.0, std)
            zero(module.bias)
        elif kind == "MemTransformerLM":
            for name in ("r_w_bias", "r_r_bias"):
                if hasattr(module, name):
                    normal(getattr(module, name), 0.0, std)


def train(job, ids, torch, MemTransformerLM, LMOrderedIterator):
    torch.manual_seed(job["seed"])
    model = MemTransformerLM(
        job["n_token"], job["n_layer"], job["n_head"], job["d_model"], job["d_head"],
        job["d_inner"], job["dropout"], job["dropatt"], tie_weight=True,
        d_embed=job["d_model"], div_val=job["div_val"], tie_projs=job["tie_projs"],
        pre_lnorm=False, tgt_len=job["tgt_len"], ext_len=0, mem_len=job["mem_len"],
        cutoffs=job["cutoffs"], same_length=False, attn_type=0, clamp_len=-1,
        sample_softmax=-1)
    initialise(model, torch)
    peak, warmup, steps = job["learning_rate"], job["warmup_steps"], job["train_steps"]
    optimizer = torch.optim.Adam(model.parameters(), lr=peak)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=0.0)
    batches = LMOrderedIterator(torch.from_numpy(ids["train"]), job["batch_size"],
                                job["tgt_len"], ext_len=0)
    model.train()
    step, start = 0, time.time()
    while step < steps:
        mems = tuple()
        for data, target, _ in batches:
            model.zero_grad()
            out = model(data, target, *mems)
            loss, mems = out[0].float().mean(), out[1:]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), job["clip"])
            optimizer.step()
            step += 1
            if step < warmup:
                optimizer.param_groups[0]["lr"] = peak * step / warmup
            else:
                scheduler.step(step)
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.3f}", file=sys.stderr, flush=True)
            if step >= steps:
                break
    return model, time.time() - start


def score(model, ids, job, mem_len, torch, LMOrderedIterator):
    model.eval()
    model.reset_length(job["tgt_len"], 0, mem_len)
    batches = LMOrderedIterator(torch.from_numpy(ids["test"]), job["eval_batch_size"],
                                job["tgt_len"], ext_len=0)
    total, count, mems = 0.0, 0, tuple()
    with torch.no_grad():
        for data, target, seq_len in batches:
            out = model(data, target, *mems)
            mems = out[1:]
            total += seq_len * out[0].float().mean().item()
            count += seq_len
    return math.exp(total / count)


def main(reference_dir, job_path):
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    copy = patched_copy(reference_dir)
    os.chdir(copy)  # its mem_transformer.py appends 'utils' to sys.path
    sys.path.insert(0, copy)
    import numpy as np
    import torch
    from data_utils import LMOrderedIterator
    from mem_transformer import MemTransformerLM
    torch.set_num_threads(job["threads"])
    np.random.seed(job["seed"])
    with np.load(job["ids"]) as arrays:
        ids = {name: arrays[name].astype(np.int64) for name in ("train", "test")}
    model, seconds = train(job, ids, torch, MemTransformerLM, LMOrderedIterator)
    ppl = {str(m): score(model, ids, job, m, torch, LMOrderedIterator)
           for m in job["eval_mem_lens"]}
    print(json.dumps({"ppl": ppl, "train_seconds": seconds, "torch": torch.__version__}),
          flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
