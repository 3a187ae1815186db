r"""Trains the LSTM baseline (`txl_tf.baselines`) on the same corpus, stream,
schedule and optimizer as `training.train` (absl app).

    python -m training.train_lstm --dataset=pystdlib --model_dir=runs/lstm \
        --train_steps=1500

The batch of step s is the training job's (`txl_tf.data.segment_dataset`:
`--batch_size` contiguous streams, `--tgt_len` ids a segment), the state is
carried from segment to segment as Transformer-XL's memory is, Adam with the
job's linear warm-up and cosine decay and global-norm clip. One device, no
resume: a baseline for comparisons, trained in one go. Writes
`train_log.jsonl` and `export/` (`config.json`, `model.weights.h5`, `vocab/`;
`txl_tf.baselines.load_lstm` reads it), then evaluates on the valid split. A
previous run's log is `train_log.previous.jsonl` until the new model is saved.
"""
import json
import os
import time

from training.errors import TrainingError
from training.files import LOG_FILE, run_files_in, set_aside_log
from txl_tf.app import cli
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

SPEC = (
    option("string", "model_dir", None, "Where the log and export/ go."),
    option("string", "dataset", "pystdlib", "Corpus name (txl_tf.data.KNOWN_CORPORA)."),
    option("string", "data_dir", None, "The corpus folder (file for dataset=text)."),
    option("string", "cache_dir", None, "Where encoded corpora are cached."),
    option("multi_string", "corpus_option", [], "key=value options of load_corpus."),
    option("integer", "d_model", 220, "Embedding and hidden size (220 with 2 layers: about "
           "the small preset's parameters on a byte vocabulary)."),
    option("integer", "n_layer", 2, "LSTM layers."),
    option("float", "dropout", 0.1, "Dropout on embeddings and layer outputs."),
    option("integer", "tgt_len", 64, "Segment length (back-propagation through time)."),
    option("integer", "batch_size", 16, "Streams."),
    option("integer", "train_steps", 1000, "Optimizer steps."),
    option("float", "learning_rate", 1e-3, "Peak Adam learning rate."),
    option("integer", "warmup_steps", None, "Linear warm-up (default: a tenth of the steps, at "
           "most 4,000; 0: none)."),
    option("float", "min_lr_ratio", 0.004, "Final learning rate / peak (cosine decay)."),
    option("float", "clip", 0.25, "Global gradient-norm clip (0: none)."),
    option("integer", "seed", 0, "Seed of the weight initialisation."),
    option("integer", "log_every", 100, "Steps between train_log.jsonl lines."),
    option("bool", "final_eval", True, "Evaluate on the valid split at the end."),
    option("integer", "eval_batch_size", 8, "Streams during evaluation."),
    option("integer", "eval_max_segments", None, "Evaluate only this many segments."),
    option("bool", "progress", None, "Show progress on stderr (default: a bar on a terminal, "
           "else a line every 10%; --noprogress: none)."),
)


def _check(o):
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    in_the_way = path_in_the_way("model_dir", o["model_dir"])
    if in_the_way:
        raise TrainingError(in_the_way)
    from txl_tf.baselines import lstm_folder
    held = run_files_in(o["model_dir"]) if lstm_folder(o["model_dir"]) is None else []
    if held:  # its train_log.jsonl and export/ would be replaced by the LSTM's
        raise TrainingError(f"--model_dir: {o['model_dir']} holds a model or training run "
                            f"({', '.join(held)}), not an LSTM baseline; choose another "
                            "--model_dir")
    for name in ("d_model", "n_layer", "tgt_len", "batch_size", "train_steps", "log_every",
                 "eval_batch_size"):
        if o[name] < 1:
            raise TrainingError(f"--{name} must be a positive integer, got {o[name]}")
    if not 0 <= o["dropout"] < 1:
        raise TrainingError(f"--dropout must be in [0, 1), got {o['dropout']}")
    if not 0 < o["learning_rate"] < float("inf"):
        raise TrainingError(f"--learning_rate must be a finite number > 0, got "
                            f"{o['learning_rate']}")
    if not 0 <= o["clip"] < float("inf"):  # inf: NaN weights (inf x 0), not "no clip"
        raise TrainingError(f"--clip must be a finite number >= 0 (0: none), got {o['clip']}")
    if o["eval_max_segments"] is not None and o["eval_max_segments"] < 1:  # read after training
        raise TrainingError(f"--eval_max_segments must be a positive integer, got "
                            f"{o['eval_max_segments']}")
    if o["warmup_steps"] is not None and o["warmup_steps"] < 0:
        raise TrainingError(f"--warmup_steps must be >= 0, got {o['warmup_steps']}")
    if o["warmup_steps"] is not None and o["warmup_steps"] > o["train_steps"]:
        raise TrainingError(f"--warmup_steps ({o['warmup_steps']}) exceeds --train_steps "
                            f"({o['train_steps']})")
    if not 0 <= o["min_lr_ratio"] <= 1:
        raise TrainingError(f"--min_lr_ratio must be in [0, 1], got {o['min_lr_ratio']}")
    from training.train import check_seed
    check_seed(o["seed"])


def _check_fits(config):
    """Refuses an LSTM whose float32 weights, gradients and Adam's two moments
    (embedding, LSTMs and softmax: a lower bound) exceed this process's memory."""
    from txl_tf.checks.memory_budget import check_bytes
    d, n = config.d_model, config.n_token
    weights = 4 * (2 * n * d + n + config.n_layer * 4 * (2 * d * d + d))
    check_bytes({"weights, gradients and Adam's moments": 4 * weights}, "training the LSTM",
                advice="lower --d_model or --n_layer")


@logging_as_found()
def run(**options):
    """Trains with `options` (the flags by name); returns a summary dict."""
    o = merge(SPEC, options)
    _check(o)
    cli.quiet_tensorflow_import()
    import keras
    import tensorflow as tf

    from training import inputs
    from txl_tf.baselines import LSTMConfig, LSTMLanguageModel, lstm_folder, save_lstm
    from txl_tf.data import segment_dataset
    from txl_tf.learning.evaluation import evaluate_ids
    from txl_tf.layers.memory import Memory
    from txl_tf.learning.schedule import WarmupCosineDecay

    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"],
                         inputs.parse_options(o["corpus_option"]),
                         progress=False if o["progress"] is False else None,
                         outside=[("--model_dir", o["model_dir"])])
    train_ids = inputs.check_split(corpus, "train", o["batch_size"], o["tgt_len"], "training")
    if o["final_eval"]:
        inputs.check_valid_split(corpus, o["eval_batch_size"], "--nofinal_eval")
    config = LSTMConfig(n_token=corpus.tokenizer.vocab_size, d_model=o["d_model"],
                        n_layer=o["n_layer"], tgt_len=o["tgt_len"], dropout=o["dropout"],
                        vocab_fingerprint=corpus.tokenizer.fingerprint())
    _check_fits(config)
    keras.utils.set_random_seed(o["seed"])
    model = LSTMLanguageModel(config)
    model.build()
    schedule = WarmupCosineDecay(o["learning_rate"], o["train_steps"], o["warmup_steps"],
                                 o["min_lr_ratio"])
    optimizer = keras.optimizers.Adam(learning_rate=schedule, global_clipnorm=o["clip"] or None)
    optimizer.build(model.trainable_variables)
    state = [tf.Variable(t, trainable=False) for t in model.initial_memory(o["batch_size"])]

    @tf.function(jit_compile=False)
    def train_step(inputs_, labels):
        memory = Memory(state[0], state[1])
        with tf.GradientTape() as tape:
            nll, memory = model(inputs_, memory, targets=labels, training=True)
            loss = tf.reduce_mean(nll)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        state[0].assign(memory.mems)
        return loss

    params = sum(int(v.numpy().size) for v in model.trainable_variables)
    print(f"model: LSTM {config.n_layer} x {config.d_model}, {params:,} parameters, n_token "
          f"{config.n_token}, tgt_len {config.tgt_len}; corpus {corpus.name}: "
          f"{len(train_ids):,} training tokens", flush=True)
    os.makedirs(o["model_dir"], exist_ok=True)
    log_path = os.path.join(o["model_dir"], LOG_FILE)
    # A previous run's log is train_log.previous.jsonl until this run's model is saved.
    previous_log = set_aside_log(o["model_dir"], lstm_folder(o["model_dir"]) is not None)
    dataset = segment_dataset(train_ids, o["batch_size"], o["tgt_len"])
    start, losses = time.time(), []
    progress = cli.Progress("training the LSTM", enabled=o["progress"] is not False)
    with open(log_path, "w", encoding="utf-8") as log:
        for step, (inputs_, labels) in enumerate(dataset.take(o["train_steps"]), start=1):
            losses.append(float(train_step(inputs_, labels)))
            progress(step, o["train_steps"])
            if step % o["log_every"] == 0 or step == o["train_steps"]:
                mean = sum(losses) / len(losses)
                log.write(json.dumps({"step": step, "time": round(time.time() - start, 2),
                                      "loss": mean, "bpc": mean / 0.6931471805599453}) + "\n")
                log.flush()
                losses = []
    export_dir = os.path.join(o["model_dir"], "export")
    save_lstm(model, export_dir, corpus.tokenizer, replaces=[previous_log])
    print(f"trained {o['train_steps']} steps in {time.time() - start:.0f}s; exported the "
          f"model to {export_dir}", flush=True)
    final = None
    if o["final_eval"]:
        final = evaluate_ids(model, corpus.valid, batch_size=o["eval_batch_size"],
                             max_segments=o["eval_max_segments"],
                             progress=cli.Progress("evaluating valid",
                                                   enabled=o["progress"] is not False))
        print(f"valid bpc {final['bpc']:.4f}, ppl {final['ppl']:.3f}", flush=True)
    return {"step": o["train_steps"], "parameters": params, "export_dir": export_dir,
            "model_dir": o["model_dir"], "final_eval": final}


def main(argv):
    del argv
    run(**values(SPEC))


def console():
    """The installed command (see setup.py's console scripts)."""
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
