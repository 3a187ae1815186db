r"""Trains a Transformer-XL language model (absl app).

    python -m training.train --flagfile="$(python -m training.configs enwik8_base)" \
        --data_dir=data/enwik8 --model_dir=runs/enwik8_base

The job resumes from the newest checkpoint in `--model_dir` that can be
read (weights, Adam state, step, every replica's memory) and feeds the data
from that step on, so a killed job restarted with the same flags ends where
an uninterrupted one would. A restart on other data or batches is refused
(`checkpoints/run.json`), and so is a second job on a directory in use (an
flock that dies with its owner). Layout of `--model_dir`:

    .lock              held by the running chief (pid, host); .lock-worker-<k>
    config.json        the model's TransformerXLConfig (written at start), with the
                       fingerprint of its vocabulary
    vocab/             the corpus tokenizer the model reads with (written at start)
    flags.json         the options of the latest start
    checkpoints/       ckpt-<step>.* (chief); worker-<k>/ for other workers;
                       run.json: what they were trained on (training.run_record)
    logs/              TensorBoard: train/ (Keras), eval/ (validation)
    train_log.jsonl    step, lr and running metrics every --log_every steps
                       and at the last step
    eval_log.jsonl     validation results (step, loss, bpc, ppl, tokens), one
                       line per step (an evaluation again replaces its line)
    export/            the final model: config.json, weights.npz, vocab/
                       (load with txl_tf.weights.load_pretrained)
    batches.jsonl      only with --log_batches: step -> first ids per batch

One Keras "epoch" is --checkpoint_every steps. The batch of global step s is
a pure function of s (txl_tf.data streams); replica r always gets streams
[r*b, (r+1)*b). The memory is carried across data epochs, never reset. The
model's n_token is the corpus tokenizer's vocabulary size.
"""
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time

from training.errors import TrainingError
from training.files import save_vocab, trim_log, write_atomically
from txl_tf.app.flagspec import merge, option, values
from txl_tf.app.paths import path_in_the_way
from txl_tf.app.tf_logs import logging_as_found

MAX_CPU_DEVICES = 1024  # logical devices --num_cpu_devices may split the CPU into

SPEC = (
    option("string", "preset", "small", "Model preset (txl_tf.PRESETS)."),
    option("multi_string", "config_override", [],
           "field=value changes to the preset (JSON values), e.g. untie_r=false."),
    option("integer", "n_token", None, "Vocabulary size; default: the corpus tokenizer's. A "
                     "different value is an error."),
    option("float", "dropout", None, "Dropout (default: the preset's)."),
    option("float", "dropatt", None, "Attention dropout (default: the preset's)."),
    option("integer", "tgt_len", None, "Training segment length (default: the preset's)."),
    option("integer", "mem_len", None, "Training memory length (default: the preset's)."),
    option("string", "dataset", "pystdlib", "Corpus name (txl_tf.data.KNOWN_CORPORA)."),
    option("string", "data_dir", None, "The corpus folder (file for dataset=text)."),
    option("string", "cache_dir", None, "Where encoded corpora are cached (default: "
                    "$TXL_TF_CACHE, else $XDG_CACHE_HOME/txl_tf or ~/.cache/txl_tf)."),
    option("multi_string", "corpus_option", [], "key=value options of load_corpus, e.g. "
                          "max_bytes=1000000."),
    option("integer", "document_separator", None, "The corpus is separate documents, each "
           "ending at this id (e.g. a word vocabulary's <eos> for one document per line): "
           "each batch row reads documents one after another and its memory is cleared at "
           "each document's start. Default: one continuous stream (the paper's)."),
    option("string", "model_dir", None, "Checkpoints, logs and the exported model."),
    option("enum", "strategy", "auto", "tf.distribute strategy.",
           ["auto", "one_device", "mirrored", "multi_worker", "tpu"]),
    option("string", "tpu", None, "TPU name or address (strategy tpu)."),
    option("integer", "num_cpu_devices", 0, "Split the CPU into this many logical devices "
                     "(to try mirrored without accelerators)."),
    option("integer", "batch_size", 16, "Global batch size (streams), split over replicas."),
    option("integer", "train_steps", 1000, "Total optimizer steps."),
    option("float", "learning_rate", None, "Peak Adam learning rate (default: 1e-3 for the "
                   "tiny and small presets, the paper's 2.5e-4 for the others)."),
    option("integer", "warmup_steps", None, "Linear warm-up steps (default: a tenth of "
                     "--train_steps, at most 4,000; 0: none)."),
    option("float", "min_lr_ratio", 0.004, "Final learning rate / peak (cosine decay)."),
    option("float", "clip", 0.25, "Global gradient-norm clip (0: none)."),
    option("float", "adam_epsilon", 1e-8, "Adam epsilon (the paper's TF/PyTorch default)."),
    option("float", "adam_beta1", 0.9, "Adam beta_1 (the paper's)."),
    option("float", "adam_beta2", 0.999, "Adam beta_2 (the paper's)."),
    option("enum", "mixed_precision", "auto", "Keras dtype policy; auto: mixed_bfloat16 where "
                     "the hardware has native bfloat16 (AVX512-BF16/AMX CPUs, Ampere+ GPUs, "
                     "TPUs), else float32 (none).",
           ["auto", "none", "mixed_float16", "mixed_bfloat16"]),
    option("bool", "jit_compile", None, "XLA-compile the train step (default: auto, on for "
                   "GPUs and TPUs, off on CPUs and under mirrored over several devices)."),
    option("integer", "steps_per_execution", 0, "Training steps per call of the compiled "
                     "train function (Keras's steps_per_execution; fewer calls from Python, "
                     "which an accelerator waits on). It must divide --log_every, "
                     "--checkpoint_every, --eval_every and --train_steps. 0: the largest "
                     "such number up to 32 that also divides the step resumed from (also used "
                     "where a given N does not)."),
    option("string", "profile_steps", None, "START,END: record TensorFlow's profile of the "
                    "train-function calls that end at global steps START to END into "
                    "<model_dir>/logs/train (TensorBoard's Profile tab; needs the "
                    "tensorboard package)."),
    option("integer", "seed", 0, "Seed of the weight initialisation."),
    option("integer", "checkpoint_every", 1000, "Checkpoint every N steps (and at the end)."),
    option("integer", "keep_checkpoints", 3, "Checkpoints kept."),
    option("integer", "eval_every", 0, "Evaluate on the valid split every N steps (0: only at "
                     "the end)."),
    option("bool", "final_eval", True, "Evaluate on the valid split at the end."),
    option("integer", "eval_batch_size", 8, "Streams during evaluation."),
    option("integer", "eval_tgt_len", None, "Evaluation segment length (default: tgt_len)."),
    option("integer", "eval_mem_len", None, "Evaluation memory length (default: mem_len)."),
    option("integer", "eval_max_segments", None, "Evaluate only this many segments (quick "
                     "estimate; default: the whole split)."),
    option("integer", "log_every", 100, "Steps between train_log.jsonl lines."),
    option("integer", "verbose", 1, "Keras fit verbosity: 0 silent, 1 progress bar (on a "
                     "terminal; else a plain line every --log_every steps), 2 a line per "
                     "epoch."),
    option("float", "max_time_s", 0, "Stop (checkpoint and export) after this many seconds "
                   "of training (0: no limit)."),
    option("bool", "log_batches", False, "Record each batch's step and first ids in "
                  "batches.jsonl (single replica; for tests)."),
)


# Peak learning rates without --learning_rate. The paper's presets keep its
# 2.5e-4 (its runs last 200k+ steps); the small ones train for thousands, where
# 1e-3 with the default warm-up lands at held-out ppl 217 against 286 at 2.5e-4,
# as tightly over seeds (benchmarks/README.md, "Quality over seeds"). Adam's
# beta_2 stays the paper's 0.999: 0.98 lets 1.25e-3 train 3.5% lower, but at
# 1e-3 it lands 1-3% higher on every seed ("The defaults' search").
SMALL_PRESET_LEARNING_RATE = {"tiny": 1e-3, "small": 1e-3}
PAPER_LEARNING_RATE = 2.5e-4


def default_learning_rate(preset):
    """The peak learning rate of a preset when none is given."""
    return SMALL_PRESET_LEARNING_RATE.get(preset, PAPER_LEARNING_RATE)


def _check_options(o):
    """Checks of the flags' values alone (nothing imported: fails fast)."""
    if not o["model_dir"]:
        raise TrainingError("--model_dir is required")
    in_the_way = path_in_the_way("model_dir", o["model_dir"], utf8_paths=True)  # TF checkpoints
    if in_the_way:
        raise TrainingError(in_the_way)
    for name in ("batch_size", "train_steps", "checkpoint_every", "log_every",
                 "eval_batch_size", "keep_checkpoints"):
        if o[name] is None or o[name] <= 0:
            raise TrainingError(f"--{name} must be a positive integer, got {o[name]}")
    for name in ("tgt_len", "eval_tgt_len", "eval_max_segments"):
        if o[name] is not None and o[name] <= 0:
            raise TrainingError(f"--{name} must be a positive integer, got {o[name]}")
    for name in ("mem_len", "eval_mem_len", "warmup_steps", "eval_every"):
        if o[name] is not None and o[name] < 0:
            raise TrainingError(f"--{name} must be >= 0, got {o[name]}")
    if o["warmup_steps"] is not None and o["warmup_steps"] > o["train_steps"]:
        raise TrainingError(f"--warmup_steps ({o['warmup_steps']}) exceeds --train_steps "
                            f"({o['train_steps']})")
    if o["learning_rate"] is not None and not 0 < o["learning_rate"] < float("inf"):
        raise TrainingError(f"--learning_rate must be a finite number > 0, got "
                            f"{o['learning_rate']}")
    if not 0 <= o["min_lr_ratio"] <= 1:
        raise TrainingError(f"--min_lr_ratio must be in [0, 1], got {o['min_lr_ratio']}")
    if not 0 <= o["clip"] < float("inf"):  # inf: NaN weights (inf x 0), not "no clip"
        raise TrainingError(f"--clip must be a finite number >= 0 (0: none), got {o['clip']}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= o[name] < 1:
            raise TrainingError(f"--{name} must be in [0, 1), got {o[name]}")
    if o["document_separator"] is not None and o["document_separator"] < 0:
        raise TrainingError(f"--document_separator must be an id >= 0, got "
                            f"{o['document_separator']}")
    if o["log_batches"] and o["document_separator"] is not None:
        raise TrainingError("--log_batches reads the continuous stream: it does not go with "
                            "--document_separator")
    _profile_steps(o)
    if o["steps_per_execution"] < 0:
        raise TrainingError(f"--steps_per_execution must be >= 0, got "
                            f"{o['steps_per_execution']}")
    if o["steps_per_execution"]:
        cadences = _cadences(o)
        wrong = [f"--{name} {every}" for name, every in cadences
                 if every % o["steps_per_execution"]]
        if wrong:
            raise TrainingError(f"--steps_per_execution {o['steps_per_execution']} does not "
                                f"divide {', '.join(wrong)}: events would fall inside a call")
    if not 0 < o["adam_epsilon"] < float("inf"):  # inf: every update is 0
        raise TrainingError(f"--adam_epsilon must be a finite number > 0, got "
                            f"{o['adam_epsilon']}")
    check_seed(o["seed"])
    if not o["max_time_s"] >= 0:  # NaN too (inf: no limit)
        raise TrainingError(f"--max_time_s must be >= 0 (0: no limit), got {o['max_time_s']}")
    if not 0 <= o["num_cpu_devices"] <= MAX_CPU_DEVICES:  # a list of that many configs
        raise TrainingError(f"--num_cpu_devices must be in [0, {MAX_CPU_DEVICES}], got "
                            f"{o['num_cpu_devices']}")
    if o["verbose"] not in (0, 1, 2):
        raise TrainingError(f"--verbose must be 0, 1 or 2, got {o['verbose']}")


MAX_SEED = 2 ** 32 - 1  # what keras.utils.set_random_seed (numpy's legacy seeding) takes


def check_seed(seed):
    """Raises `TrainingError` unless `seed` (the `--seed` flag) is in [0, MAX_SEED]."""
    if not 0 <= seed <= MAX_SEED:
        raise TrainingError(f"--seed must be in [0, {MAX_SEED}], got {seed}")


MAX_STEPS_PER_EXECUTION = 32  # a signal or --max_time_s stops after the call in flight


def _profile_steps(o):
    """`(start, end)` of `--profile_steps`, or None."""
    if not o["profile_steps"]:
        return None
    try:
        start, end = (int(part) for part in o["profile_steps"].split(","))
    except ValueError:
        start = end = None
    if start is None or not 0 < start <= end <= o["train_steps"]:
        raise TrainingError(f"--profile_steps must be START,END with 0 < START <= END <= "
                            f"--train_steps, got {o['profile_steps']!r}")
    return start, end


def _cadences(o):
    """`(flag, steps)` of the events the job acts on between steps."""
    named = [(name, o[name]) for name in ("log_every", "checkpoint_every", "train_steps")]
    profile = _profile_steps(o)
    return (named + ([("eval_every", o["eval_every"])] if o["eval_every"] else []) +
            ([("profile_steps", profile[0]), ("profile_steps", profile[1])] if profile else []))


def steps_per_execution(o, start_step):
    """Steps per call of the train function: `--steps_per_execution` where
    it divides `start_step`, else the largest number up to
    `MAX_STEPS_PER_EXECUTION` dividing every cadence and `start_step` (so
    each call ends on a step where something may happen: a log line, a
    checkpoint, an evaluation, the last step), and the flag's value when
    one was given (never more per call than asked for)."""
    if o["steps_per_execution"] and start_step % o["steps_per_execution"] == 0:
        return o["steps_per_execution"]
    period = math.gcd(start_step, o["steps_per_execution"] or 0,
                      *(every for _, every in _cadences(o)))
    return max(k for k in range(1, MAX_STEPS_PER_EXECUTION + 1) if period % k == 0)


def _model_overrides(o):
    from training.model_config import parse_overrides
    overrides = parse_overrides(o["config_override"])
    for name in ("dropout", "dropatt", "tgt_len", "mem_len"):
        if o[name] is not None:
            overrides[name] = o[name]
    return overrides


@logging_as_found()
def run(**options):
    """Trains with `options` (the flags, by name; see `SPEC`) and
    returns a summary dict (final step, last metrics, validation results,
    export path). Raises `TrainingError` for bad input, for a model
    directory that another job owns, and for checkpoints of another run."""
    o = merge(SPEC, options)
    if o["learning_rate"] is None:
        o["learning_rate"] = default_learning_rate(o["preset"])
    _check_options(o)
    from txl_tf import PRESETS
    if o["preset"] not in PRESETS:
        raise TrainingError(f"unknown preset {o['preset']!r}; known presets: "
                            f"{', '.join(sorted(PRESETS))}")

    from training.strategy import split_cpu
    if o["num_cpu_devices"]:
        split_cpu(o["num_cpu_devices"])

    from training.lock import DirectoryLock, lock_path
    from training.strategy import gpu_setup_warning, make_strategy, worker_info

    try:
        strategy = make_strategy(o["strategy"], o["tpu"])
    except ValueError as err:
        raise TrainingError(f"--strategy: {err}") from None
    task_id, is_chief, workers = worker_info(strategy)
    unused_gpu = gpu_setup_warning()
    if unused_gpu and is_chief:
        _warn(unused_gpu)
    if o["log_batches"] and strategy.num_replicas_in_sync > 1:
        raise TrainingError(f"--log_batches needs a single replica; the "
                            f"{type(strategy).__name__} has {strategy.num_replicas_in_sync}")
    if o["max_time_s"] and workers > 1:
        raise TrainingError("--max_time_s needs a single worker (workers would stop at "
                            "different steps)")
    model_dir = o["model_dir"]
    existed = os.path.isdir(model_dir)
    unused = not existed or not os.listdir(model_dir)
    _check_not_a_saved_model(model_dir)
    try:
        os.makedirs(model_dir, exist_ok=True)
    except OSError as err:
        raise TrainingError(f"--model_dir: cannot create {model_dir} ({err.strerror or err}); "
                            "choose another --model_dir") from None
    owner = f"--model_dir {model_dir}" + ("" if is_chief else f" (worker {task_id})")
    lock = DirectoryLock(lock_path(model_dir, task_id, is_chief), owner)
    try:
        return _train(o, strategy, task_id, is_chief)
    except BaseException:
        from training.checkpointing import checkpoint_dir, has_checkpoints
        if is_chief and unused and not has_checkpoints(checkpoint_dir(model_dir)):
            lock.release()  # a failed first start leaves the directory as it found it
            _empty(model_dir, remove=not existed)
        raise
    finally:
        lock.release()


def _check_not_a_saved_model(model_dir):
    """Refuses a folder holding a saved model (`save_pretrained`, `txl-convert`,
    a run's export/) and no checkpoints: the job would not read its weights,
    and would write a run's files (vocab/, config.json, a lock) into it; and
    one holding the LSTM baseline's run (`txl-train-lstm`)."""
    from training.checkpointing import checkpoint_dir, has_checkpoints
    from txl_tf.baselines import lstm_folder
    if (os.path.isfile(os.path.join(model_dir, "weights.npz"))
            and not has_checkpoints(checkpoint_dir(model_dir))):
        raise TrainingError(
            f"--model_dir {model_dir} holds a saved model (weights.npz), not a training run: "
            "txl-train starts from its own initialisation and would write its files beside "
            "that model's; choose another --model_dir")
    lstm = lstm_folder(model_dir)
    if lstm is not None:  # its train_log.jsonl and export/ would be replaced
        raise TrainingError(f"--model_dir {model_dir} holds the LSTM baseline of txl-train-lstm "
                            f"(in {lstm}), not a Transformer-XL run; choose another --model_dir")


def _empty(folder, remove):
    """Deletes what is in `folder` (and `folder` itself if `remove`)."""
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)


def _killed_first_start(model_dir):
    """Whether `model_dir` is what a first start killed before its first
    checkpoint leaves: its `flags.json` and a readable `config.json`, no
    checkpoints and no export (a folder of another kind, e.g. a keras-hub
    preset, is not)."""
    from training.checkpointing import checkpoint_dir, has_checkpoints
    from txl_tf.config import TransformerXLConfig
    try:
        TransformerXLConfig.from_json(os.path.join(model_dir, "config.json"))
    except (ValueError, OSError):  # not a TransformerXL config
        return False
    return os.path.isfile(os.path.join(model_dir, "flags.json")) and not (
        has_checkpoints(checkpoint_dir(model_dir)) or any(
            os.path.exists(os.path.join(model_dir, *path))
            for path in (("export", "weights.npz"), ("weights.npz",))))


def _warn(message):
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _train(o, strategy, task_id, is_chief):
    """`run` once this task owns its part of the model directory. A worker
    other than the chief writes its TensorBoard logs into a temporary folder,
    removed on return (each run left one behind)."""
    with (contextlib.nullcontext() if is_chief else
          tempfile.TemporaryDirectory(prefix=f"txl-worker{task_id}-logs-")) as scratch:
        return _train_in(o, strategy, task_id, is_chief, scratch)


def _train_in(o, strategy, task_id, is_chief, scratch):
    import keras
    import tensorflow as tf

    from txl_tf import TransformerXLLM
    from txl_tf.weights import save_pretrained
    from txl_tf.checks.memory_budget import check_fits
    from training import inputs, run_record
    from training.callbacks import (CompileTime, GlobalStepTensorBoard, MetricWindow, ProgressBar,
                                    ProgressLine, StepEvents, StepLog, StopOnNonFinite,
                                    StopOnSignal, TimeLimit, tensorboard_available)
    from training.checkpointing import (TrainingCheckpoint, checkpoint_dir, has_checkpoints,
                                        remove_stale_temporaries)
    from training.model_config import build_config, check_resumable
    from txl_tf.app.progress import interactive
    from txl_tf.learning.optimizer import ReplicaClippedAdam
    from txl_tf.keras_support.precision import resolve as resolve_precision
    from txl_tf.learning.schedule import WarmupCosineDecay
    from training.train_data import release_input_iterators, training_input
    from training.validation import Validator
    from training import xla_cache

    def log(message):
        if is_chief:
            print(message, flush=True)

    replicas = strategy.num_replicas_in_sync
    precision = resolve_precision(o["mixed_precision"], o["jit_compile"], strategy)
    log(f"precision: {precision.describe()}")
    if precision.policy == "mixed_float16" and replicas > 1:
        raise TrainingError(
            "--mixed_precision=mixed_float16 with several replicas is not supported: Keras's "
            "loss scaling checks each replica's gradients for overflow before they are "
            "summed, so one replica's inf can reach the weights; use mixed_bfloat16")
    if o["batch_size"] % replicas:
        raise TrainingError(f"--batch_size {o['batch_size']} is not divisible by the "
                            f"{replicas} replicas of the {type(strategy).__name__}")

    model_dir = o["model_dir"]
    ckpt_dir = checkpoint_dir(model_dir, task_id, is_chief)

    corpus_options = inputs.parse_options(o["corpus_option"])
    corpus = inputs.load(o["dataset"], o["data_dir"], o["cache_dir"], corpus_options,
                         progress=False if o["verbose"] == 0 else None,
                         outside=[("--model_dir", model_dir)])
    config = build_config(o["preset"], corpus.tokenizer.vocab_size, o["n_token"],
                          {**_model_overrides(o),
                           "vocab_fingerprint": corpus.tokenizer.fingerprint()}, log=log)
    train_ids = inputs.check_split(corpus, "train", o["batch_size"], config.tgt_len,
                                   "training")
    check_fits(config, o["batch_size"] // replicas, config.tgt_len, config.mem_len,
               training=True, what="a training step")
    eval_tgt_len = o["eval_tgt_len"] or config.tgt_len
    eval_mem_len = config.mem_len if o["eval_mem_len"] is None else o["eval_mem_len"]
    evaluating = o["final_eval"] or o["eval_every"] > 0
    if evaluating:
        check_fits(config, o["eval_batch_size"], eval_tgt_len, eval_mem_len,
                   what="an evaluation step")
    valid_ids = (inputs.check_valid_split(corpus, o["eval_batch_size"],
                                          "--nofinal_eval --eval_every=0")
                 if evaluating else None)
    character_level = inputs.is_character_level(corpus.tokenizer)

    record = run_record.describe(o["dataset"], o["data_dir"], corpus_options,
                                 o["batch_size"], config.tgt_len, replicas,
                                 corpus.tokenizer.vocab_size, train_ids,
                                 o["document_separator"],
                                 loss_scaling=precision.policy == "mixed_float16")
    record_path = os.path.join(checkpoint_dir(model_dir), run_record.RUN_RECORD)
    if has_checkpoints(ckpt_dir):
        run_record.check(record, record_path)
    config_path = os.path.join(model_dir, "config.json")
    if is_chief:
        try:
            check_resumable(config, config_path)
        except TrainingError:
            if not _killed_first_start(model_dir):
                raise
            # A first start killed before its first checkpoint (SIGKILL, the
            # OOM killer) trained nothing: the corrected retry goes ahead.
            _warn(f"{config_path} is of another model, from a run stopped before its first "
                  "checkpoint (nothing was trained): replaced by this run's")
    # Checked: from here on the job may write into the model directory.
    for name in remove_stale_temporaries(ckpt_dir):
        _warn(f"removed {os.path.join(ckpt_dir, name)}, left by an interrupted save")
    if is_chief:  # other workers may see the chief's files half-written
        write_atomically(config_path, config.to_json() + "\n")
        save_vocab(corpus.tokenizer, os.path.join(model_dir, "vocab"))
        write_atomically(os.path.join(model_dir, "flags.json"),
                         json.dumps(o, indent=2, sort_keys=True) + "\n")
        write_atomically(record_path, json.dumps(record, indent=2, sort_keys=True) + "\n")

    keras.utils.set_random_seed(o["seed"])
    schedule = WarmupCosineDecay(o["learning_rate"], o["train_steps"], o["warmup_steps"],
                                 o["min_lr_ratio"])
    previous_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision.policy)  # the model keeps it; the global is restored
    try:
        with strategy.scope():
            model = TransformerXLLM(config, batch_size=o["batch_size"] // replicas)
            optimizer = ReplicaClippedAdam(learning_rate=schedule, epsilon=o["adam_epsilon"],
                                           beta_1=o["adam_beta1"], beta_2=o["adam_beta2"],
                                           global_clipnorm=o["clip"] or None)
            model.compile(optimizer=optimizer, jit_compile=precision.jit_compile)
            model.optimizer.build(model.trainable_variables)
    finally:
        keras.config.set_dtype_policy(previous_policy)
    if model.jit_compile != precision.jit_compile:
        _warn("XLA was chosen but Keras compiles the train step without it (op determinism "
              "is enabled, or a layer does not support XLA): expect a slower step")
    checkpoint = TrainingCheckpoint(model, model.optimizer, ckpt_dir, strategy,
                                    max_to_keep=o["keep_checkpoints"])
    restored = checkpoint.restore_latest(warn=_warn)
    step = checkpoint.step
    if is_chief:  # a run killed after its last checkpoint logged steps it trains again
        for name in ("train_log.jsonl", "eval_log.jsonl"):
            dropped = trim_log(os.path.join(model_dir, name), step)
            if dropped:
                log(f"{name}: dropped {dropped} line(s) past step {step}, logged by a run "
                    "stopped after its last checkpoint")
    # Set after the restore (nothing is traced yet): the step resumed from
    # decides it.
    model.steps_per_execution = steps_per_execution(o, step)
    if o["steps_per_execution"] and model.steps_per_execution != o["steps_per_execution"]:
        _warn(f"--steps_per_execution {o['steps_per_execution']} does not divide the step "
              f"resumed from ({step}): {model.steps_per_execution} step(s) per call in this run")
    if replicas > 1 and model.steps_per_execution > 1 and isinstance(
            strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        # Keras's train function of several steps fails on its first call
        # there ("You must feed a value for placeholder tensor", keras-team/keras#19246).
        if o["steps_per_execution"] > 1:
            _warn(f"--steps_per_execution {o['steps_per_execution']}: Keras runs several steps "
                  f"per call on one replica only; 1 step per call on the {replicas} replicas")
        model.steps_per_execution = 1
    params = sum(int(v.numpy().size) for v in model.core.trainable_weights)
    log(f"model: preset {o['preset']}, {params:,} parameters, n_token {config.n_token}, "
        f"tgt_len {config.tgt_len}, mem_len {config.mem_len}; {type(strategy).__name__} with "
        f"{replicas} replica(s) x batch {o['batch_size'] // replicas}; corpus {corpus.name}: "
        f"{len(train_ids):,} training tokens")
    log(f"learning rate: peak {o['learning_rate']:g}, linear warm-up over "
        f"{schedule.warmup_steps:,} steps, cosine decay to {o['min_lr_ratio']:g} x peak at "
        f"step {o['train_steps']:,}; Adam beta_2 {o['adam_beta2']:g}, clip {o['clip']:g}")
    log(f"resumed from {restored} at step {step}" if restored else "starting at step 0")
    cache = xla_cache.directory() if model.jit_compile else None
    log(f"train step: {model.steps_per_execution} step(s) per call, "
        f"{'XLA' if model.jit_compile else 'no XLA'}" + (f", XLA cache {cache}" if cache else ""))

    tensorboard = tensorboard_available()
    if not tensorboard:
        if o["profile_steps"]:
            raise TrainingError("--profile_steps needs the tensorboard package")
        log("TensorBoard logs off: the tensorboard package is not installed")
    validator = None
    if evaluating and is_chief:
        # Progress lines where the output is a log (a terminal shows the bar
        # of the training, whose line a second one would break).
        validator = Validator(model.core, valid_ids, model_dir, o["eval_batch_size"],
                              eval_tgt_len, eval_mem_len, o["eval_max_segments"],
                              character_level, tensorboard, log,
                              progress_lines=o["verbose"] == 1 and not interactive())

    timer = TimeLimit(o["max_time_s"]) if o["max_time_s"] else None
    saved = {"step": step if restored else None}

    def on_step(now):
        if now % o["checkpoint_every"] == 0 or now >= o["train_steps"]:
            checkpoint.save()
            saved["step"] = now
        if validator and o["eval_every"] and now % o["eval_every"] == 0 \
                and now < o["train_steps"]:
            validator(now)
        return now >= o["train_steps"]

    history = {}
    compile_time = CompileTime()
    # Workers of a multi-worker run must stop at the same step; a signal there
    # keeps its default effect (the run resumes from its last checkpoint).
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    bar = is_chief and o["verbose"] == 1 and interactive()  # `ProgressBar`, below
    stop = None if multi_worker else StopOnSignal(after_bar=bar)
    if step < o["train_steps"]:
        # Non-finite losses and weights stop the job before on_step could save them.
        finite = StopOnNonFinite(lambda: saved["step"], precision.policy)
        # A step's log line before its checkpoint: a kill between the two
        # leaves every step up to the checkpoint logged (a resume drops the
        # lines past it).
        step_log = ([StepLog(os.path.join(model_dir, "train_log.jsonl"), o["log_every"],
                             schedule=schedule, compile_time=compile_time)]
                    if is_chief else [])
        callbacks = ([compile_time, MetricWindow(o["checkpoint_every"]), finite, *step_log,
                      StepEvents(on_step)] + ([stop] if stop else []))
        if tensorboard:
            log_dir = os.path.join(model_dir, "logs") if is_chief else scratch
            callbacks.append(GlobalStepTensorBoard(log_dir=log_dir, update_freq=o["log_every"],
                                                   profile_batch=_profile_steps(o) or 0))
        verbose = o["verbose"] if is_chief else 0
        if verbose == 1:  # a bar over --train_steps on a terminal, else plain lines
            display = (ProgressBar(o["train_steps"], compile_time=compile_time) if bar else
                       ProgressLine(o["train_steps"], o["log_every"],
                                    o["batch_size"] * config.tgt_len, schedule, log,
                                    compile_time=compile_time))
            # Its heartbeat stops as the call returns, before the step's evaluation.
            callbacks = [display.call_returned(), *callbacks, display]
            verbose = 0
        if timer:
            callbacks.append(timer)
        per_epoch = o["checkpoint_every"]
        first_epoch = step // per_epoch
        epochs = first_epoch + -(-(o["train_steps"] - step) // per_epoch)
        batch_log = os.path.join(model_dir, "batches.jsonl") if o["log_batches"] else None
        try:
            dataset = training_input(strategy, train_ids, o["batch_size"], config.tgt_len,
                                     start_step=step, batch_log=batch_log,
                                     document_separator=o["document_separator"])
        except ValueError as err:
            raise TrainingError(str(err)) from None
        if cache and not xla_cache.align_function_ids():
            _warn("TensorFlow traced too many functions before the train step: its program "
                  f"in the XLA cache {cache} will not be found by a resumed run")
        with stop.installed() if stop else contextlib.nullcontext():
            try:
                fit = model.fit(dataset, steps_per_epoch=per_epoch, epochs=epochs,
                                initial_epoch=first_epoch, callbacks=callbacks, shuffle=False,
                                verbose=verbose)
            except BaseException:
                for callback in callbacks:  # a TensorBoard's writer, a heartbeat's thread
                    if hasattr(callback, "end_after_failure"):
                        callback.end_after_failure()
                raise
            release_input_iterators()
            history = {k: float(v[-1]) for k, v in fit.history.items() if v}
            step = checkpoint.step
            if saved["step"] != step:  # a second signal here ends the job at once
                checkpoint.save()
        if stop and stop.received:
            log(f"stopped by {signal.Signals(stop.received).name} at step {step}: saved "
                f"{checkpoint.manager.latest_checkpoint}; the same command resumes from there")
            return {"step": step, "interrupted": stop.received, "model_dir": model_dir,
                    "final_eval": None}
        if timer and timer.reached:
            log(f"time limit of {o['max_time_s']:.0f}s reached at step {step}")
    else:
        log(f"nothing to train: step {step} >= --train_steps {o['train_steps']}")

    export_dir = os.path.join(model_dir, "export")
    final = None
    if is_chief:
        save_pretrained(model.core, export_dir, corpus.tokenizer)
        log(f"exported the model to {export_dir}")
        if o["final_eval"]:
            final = validator(step)
    return {"step": step, "train": history, "final_eval": final,
            "evaluations": validator.results if validator else [],
            "export_dir": export_dir, "model_dir": model_dir, "parameters": params,
            "character_level": character_level, "replicas": replicas,
            "steps_per_execution": model.steps_per_execution,
            "jit_compile": bool(model.jit_compile), "compile_s": compile_time.seconds}


def main(argv):
    """The command-line entry (run through `txl_tf.app.cli.run`: bad input is
    one `error:` line and exit status 2)."""
    from txl_tf.app import cli
    options = values(SPEC)
    start = time.time()
    _check_options(merge(SPEC, options))  # bad flags fail before TensorFlow loads
    cli.quiet_tensorflow_import()
    result = run(**options)
    if result.get("interrupted"):
        sys.stdout.flush()
        sys.exit(128 + result["interrupted"])  # the shell's code for "killed by this signal"
    if result and result["final_eval"]:
        e = result["final_eval"]
        print(f"done: step {result['step']}, valid bpc {e['bpc']:.4f}, ppl {e['ppl']:.3f} "
              f"({time.time() - start:.0f}s)", flush=True)
    sys.stdout.flush()


def console():
    """The installed command (see setup.py's console scripts)."""
    from txl_tf.app import cli
    cli.run(main, SPEC, doc=__doc__)


if __name__ == "__main__":
    console()
