r"""LoRA and int8 of the keras-hub causal LM on a trained model.

    python -m benchmarks.bench_keras_hub --model_dir=pystdlib_small

int8: `causal_lm.quantize("int8")` (attention projections and feed-forward
layers; the adaptive embedding / softmax and the position projection stay
float): held-out perplexity before and after (the paper's stream evaluation:
`--eval_batch_size` contiguous streams with the memory carried), the bytes
of the weights, and tokens/s of greedy `generate` (batch 1, a prompt of
`--prompt_len` ids, `--new_tokens` new ids, median of `--repeats` after a
compiling run), float and int8 in the same run.

LoRA: `causal_lm.backbone.enable_lora(rank)` (adapters on `query` and
`value`): trainable parameters before and after, a fine-tuning run on another
text (`--finetune_data`, first 90% to train, last 10% held out) whose
held-out loss is printed before and after, and the adapters saved with
`save_lora_weights` and loaded into a fresh model (same held-out loss).
Prints a table and writes JSON.
"""
import json
import os
import sys
import tempfile
import time


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from txl_tf.app import cli  # noqa: E402
from txl_tf.app.flagspec import option, values  # noqa: E402

SPEC = (
    option("string", "model_dir", "pystdlib_small", "A trained model directory or shipped model "
           "name."),
    option("string", "dataset", "pystdlib", "Corpus whose validation split is held out."),
    option("integer", "eval_tokens", 32768, "Held-out ids evaluated (from the split's start)."),
    option("integer", "eval_batch_size", 8, "Streams of the evaluation."),
    option("integer", "prompt_len", 64, "Prompt ids of the generate timing."),
    option("integer", "new_tokens", 64, "New ids of the generate timing."),
    option("integer", "repeats", 5, "Timed generate runs (the median is reported)."),
    option("string", "finetune_data",
           os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"),
           "Text the LoRA run adapts the model to."),
    option("integer", "lora_rank", 4, "LoRA rank."),
    option("integer", "lora_steps", 200, "Fine-tuning steps."),
    option("integer", "lora_batch_size", 8, "Fine-tuning streams."),
    option("float", "lora_learning_rate", 3e-3, "Fine-tuning learning rate (Adam)."),
    option("string", "output", os.path.join(REPO, "benchmarks", "results", "keras_hub.json"),
           "Where to write the JSON results."),
)


def streams(causal_lm, ids, batch_size):
    """The paper's evaluation layout: `ids` as `batch_size` contiguous streams."""
    import numpy as np
    return causal_lm.document_dataset(np.array_split(np.asarray(ids), batch_size), batch_size)


def held_out_loss(causal_lm, dataset):
    return float(causal_lm.evaluate(dataset, verbose=0, return_dict=True)["loss"])


def weight_bytes(model):
    import numpy as np
    return int(sum(np.prod(v.shape) * np.dtype(str(v.dtype)).itemsize for v in model.weights))


def generate_seconds(causal_lm, prompt, new_tokens, repeats):
    """Median seconds of greedy `generate` of `new_tokens` after `prompt`."""
    import numpy as np
    width = len(prompt) + new_tokens
    inputs = {"token_ids": np.zeros([1, width], np.int32),
              "padding_mask": np.zeros([1, width], np.int32)}
    inputs["token_ids"][0, :len(prompt)] = prompt
    inputs["padding_mask"][0, :len(prompt)] = 1
    causal_lm.compile(sampler="greedy")
    preprocessor, causal_lm.preprocessor = causal_lm.preprocessor, None  # ids in, ids out
    causal_lm.generate(inputs)  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        causal_lm.generate(inputs)
        times.append(time.perf_counter() - start)
    causal_lm.preprocessor = preprocessor
    return float(np.median(times))


def run(o):
    import keras
    import numpy as np

    from txl_tf import TransformerXLCausalLM
    from txl_tf.data import load_corpus
    from txl_tf.errors import TxlError

    if not os.path.isdir(o["model_dir"]):
        raise TxlError(f"--model_dir: {o['model_dir']} not found (train the README's "
                             "tour first, or pass a trained model directory)")
    causal_lm = TransformerXLCausalLM.from_preset(o["model_dir"])
    if causal_lm.preprocessor is None:
        raise TxlError(f"--model_dir: {o['model_dir']} has no vocabulary (vocab/)")
    tokenizer = causal_lm.preprocessor.tokenizer.inner
    corpus = load_corpus(o["dataset"], tokenizer=tokenizer)
    held_out = streams(causal_lm, corpus.valid[:o["eval_tokens"]], o["eval_batch_size"])
    prompt = np.asarray(corpus.valid[:o["prompt_len"]], np.int32)
    report = {"model_dir": o["model_dir"], "config": causal_lm.core.config.to_dict(),
              "held_out": f"{o['dataset']} validation, first {o['eval_tokens']} ids, "
                          f"{o['eval_batch_size']} streams, memory {causal_lm.mem_len}"}

    # ------------------------------------------------------------------ int8
    causal_lm.compile()
    int8 = {}
    for mode in ("float32", "int8"):
        if mode == "int8":
            causal_lm.quantize("int8")
            causal_lm.compile()
        loss = held_out_loss(causal_lm, held_out)
        seconds = generate_seconds(causal_lm, prompt, o["new_tokens"], o["repeats"])
        int8[mode] = {"loss": loss, "ppl": float(np.exp(loss)),
                      "weight_bytes": weight_bytes(causal_lm),
                      "generate_seconds": seconds,
                      "generate_tokens_per_s": o["new_tokens"] / seconds}
    report["int8"] = int8

    # ------------------------------------------------------------------ LoRA
    if not os.path.isfile(o["finetune_data"]):
        raise TxlError(f"--finetune_data: {o['finetune_data']} not found")
    text = load_corpus("text", o["finetune_data"], tokenizer=tokenizer)
    lora_held_out = streams(causal_lm, text.valid[:o["eval_tokens"]], o["eval_batch_size"])
    train = streams(causal_lm, text.train, o["lora_batch_size"]).repeat().take(o["lora_steps"])
    causal_lm = TransformerXLCausalLM.from_preset(o["model_dir"])
    before = int(sum(np.prod(v.shape) for v in causal_lm.trainable_weights))
    causal_lm.backbone.enable_lora(o["lora_rank"])
    after = int(sum(np.prod(v.shape) for v in causal_lm.trainable_weights))
    causal_lm.compile(optimizer=keras.optimizers.Adam(o["lora_learning_rate"]))
    loss_before = held_out_loss(causal_lm, lora_held_out)
    start = time.perf_counter()
    causal_lm.fit(train, verbose=0)
    fit_seconds = time.perf_counter() - start
    loss_after = held_out_loss(causal_lm, lora_held_out)
    path = os.path.join(tempfile.mkdtemp(prefix="txl_lora_"), "adapters.lora.h5")
    causal_lm.backbone.save_lora_weights(path)
    reloaded = TransformerXLCausalLM.from_preset(o["model_dir"])
    reloaded.backbone.load_lora_weights(path)
    reloaded.compile()
    loss_reloaded = held_out_loss(reloaded, lora_held_out)
    report["lora"] = {"rank": o["lora_rank"], "trainable_before": before,
                      "trainable_after": after, "finetune_data": o["finetune_data"],
                      "steps": o["lora_steps"], "batch_size": o["lora_batch_size"],
                      "fit_seconds": fit_seconds, "held_out_loss_before": loss_before,
                      "held_out_loss_after": loss_after,
                      "held_out_loss_reloaded": loss_reloaded,
                      "adapter_file_bytes": os.path.getsize(path)}

    os.makedirs(os.path.dirname(os.path.abspath(o["output"])), exist_ok=True)
    with open(o["output"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    f32, q8 = int8["float32"], int8["int8"]
    print(f"\nint8 ({report['held_out']})")
    print(f"{'':>8} | {'ppl':>7} | {'weight MB':>9} | {'generate tok/s':>14}")
    for name, row in int8.items():
        print(f"{name:>8} | {row['ppl']:>7.3f} | {row['weight_bytes'] / 1e6:>9.3f} | "
              f"{row['generate_tokens_per_s']:>14.1f}")
    print(f"change   | {100 * (q8['ppl'] / f32['ppl'] - 1):>+6.2f}% | "
          f"{q8['weight_bytes'] / f32['weight_bytes']:>8.2f}x | "
          f"{q8['generate_tokens_per_s'] / f32['generate_tokens_per_s']:>13.2f}x")
    lora = report["lora"]
    print(f"\nLoRA rank {lora['rank']}: trainable parameters {before:,} -> {after:,}; "
          f"{lora['steps']} steps on {os.path.basename(o['finetune_data'])} in "
          f"{fit_seconds:.0f}s: held-out loss {loss_before:.4f} -> {loss_after:.4f} "
          f"(adapters reloaded: {loss_reloaded:.4f}, {lora['adapter_file_bytes']:,} bytes)")
    print(f"results: {o['output']}", flush=True)
    return report


def main(argv):
    del argv
    run(values(SPEC))


if __name__ == "__main__":
    cli.run(main, SPEC)
