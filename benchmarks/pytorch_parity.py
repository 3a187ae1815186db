r"""Imported weights against the paper's own PyTorch code (run by hand), and
the torch stages the benchmarks run in an interpreter with PyTorch.

    python -m benchmarks.pytorch_parity --torch_python=/path/to/venv-with-torch/bin/python \
        --ref_dir=/path/to/kimiyoung/transformer-xl/pytorch

The paper's `MemTransformerLM` is built with random double-precision weights
in a second interpreter that has PyTorch (this one needs none); its state
dict and its log-probabilities over the whole vocabulary (every target scored
through its own adaptive softmax, memories carried over several segments)
come back as an `.npz`. Here the state dict is imported with
`txl_tf.weights.import_pytorch` and run through the float32 Keras core
with each `same_length` convention; the table gives max |Δ| per segment.
The paper's code is only read and run, never copied into this project: the
torch stage patches a temporary copy of it (`paper_reference.patched_copy`:
`torch.version.cuda` is None on a CPU build; byte masks become bool).

This file's torch stages run there, with torch and numpy only: `torch_stage`
(the parity's side) and `quality_stage` (the paper's code trained and scored
on the quality recipe, for `benchmarks.quality --reference_dir=...`).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    from txl_tf.app.flagspec import option
except ImportError:  # the torch stage's interpreter: torch and numpy only, no flags
    def option(*fields):
        return fields

SPEC = (
    option("string", "torch_python", None, "A Python with PyTorch (runs the paper's code)."),
    option("string", "ref_dir", None, "The paper's pytorch/ folder (mem_transformer.py)."),
    option("string", "output", "benchmarks/results/pytorch_parity.json", "JSON results file."),
)
CASES = {
    "enwik8-like (no cutoffs)": dict(n_token=24, cutoffs=[], div_val=1, d_embed=32),
    "adaptive (cutoffs, div_val 2)": dict(n_token=50, cutoffs=[10, 30], div_val=2, d_embed=16),
    # attn_type 2 adds positions in place to the memory tensors it is given
    # and cannot start from an empty memory: its memory is mem_len = tgt_len
    # zero states at the start, and a fresh copy is passed to every call, so
    # that its result does not depend on those additions (see docs/model.md).
    "learnable relative (attn_type 1)": dict(n_token=50, cutoffs=[10, 30], div_val=2,
                                             d_embed=16, attn_type=1),
    "absolute sinusoid (attn_type 2)": dict(n_token=50, cutoffs=[10, 30], div_val=2,
                                            d_embed=16, attn_type=2),
    # attn_type 3 adds to its memory in place too (where mem_len > tgt_len the
    # additions stay in the next memory): mem_len = tgt_len, a fresh copy per
    # call. Its embeddings are [n_head * d_head] = d_model wide.
    "absolute per layer (attn_type 3)": dict(n_token=50, cutoffs=[10, 30], div_val=2,
                                             d_embed=16, attn_type=3, d_head=16),
}
SIZES = dict(n_layer=2, n_head=2, d_model=32, d_head=8, d_inner=48)
SETTINGS = [(False, -1), (True, -1), (True, 3)]
SEG, MEM, BATCH, SEGMENTS = 4, 8, 2, 4


# ---------------------------------------------------------------- torch side
def torch_stage(ref_dir, out):
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from paper_reference import patched_copy  # the two patches, on a temporary copy
    ref_dir = patched_copy(ref_dir)
    sys.path[:0] = [ref_dir, os.path.join(ref_dir, "utils")]
    from mem_transformer import MemTransformerLM

    torch.manual_seed(0)
    results = {}
    for c, (name, case) in enumerate(CASES.items()):
        for same_length, clamp_len in SETTINGS:
            n_bins = len(case["cutoffs"]) + 1
            attn_type = case.get("attn_type", 0)
            mem_len = SEG if attn_type in (2, 3) else MEM
            sizes = {**SIZES, "d_head": case.get("d_head", SIZES["d_head"])}
            model = MemTransformerLM(
                case["n_token"], sizes["n_layer"], sizes["n_head"], sizes["d_model"],
                sizes["d_head"], sizes["d_inner"], 0.0, 0.0, tie_weight=True,
                d_embed=case["d_embed"], div_val=case["div_val"],
                tie_projs=[False] + [True] * (n_bins - 1), tgt_len=SEG, ext_len=0,
                mem_len=mem_len, cutoffs=list(case["cutoffs"]), same_length=same_length,
                clamp_len=clamp_len, attn_type=attn_type).double().eval()
            gen = torch.Generator().manual_seed(c)
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
                    p.copy_(1 + 0.1 * noise if "layer_norm.weight" in pname else 0.3 * noise)
            ids = torch.randint(0, case["n_token"], (SEG * SEGMENTS, BATCH), generator=gen)
            mems = model.init_mems() if attn_type != 2 else [
                torch.zeros(mem_len, BATCH, SIZES["d_model"], dtype=torch.float64)
                for _ in range(SIZES["n_layer"] + 1)]
            log_probs = []
            with torch.no_grad():
                for s in range(SEGMENTS):
                    seg = ids[s * SEG:(s + 1) * SEG]
                    hidden, new_mems = model._forward(seg, mems=[m.clone() for m in mems])
                    mems = tuple(new_mems)
                    flat = hidden.reshape(-1, hidden.size(-1))
                    rows = flat.repeat_interleave(case["n_token"], 0)
                    targets = torch.arange(case["n_token"]).repeat(flat.size(0))
                    nll = model.crit(rows, targets, keep_order=True)
                    log_probs.append(-nll.view(SEG, BATCH, case["n_token"]).numpy())
            key = f"{c}/{int(same_length)}/{clamp_len}"
            results[f"{key}/ids"] = ids.numpy()
            results[f"{key}/log_probs"] = np.stack(log_probs)
            for pname, value in model.state_dict().items():
                results[f"{key}/state/{pname}"] = value.numpy()
    np.savez(out, **results)


# --------------------------------------------- torch side: the quality recipe
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


def quality_stage(reference_dir, job_path):
    r"""The paper's PyTorch code trained and scored on the quality recipe.

        REFERENCE_PYTHON benchmarks/pytorch_parity.py quality_stage REFERENCE_DIR JOB.json

    Run by `benchmarks.quality --reference_dir=... --reference_python=...` with
    an interpreter that has torch and numpy (no TensorFlow). `JOB.json` names an
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
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from paper_reference import patched_copy  # the two patches, on a temporary copy
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


# ----------------------------------------------------------------- our side
def compare(path):
    from tests.reference_pytorch_numpy import PytorchReference
    from txl_tf import TransformerXLConfig
    from txl_tf.weights import import_pytorch

    data = np.load(path, allow_pickle=False)
    rows = []
    for c, (name, case) in enumerate(CASES.items()):
        for same_length, clamp_len in SETTINGS:
            key = f"{c}/{int(same_length)}/{clamp_len}"
            prefix = f"{key}/state/"
            state = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
            ids = data[f"{key}/ids"].T  # batch-major
            want = data[f"{key}/log_probs"].transpose(0, 2, 1, 3)  # [segment, B, T, V]
            attn_type = case.get("attn_type", 0)
            mem_len = SEG if attn_type in (2, 3) else MEM
            ref = PytorchReference(state, n_head=SIZES["n_head"],
                                   d_head=case.get("d_head", SIZES["d_head"]),
                                   mem_len=mem_len, same_length=same_length,
                                   clamp_len=clamp_len, zero_start=attn_type == 2,
                                   **{k: case[k] for k in ("n_token", "cutoffs", "div_val")})
            ref_out = np.stack([ref.forward(ids[:, s * SEG:(s + 1) * SEG].T).transpose(1, 0, 2)
                                for s in range(SEGMENTS)])
            row = {"case": name, "same_length": same_length, "clamp_len": clamp_len,
                   "numpy_reference": float(np.abs(ref_out - want).max())}
            config = None if attn_type != 2 else TransformerXLConfig(  # 2: heads not inferred
                **SIZES, **{k: case[k] for k in ("n_token", "cutoffs", "div_val", "d_embed")},
                attn_type=attn_type, tie_projs=[False] + [True] * len(case["cutoffs"]))
            for convention in ("pytorch", "tf"):
                core = import_pytorch(state, config, mem_len=mem_len, same_length=same_length,
                                      clamp_len=clamp_len, same_length_convention=convention,
                                      zero_filled_memory=attn_type == 2)
                memory = core.initial_memory(BATCH)
                deltas = []
                for s in range(SEGMENTS):
                    got, memory = core(ids[:, s * SEG:(s + 1) * SEG], memory)
                    deltas.append(float(np.abs(np.asarray(got, np.float64) - want[s]).max()))
                row[convention] = deltas
            rows.append(row)
    return rows


def table(rows):
    seg = " | ".join(f"seg {s + 1}" for s in range(SEGMENTS))
    lines = [f"| case | same_length | clamp_len | convention | {seg} |",
             "|---|---|---|---|" + "---|" * SEGMENTS]
    for r in rows:
        for convention in ("pytorch", "tf"):
            cells = " | ".join(f"{d:.1e}" for d in r[convention])
            lines.append(f"| {r['case']} | {r['same_length']} | {r['clamp_len']} | "
                         f"{convention} | {cells} |")
    lines.append("")
    lines.append("numpy reference (tests/reference_pytorch_numpy.py, float64) vs the paper's "
                 "code, max |Δ| over all segments: " +
                 ", ".join(f"{r['numpy_reference']:.1e}" for r in rows))
    return "\n".join(lines)


def main(argv):
    del argv
    from benchmarks.common import BenchmarkError
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    if not (o["torch_python"] and o["ref_dir"]):
        raise BenchmarkError("--torch_python and --ref_dir are required")
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "torch.npz")
        subprocess.run([o["torch_python"], os.path.abspath(__file__), "torch_stage",
                        os.path.abspath(o["ref_dir"]), npz], check=True)
        rows = compare(npz)
    print(table(rows))
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"segment": SEG, "mem_len": MEM, "batch": BATCH, "rows": rows}, f, indent=2)
    print(f"wrote {o['output']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["torch_stage"]:  # run by main() in the torch interpreter
        torch_stage(*sys.argv[2:4])
    elif sys.argv[1:2] == ["quality_stage"]:  # run by `benchmarks.quality --part=seeds`
        quality_stage(*sys.argv[2:4])
    else:
        from txl_tf.app import cli
        cli.run(main, SPEC)
