r"""Imported weights against the Hugging Face port's own code (run by hand).

    python -m benchmarks.hf_parity --hf_python=/path/to/venv-with-transformers/bin/python

The port (`transformers`' `TransfoXLLMHeadModel`, shipped up to 4.x) is built
at tiny sizes with random weights in a second interpreter that has torch and
transformers (this one needs neither), saved as the Hub's `transfo-xl-wt103`
folder holds it (`save_pretrained`: `config.json` and `model.safetensors`,
tied copies left out; and the whole state dict, tied copies in, as its
`pytorch_model.bin` holds it) and run over several segments with its `mems`
carried: its log-probs over the whole vocabulary (`prediction_scores`), its
per-token losses (`labels`, through its adaptive softmax with `keep_order`),
its new mems and its greedy `generate`, in float32 (what it runs) and in
float64 (its attention scores still pass through float32 where it masks them:
`masked_fill` with float32's minimum, as its own code casts them).

Here each folder is converted as `txl-convert` does (`--config` the port's
`config.json`), loaded with `load_pretrained` and `TransformerXLCausalLM.from_preset`,
and the whole state dict imported without a config (`import_pytorch`, the
evaluation settings as keywords); each is run through the float32 core,
segment by segment, and `Decoder` decodes greedily. The table gives max |Δ|
per case; `tests/reference_pytorch_numpy.py` (float64) is the third opinion.
Without `--hf_python`, or with one that cannot import `TransfoXLLMHeadModel`,
the run is skipped with one line. The port's code is only run, never copied.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    from txl_tf.app.flagspec import option
except ImportError:  # the port's interpreter: torch, transformers and numpy only
    def option(*fields):
        return fields

SPEC = (
    option("string", "hf_python", None, "A Python with torch and transformers 4.x "
           "(TransfoXLLMHeadModel); without one the run is skipped."),
    option("string", "output", "benchmarks/results/hf_parity.json", "JSON results file."),
)
BASE = dict(n_layer=2, n_head=2, d_head=8, d_model=32, d_inner=48, dropout=0.0, dropatt=0.0)
WT103 = dict(vocab_size=60, cutoffs=[10, 20, 40], div_val=4, d_embed=64, d_model=64, d_inner=64,
             tie_projs=[False, True, True, True])  # div_val 4 needs d_embed >= 4**3


def _case(name, seg=4, n_seg=4, batch=2, note="", documented=False, half=False, **hf):
    return {"name": name, "seg": seg, "n_seg": n_seg, "batch": batch, "note": note,
            "documented": documented, "half": half, "hf": {**BASE, **hf}}


# The port's config fields (TransfoXLConfig), one case each; tie_projs is
# set on the config after construction, as a config.json's list sets it.
CASES = [
    _case("wt103-like (div_val 4, same_length, clamp_len 3, mem 6 > seg 4)", **WT103,
          untie_r=True, same_length=True, clamp_len=3, mem_len=6),
    _case("wt103-like, mem 3 < seg 4, no same_length, clamp_len 1000", **WT103, untie_r=True,
          same_length=False, clamp_len=1000, mem_len=3),
    _case("div_val 1, d_embed 16, tie_projs [F, T, F], untied output, shared r-biases, B 3",
          vocab_size=50, cutoffs=[10, 30], div_val=1, d_embed=16, tie_projs=[False, True, False],
          untie_r=False, same_length=True, clamp_len=-1, mem_len=5, tie_word_embeddings=False,
          seg=5, batch=3),
    _case("no cutoffs, pre_lnorm, shared r-biases", vocab_size=40, cutoffs=[], div_val=1,
          d_embed=32, tie_projs=[False], untie_r=False, same_length=True, clamp_len=2,
          mem_len=4, pre_lnorm=True),
    _case("div_val 4, pre_lnorm, tie_projs [T, F, T, F], untied output, B 3",
          **{**WT103, "tie_projs": [True, False, True, False]}, untie_r=False,
          same_length=False, clamp_len=2, mem_len=8, pre_lnorm=True, tie_word_embeddings=False,
          seg=5, batch=3),
    _case("div_val 2, d_embed 64 > d_model, mem 10, 5 segments of 3", vocab_size=50,
          cutoffs=[10, 30], div_val=2, d_embed=64, tie_projs=[False, True, True], untie_r=True,
          same_length=True, clamp_len=-1, mem_len=10, seg=3, n_seg=5),
    _case("div_val 1 with cutoffs, d_embed = d_model, mem 2", vocab_size=50, cutoffs=[10, 30],
          div_val=1, d_embed=32, tie_projs=[False, True, True], untie_r=True, same_length=True,
          clamp_len=5, mem_len=2),
    _case("mem_len 0", **WT103, untie_r=True, same_length=False, clamp_len=3, mem_len=0,
          note="greedy ids differ by design: the port's generate has no mems at mem_len 0 and "
          "re-reads the whole sequence each step; Decoder keeps no memory"),
    _case("layer_norm_epsilon 0.5", vocab_size=40, cutoffs=[20], div_val=1, d_embed=32,
          tie_projs=[False, True], untie_r=True, same_length=False, clamp_len=-1, mem_len=4,
          layer_norm_epsilon=0.5),
    # Documented difference (txl_tf.layers.masks): there a query sees itself;
    # the port masks every key and attends evenly to all, later ones included.
    _case("mem_len 0 with same_length (documented difference)", **WT103, untie_r=True,
          same_length=True, clamp_len=3, mem_len=0,
          note="the port masks every key and attends evenly to the whole segment, later "
          "positions included; txl_tf lets a query see itself (txl_tf.layers.masks)",
          documented=True),
    _case("wt103-like saved in float16 (documented difference)", **WT103, untie_r=True,
          same_length=True, clamp_len=3, mem_len=6, half=True, documented=True,
          note="the port runs with the file's float16-rounded inv_freq buffer; txl_tf computes "
          "the exact frequencies (docs/weights.md)"),
]
NEW_TOKENS, PROMPT = 12, 4


# ------------------------------------------------------------ the port's side
def hf_stage(out_dir):
    """Builds, saves and runs every case with the port (in its interpreter)."""
    import warnings

    import torch
    from safetensors.torch import save_file
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel
    warnings.filterwarnings("ignore")
    finfo = torch.finfo

    def float32_mask_min(dtype=None):
        # Its float64 run: the scores it masks are float32 (`.float()`), and
        # float64's minimum overflows there.
        return finfo(torch.float32) if dtype == torch.float64 else finfo(dtype)

    def run(model, ids, seg, n_seg, dtype):
        torch.finfo = float32_mask_min if dtype == torch.float64 else finfo
        model = model.to(dtype)
        mems, out = None, {"log_probs": [], "losses": [], "mems": []}
        with torch.no_grad():
            for s in range(n_seg):
                x = ids[:, s * seg:(s + 1) * seg]
                result = model(input_ids=x, mems=mems, return_dict=True)
                hidden = model.transformer(input_ids=x, mems=mems).last_hidden_state
                out["log_probs"].append(result.prediction_scores.double().numpy())
                out["losses"].append(model.crit(hidden, x, keep_order=True).view(
                    x.shape[0], seg - 1).double().numpy())
                mems = result.mems
                out["mems"].append(np.stack([m.double().numpy() for m in mems])
                                   if mems is not None else np.zeros((0,)))
        torch.finfo = finfo
        return out

    for c, case in enumerate(CASES):
        folder = os.path.join(out_dir, str(c))
        hf = dict(case["hf"])
        tie_projs = hf.pop("tie_projs")
        config = TransfoXLConfig(**hf)
        config.tie_projs = list(tie_projs)
        torch.manual_seed(c)
        model = TransfoXLLMHeadModel(config)
        gen = torch.Generator().manual_seed(c)
        with torch.no_grad():
            for name, p in model.named_parameters():  # tied weights are listed once
                noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
                p.copy_(1 + 0.1 * noise if "layer_norm.weight" in name else 0.3 * noise)
        if case["half"]:
            model = model.half()
        model.save_pretrained(folder, safe_serialization=True)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  os.path.join(folder, "full.safetensors"))
        model = TransfoXLLMHeadModel.from_pretrained(  # as a user gets it
            folder, torch_dtype=torch.float32).eval()
        ids = torch.from_numpy(np.random.default_rng(100 + c).integers(
            0, hf["vocab_size"], (case["batch"], case["seg"] * case["n_seg"])))
        arrays = {"ids": ids.numpy()}
        for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
            for key, values in run(model, ids, case["seg"], case["n_seg"], dtype).items():
                for s, value in enumerate(values):
                    arrays[f"{tag}/{key}/{s}"] = value
        model.generation_config.eos_token_id = None  # config.json's 0 would end rows
        prompts = ids[:, :PROMPT]
        generated = model.generate(prompts, max_new_tokens=NEW_TOKENS, do_sample=False,
                                   num_beams=1, return_dict_in_generate=True,
                                   output_scores=True, pad_token_id=0)
        arrays["generate/ids"] = generated.sequences[:, PROMPT:].numpy()
        arrays["generate/log_probs"] = torch.stack(generated.scores, 1).double().numpy()
        np.savez(os.path.join(folder, "port_outputs.npz"), **arrays)
    import transformers
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))


# ------------------------------------------------------------------ our side
def _reference(folder, hf, eps):
    """`tests/reference_pytorch_numpy.py` on the whole state dict, or None."""
    from safetensors.numpy import load_file
    import tests.reference_pytorch_numpy as reference

    if hf["mem_len"] == 0 and hf["same_length"]:
        return None  # the paper's semantics mask every key there
    reference.EPS = eps
    return reference.PytorchReference(
        load_file(os.path.join(folder, "full.safetensors")), n_token=hf["vocab_size"],
        n_head=hf["n_head"], d_head=hf["d_head"], cutoffs=hf["cutoffs"], div_val=hf["div_val"],
        mem_len=hf["mem_len"], same_length=hf["same_length"], clamp_len=hf["clamp_len"],
        cluster_rule="tf", zero_start=True, pre_lnorm=hf.get("pre_lnorm", False))


def _segments(core, ids, seg, n_seg):
    memory = core.initial_memory(ids.shape[0])
    out = {"log_probs": [], "losses": [], "mems": []}
    for s in range(n_seg):
        x = ids[:, s * seg:(s + 1) * seg]
        nll, _ = core(x, memory, targets=np.roll(x, -1, 1))
        log_probs, memory = core(x, memory)
        out["log_probs"].append(np.asarray(log_probs, np.float64))
        out["losses"].append(np.asarray(nll, np.float64)[:, :-1])  # the port's last has none
        out["mems"].append(np.asarray(memory.mems, np.float64).transpose(0, 2, 1, 3))
    return out


def _max(a, b):
    return max(float(np.abs(x - y).max()) if np.size(x) else 0.0 for x, y in zip(a, b))


def compare(out_dir, work):
    import tests.reference_pytorch_numpy as reference
    from txl_tf import Decoder
    from txl_tf.models.transformer_xl import TransformerXLCausalLM
    from txl_tf.weights import import_pytorch, load_pretrained
    from txl_tf.weights.convert import convert

    rows, eps_default = [], reference.EPS
    for c, case in enumerate(CASES):
        folder, hf = os.path.join(out_dir, str(c)), case["hf"]
        seg, n_seg = case["seg"], case["n_seg"]
        data = np.load(os.path.join(folder, "port_outputs.npz"))
        port = {tag: {key: [data[f"{tag}/{key}/{s}"] for s in range(n_seg)]
                      for key in ("log_probs", "losses", "mems")} for tag in ("f64", "f32")}
        ids = data["ids"]
        model_dir = os.path.join(work, str(c))
        printed = []
        convert("pytorch", os.path.join(folder, "model.safetensors"), model_dir,
                config=os.path.join(folder, "config.json"), echo=printed.append)
        converted = _segments(load_pretrained(model_dir), ids, seg, n_seg)
        preset = _segments(TransformerXLCausalLM.from_preset(model_dir).core, ids, seg, n_seg)
        keywords = {k: hf[k] for k in ("mem_len", "same_length", "clamp_len", "pre_lnorm",
                                       "layer_norm_epsilon") if k in hf}
        if hf["div_val"] == 1 and hf["cutoffs"]:  # one table: the shapes do not tell them
            keywords["cutoffs"] = hf["cutoffs"]
        whole = _segments(import_pytorch(os.path.join(folder, "full.safetensors"), **keywords),
                          ids, seg, n_seg)
        row = {"case": case["name"], "note": case["note"],
               "documented difference": case["documented"], "batch": case["batch"], "segment": seg,
               "segments": n_seg, "mem_len": hf["mem_len"], "same_length": hf["same_length"],
               "clamp_len": hf["clamp_len"], "largest |log-prob|": float(np.abs(
                   port["f64"]["log_probs"]).max()),
               "config.json: ignored fields": printed[0] if printed[0].startswith("config:")
               else ""}
        for tag in ("f32", "f64"):
            row[f"log_probs vs port {tag}"] = [
                float(np.abs(a - b).max()) for a, b in zip(converted["log_probs"],
                                                           port[tag]["log_probs"])]
            row[f"losses vs port {tag}"] = _max(converted["losses"], port[tag]["losses"])
            row[f"memory vs port {tag}"] = _max(converted["mems"], port[tag]["mems"])
        row["port f32 vs port f64"] = _max(port["f32"]["log_probs"], port["f64"]["log_probs"])
        row["from_preset vs txl-convert"] = _max(preset["log_probs"], converted["log_probs"])
        row["whole state dict, no config, vs port f64"] = _max(whole["log_probs"],
                                                               port["f64"]["log_probs"])
        ref = _reference(folder, hf, hf.get("layer_norm_epsilon", eps_default))
        if ref is not None:
            want = [ref.forward(ids[:, s * seg:(s + 1) * seg].T).transpose(1, 0, 2)
                    for s in range(n_seg)]
            row["numpy reference vs port f64"] = _max(want, port["f64"]["log_probs"])
            row["txl_tf vs numpy reference"] = _max(converted["log_probs"], want)
        reference.EPS = eps_default
        core = load_pretrained(model_dir)
        out = Decoder(core, segment_len=PROMPT).generate(ids[:, :PROMPT], NEW_TOKENS,
                                                         temperature=0)
        want_ids = data["generate/ids"]
        row["greedy ids equal"] = bool((np.asarray(out.ids) == want_ids).all())
        chosen = np.take_along_axis(data["generate/log_probs"], want_ids[..., None], -1)[..., 0]
        row["greedy chosen log-prob vs port f32"] = float(np.abs(
            np.asarray(out.log_probs, np.float64) - chosen).max())
        rows.append(row)
        print(f"{case['name']}: done", flush=True)
    return rows


def table(rows):
    lines = ["| case | vs port f32 | vs port f64 | losses | memory | port f32 vs f64 | "
             "numpy ref vs port f64 | largest log-prob | greedy ids |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        numpy_ref = r.get("numpy reference vs port f64")
        lines.append(
            f"| {r['case']} | {max(r['log_probs vs port f32']):.1e} | "
            f"{max(r['log_probs vs port f64']):.1e} | {r['losses vs port f64']:.1e} | "
            f"{r['memory vs port f64']:.1e} | {r['port f32 vs port f64']:.1e} | "
            f"{'-' if numpy_ref is None else f'{numpy_ref:.1e}'} | "
            f"{r['largest |log-prob|']:.0f} | {'equal' if r['greedy ids equal'] else 'differ'} |")
    lines += [f"- {r['case']}: {r['note']}" for r in rows if r["note"]]
    return "\n".join(lines)


def _port_available(python):
    """`(True, versions)` or `(False, why)`."""
    probe = ("import json, torch, transformers; from transformers import TransfoXLLMHeadModel; "
             "print(json.dumps({'transformers': transformers.__version__, "
             "'torch': torch.__version__}))")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                              timeout=300)
    except OSError as err:
        return False, str(err)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return False, tail
    return True, json.loads(done.stdout.strip().splitlines()[-1])


def main(argv):
    del argv
    from benchmarks.common import BenchmarkError
    from txl_tf.app.flagspec import values
    o = values(SPEC)
    python = o["hf_python"]
    if not python:
        print("skipped: no --hf_python (a Python with torch and transformers 4.x, whose "
              "TransfoXLLMHeadModel is the port)")
        return
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise BenchmarkError(f"--hf_python={python} is not an executable file")
    found, versions = _port_available(python)
    if not found:
        print(f"skipped: {python} cannot import transformers' TransfoXLLMHeadModel ({versions})")
        return
    with tempfile.TemporaryDirectory() as tmp:
        port_dir, work = os.path.join(tmp, "port"), os.path.join(tmp, "converted")
        subprocess.run([python, os.path.abspath(__file__), "hf_stage", port_dir], check=True,
                       stdout=subprocess.DEVNULL)
        rows = compare(port_dir, work)
    print(table(rows))
    worst = max(max(r["log_probs vs port f32"]) for r in rows if not r["documented difference"])
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump({"port": versions, "largest log-prob difference (but the documented case)":
                   worst, "rows": rows}, f, indent=2, allow_nan=False)
    print(f"wrote {o['output']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["hf_stage"]:  # run by main() in the port's interpreter
        hf_stage(sys.argv[2])
    else:
        from txl_tf.app import cli
        cli.run(main, SPEC)
