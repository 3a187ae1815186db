"""Bad input, table by table: the core, the runtimes, raw onnxruntime, and every
command-line job. Each CLI case ends in one `error:` line matching the
table's pattern, exit status 2, no traceback, no TensorFlow start-up noise, and
no change to the files of earlier runs."""
import hashlib
import importlib
import os
import re
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from export import (RuntimeInputError, export_onnx, export_saved_model, open_runtime,
                    run_export)
from job_helpers import job_env, run_job, write_text_corpus
from txl_tf import InputError, Memory, TransformerXL, TransformerXLConfig
from txl_tf.text import ByteTokenizer
from txl_tf.weights import save_pretrained
from txl_tf.weights.checkpoints import weight_dict

MEM_LEN = 4
NOISE = re.compile(r"cuInit|cudart_stub|port\.cc|cuda_platform|InitializeLog")


def _model_dir(path, core, vocab=True):
    save_pretrained(core, str(path))
    if vocab:
        ByteTokenizer().save(str(path / "vocab"))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """`root/`: model/ (config, weights, vocab), run/ (a training run: config,
    checkpoints/ckpt-2, export/), run_noexport/, broken/ (truncated
    weights.npz), empty/ (empty weights.npz), novocab/, lstm/ (what marks
    an LSTM baseline's run), wt2/ (a word corpus); `scratch/` for outputs
    and caches (not part of the snapshot)."""
    base = tmp_path_factory.mktemp("bad_inputs")
    root, scratch = base / "root", base / "scratch"
    scratch.mkdir()
    core = TransformerXL(TransformerXLConfig.preset("tiny", tgt_len=8, mem_len=8))
    _model_dir(root / "model", core)
    for run in ("run", "run_noexport"):
        (root / run).mkdir(parents=True)
        core.config.to_json(str(root / run / "config.json"))
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(weights=weight_dict(core)),
                                             str(root / run / "checkpoints"), max_to_keep=2)
        manager.save(checkpoint_number=2)
    _model_dir(root / "run" / "export", core)
    shutil.copytree(root / "run_noexport", root / "run_cut")  # its checkpoint's data cut short
    (data,) = (root / "run_cut" / "checkpoints").glob("ckpt-2.data-*")
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 10])
    weights = (root / "model" / "weights.npz").read_bytes()
    _model_dir(root / "broken", core)
    (root / "broken" / "weights.npz").write_bytes(weights[:len(weights) // 2])
    _model_dir(root / "empty", core)
    (root / "empty" / "weights.npz").write_bytes(b"")
    _model_dir(root / "novocab", core, vocab=False)
    (root / "lstm" / "export").mkdir(parents=True)  # what tells an LSTM baseline's run
    (root / "lstm" / "export" / "config.json").write_text('{"model": "lstm"}')
    (root / "lstm" / "train_log.jsonl").write_text('{"step": 1}\n')
    corpus = write_text_corpus(scratch / "corpus.txt", 3_000)
    (root / "wt2").mkdir()
    for split in ("train", "valid", "test"):  # a word corpus's folder (wt2's layout)
        (root / "wt2" / f"{split}.txt").write_text("a b c\n", encoding="utf-8")
    (scratch / "latin1.txt").write_bytes("caf\xe9 --x\n".encode("latin-1"))  # not UTF-8
    (scratch / "labels.tsv").write_text("a\tone\nb\ttwo\n", encoding="utf-8")  # classify's
    exported = scratch / "exported"
    export_saved_model(core, str(exported / "saved_model"), MEM_LEN)
    export_onnx(core, str(exported / "model.onnx"), MEM_LEN)
    truncated = scratch / "truncated"  # an export cut short (a full disk, a bad copy)
    shutil.copytree(exported, truncated)
    for name in ("model.onnx", "saved_model/saved_model.pb"):
        data = (truncated / name).read_bytes()
        (truncated / name).write_bytes(data[:len(data) // 2])
    run_export(str(scratch / "full"), str(root / "model"), formats=("saved_model", "onnx"),
               verify=False)  # with model.onnx.data and the decode graphs
    for name in ("saved_model/variables/variables.data-00000-of-00001", "model.onnx.data",
                 "decode_step.onnx"):  # each cut short in a copy of its own
        cut = scratch / ("cut_" + name.split("/")[-1].split(".")[0])
        shutil.copytree(scratch / "full", cut)
        data = (cut / name).read_bytes()
        (cut / name).write_bytes(data[:len(data) // 10])
    return {"root": root, "scratch": scratch, "corpus": corpus, "core": core,
            "exported": exported}


def snapshot(root):
    """`{relative path: (size, mtime_ns, sha256)}` of every file under `root`,
    except training's lock files (`.lock*`), which record the latest job that
    tried the directory (`training.lock`), whether or not it was refused."""
    state = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.startswith(".lock"):
                continue
            path = os.path.join(folder, name)
            info = os.stat(path)
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            state[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns, digest)
    return state


# ------------------------------------------------------------------- the core
def _memory(batch=2, n_layer=2, d_model=32, mem_len=MEM_LEN, mask_dtype=bool):
    return Memory(np.zeros([n_layer, batch, mem_len, d_model], np.float32),
                  np.zeros([batch, mem_len], mask_dtype))


IDS = np.array([[1, 2, 3], [4, 5, 6]], np.int32)

CORE_CASES = [  # (id, token_ids, memory, message pattern)
    ("float_ids", IDS.astype(np.float32), _memory(), r"token_ids must be integers, got dtype "
                                                     r"float32"),
    ("id_too_large", np.array([[1, 256]]), _memory(batch=1),
     r"token id 256 at position \(0, 1\) is out of range for a vocabulary of 256 tokens"),
    ("negative_id", np.array([[-1, 2]]), _memory(batch=1), r"token id -1 at position \(0, 0\)"),
    ("rank_3_ids", IDS[None], _memory(), r"token_ids must be \[batch, length\]"),
    ("layers", IDS, _memory(n_layer=3), r"mems hold 3 layers, the model has 2"),
    ("width", IDS, _memory(d_model=16), r"mems have width 16, the model's d_model is 32"),
    ("mask_dtype", IDS, _memory(mask_dtype=np.float32), r"mem_mask must be bool, got float32"),
    ("batch", IDS, _memory(batch=3), r"token_ids have batch 2 but the memory has batch 3"),
    ("rank_3_mems", IDS, Memory(np.zeros([2, 4, 32], np.float32), np.zeros([2, 4], bool)),
     r"mems must be \[n_layer, batch, mem_len, d_model\] \(rank 4\)"),
    ("rank_3_mask", IDS, _memory()._replace(mem_mask=np.zeros([1, 2, MEM_LEN], bool)),
     r"mem_mask must be \[batch, mem_len\] \(rank 2\), got shape \(1, 2, \d+\)"),
    ("int_mems", IDS, _memory()._replace(mems=np.zeros([2, 2, MEM_LEN, 32], np.int32)),
     r"mems must be floating point, got int32"),
    ("mask_batch", IDS, _memory()._replace(mem_mask=np.zeros([3, MEM_LEN], bool)),
     r"mems and mem_mask disagree on batch: 2 vs 3"),
    ("mask_length", IDS, _memory()._replace(mem_mask=np.zeros([2, MEM_LEN + 1], bool)),
     rf"mems and mem_mask disagree on mem_len: {MEM_LEN} vs {MEM_LEN + 1}"),
]


@pytest.mark.parametrize("ids, memory, pattern", [c[1:] for c in CORE_CASES],
                         ids=[c[0] for c in CORE_CASES])
def test_core_rejects(prepared, ids, memory, pattern):
    """The message is ours alone: Keras re-raised it inside "Exception encountered when
    calling TransformerXL.call()" and a list of the arguments."""
    with pytest.raises(InputError) as raised:
        prepared["core"](ids, memory)
    assert re.fullmatch(pattern + r"[^\n]*", str(raised.value)), str(raised.value)


# ----------------------------------------------------------------- runtimes
RUNTIME_CASES = [  # (id, call(runtime), message pattern)
    ("float_ids", lambda rt: rt.step(IDS.astype(np.float32)), r"integer dtype, got float32"),
    ("masked_ids", lambda rt: rt.step(np.ma.masked_equal(IDS, 6)),
     r"token_ids is a masked array with masked entries"),
    ("id_too_large", lambda rt: rt.step(np.array([[1, 256]])),
     r"token_ids: id 256 at position \(0, 1\) is out of range .* 256 tokens"),
    ("negative_id", lambda rt: rt.step(np.array([[-1, 2]])), r"id -1 at position \(0, 0\)"),
    ("rank_1_ids", lambda rt: rt.step(np.array([1, 2])), r"non-empty \[batch, length\]"),
    ("empty_ids", lambda rt: rt.step(np.zeros([1, 0], np.int32)), r"non-empty"),
    ("mem_len", lambda rt: rt.step(IDS, _memory(mem_len=MEM_LEN + 1)), r"mem_len fixed at 4"),
    ("batch", lambda rt: rt.step(IDS, _memory(batch=3)), r"batch mismatch: token_ids have "
                                                          r"batch 2 but the memory has batch 3"),
    ("mask_dtype", lambda rt: rt.step(IDS, _memory(mask_dtype=np.int32)), r"mem_mask must be "
                                                                          r"bool"),
    ("not_a_memory", lambda rt: rt.step(IDS, "memory"), r"\(mems, mem_mask\) pair"),
    ("targets", lambda rt: rt.score(IDS, IDS[:, :2]), r"differs from token_ids shape"),
    ("batch_size", lambda rt: rt.initial_memory(0), r"batch_size must be a positive integer"),
]


@pytest.mark.parametrize("backend", ["onnx", "saved_model"])
@pytest.mark.parametrize("call, pattern", [c[1:] for c in RUNTIME_CASES],
                         ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_rejects(prepared, backend, call, pattern):
    runtime = open_runtime(str(prepared["exported"]), backend=backend, device="cpu")
    with pytest.raises(RuntimeInputError, match=pattern):
        call(runtime)


# ------------------------------------------------------------- generation
def _generate(**kwargs):
    call = {"prompts": [[1, 2, 3], [4]], "max_new_tokens": 3, **kwargs}
    prompts, count = call.pop("prompts"), call.pop("max_new_tokens")
    return lambda backend: backend.generate(prompts, count, **call)


def _worn(state):
    """`state` as if its row had drawn one id short of 2**32 times."""
    return state._replace(counters=np.full_like(state.counters, 2 ** 32 - 1))


GENERATE_CASES = [  # (id, call(backend), message pattern): the decoder and both runtimes
    ("no_prompts", _generate(prompts=[]), r"prompts must be a non-empty list"),
    ("empty_prompt", _generate(prompts=[[1], []]), r"prompt 1 must be a non-empty 1-D"),
    ("float_prompt", _generate(prompts=[[1.5]]), r"prompt 0 must hold integer ids"),
    # numpy counts timedelta64 among its integers: durations were read as ids
    ("timedelta_prompt", _generate(prompts=np.array([[1, 2]], "m8[s]")),
     r"prompt 0 must hold integer ids, got dtype timedelta64\[s\]"),
    # prompts of two lengths as a masked array: the masked 0 was read as an id
    ("masked_prompt", _generate(prompts=np.ma.array([[1, 2], [3, 0]], mask=[[0, 0], [0, 1]])),
     r"prompt 1 is a masked array with masked entries, whose mask would be ignored"),
    ("id_too_large", _generate(prompts=[[1, 256]]),
     r"prompt 0: id 256 at position 1 is out of range for a vocabulary of 256"),
    ("negative_id", _generate(prompts=[[-1]]), r"prompt 0: id -1 at position 0"),
    ("max_new_tokens", _generate(max_new_tokens=-1), r"max_new_tokens must be an integer >= 0"),
    # The compiled loop's ids buffer (a power of two, int32 dimensions) cannot hold 2**30 + 1.
    ("max_new_tokens_huge", _generate(max_new_tokens=2 ** 30 + 1),
     r"max_new_tokens must be an integer in \[0, 1073741824\], got 1073741825"),
    # The sampler draws with the low 32 bits of a row's counter: its draws would repeat.
    ("draws_wrap", lambda b: b.generate(None, 2, resume=_worn(b.generate([[1]], 1).state)),
     r"a row has made 4294967295 draws: 2 more would pass the sampler's 4294967296"),
    ("temperature", _generate(temperature=-0.1), r"temperature must be a finite number >= 0"),
    ("temperature_nan", _generate(temperature=float("nan")), r"temperature must be"),
    ("top_k", _generate(top_k=257), r"top_k must be an integer in \[0, 256\]"),
    ("top_p_zero", _generate(top_p=0.0), r"top_p must be in \(0, 1\]"),
    ("top_p_big", _generate(top_p=1.2), r"top_p must be in \(0, 1\]"),
    ("penalty", _generate(repetition_penalty=0.9), r"repetition_penalty must be a finite "
                                                   r"number >= 1"),
    ("seed_negative", _generate(seed=-1), r"seed must be in \[0, "),
    ("seed_count", _generate(seed=[1, 2, 3]), r"seed must be an integer or 2 integers"),
    # Row 1's seed + 1 wrapped to -2**63 in int64 without a word.
    ("seed_wraps", _generate(seed=2 ** 63 - 1),
     r"seed must be in \[0, 9223372036854775806\] for 2 prompts \(row i uses seed \+ i"),
    ("stop_id", _generate(stop_ids=[256]), r"stop_ids must be ids in \[0, 256\), got 256"),
    ("pad_id", _generate(pad_id=-1), r"pad_id must be an id in \[0, 256\)"),
    ("resume_and_memory", lambda b: b.generate([[1]], 2, resume=b.generate([[1]], 1).state,
                                               memory=b.initial_memory(1)),
     r"pass either a memory or resume \(which holds one\), not both"),
    ("next_turn_rows", lambda b: b.generate([[1], [2]], 2, resume=b.generate([[1]], 1).state),
     r"a next turn needs one prompt per row of the state \(1\), got 2"),
    ("stream", _generate(stream="print"), r"stream must be callable"),
    ("memory_batch", lambda b: b.generate([[1]], 2, memory=b.initial_memory(2)),
     r"token_ids have batch 1 but the memory has batch 2"),
    # Prompts of two lengths: rows of the memory are taken before any step checks it.
    ("memory_batch_two_lengths", lambda b: b.generate([[1, 2], [3]], 2,
                                                      memory=b.initial_memory(3)),
     r"token_ids have batch 2 but the memory has batch 3"),
]


@pytest.fixture(scope="module")
def generators(prepared):
    from txl_tf import Decoder
    return {"decoder": Decoder(prepared["core"], mem_len=MEM_LEN, jit_compile=False),
            **{name: open_runtime(str(prepared["exported"]), backend=name, device="cpu")
               for name in ("onnx", "saved_model")}}


@pytest.mark.parametrize("backend", ["decoder", "onnx", "saved_model"])
@pytest.mark.parametrize("call, pattern", [c[1:] for c in GENERATE_CASES],
                         ids=[c[0] for c in GENERATE_CASES])
def test_generate_rejects(generators, backend, call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(generators[backend])


# ------------------------------------------------------- raw onnxruntime
def _feeds(ids=IDS, mem_len=MEM_LEN, mems_dtype=np.float32, mask_dtype=bool):
    batch = ids.shape[0] if ids.ndim == 2 else 2
    return {"token_ids": ids,
            "mems": np.zeros([2, batch, mem_len, 32], mems_dtype),
            "mem_mask": np.zeros([batch, mem_len], mask_dtype)}


def _without(name):
    feeds = _feeds()
    del feeds[name]
    return feeds


# Shapes and dtypes that onnxruntime itself rejects (no checks of ours run).
RAW_ONNXRUNTIME_SHAPE_DTYPE_CASES = [  # (id, feeds, exception, message pattern)
    ("float_ids", _feeds(IDS.astype(np.float32)), InvalidArgument,
     r"Unexpected input data type.*tensor\(float\).*expected.*tensor\(int32\)"),
    ("int64_ids", _feeds(IDS.astype(np.int64)), InvalidArgument,
     r"Unexpected input data type.*tensor\(int64\)"),
    ("rank_1_ids", _feeds(np.array([1, 2, 3], np.int32)), InvalidArgument,
     r"Invalid rank for input: token_ids Got: 1 Expected: 2"),
    ("mem_len", _feeds(mem_len=MEM_LEN + 1), InvalidArgument,
     r"(?s)Got invalid dimensions for input: mems .* index: 2 Got: 5 Expected: 4"),
    ("mems_dtype", _feeds(mems_dtype=np.float64), InvalidArgument,
     r"Unexpected input data type.*tensor\(double\)"),
    ("mask_dtype", _feeds(mask_dtype=np.int32), InvalidArgument,
     r"Unexpected input data type.*tensor\(int32\).*expected.*tensor\(bool\)"),
    ("missing_input", _without("mem_mask"), (InvalidArgument, ValueError),
     r"Required inputs \(\['mem_mask'\]\) are missing"),
]

# Out-of-range ids fed to onnxruntime directly: the graph's own range check
# fails, naming the range (ONNX Gather would wrap -1 to the last row).
_ID_RANGE = r"token_ids empty or out of range: valid ids are 0 to 255"
RAW_ONNXRUNTIME_ID_RANGE_CASES = [  # (id, feeds, exception, message pattern)
    ("negative_id", _feeds(np.array([[1, -1]], np.int32)), InvalidArgument, _ID_RANGE),
    ("id_n_token", _feeds(np.array([[1, 256]], np.int32)), InvalidArgument, _ID_RANGE),
    ("huge_id", _feeds(np.array([[2**31 - 1, 0]], np.int32)), InvalidArgument, _ID_RANGE),
]


@pytest.fixture(scope="module")
def session(prepared):
    return ort.InferenceSession(str(prepared["exported"] / "model.onnx"),
                                providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "feeds, error, pattern",
    [c[1:] for c in RAW_ONNXRUNTIME_SHAPE_DTYPE_CASES + RAW_ONNXRUNTIME_ID_RANGE_CASES],
    ids=[c[0] for c in RAW_ONNXRUNTIME_SHAPE_DTYPE_CASES + RAW_ONNXRUNTIME_ID_RANGE_CASES])
def test_raw_onnxruntime_rejects(session, feeds, error, pattern):
    with pytest.raises(error, match=pattern):
        session.run(None, feeds)


# ---------------------------------------------------------- command lines
# (id, module, arguments, pattern of the one error line). Placeholders:
# {root} (snapshotted), {scratch}, {corpus}.
CLI_CASES = [
    ("train_unknown_flag", "training.train", ["--bogus=1"], r"Unknown command line flag 'bogus'"),
    ("demo_unknown_flag", "training.demo", ["--bogus=1"], r"Unknown command line flag 'bogus'"),
    ("demo_bad_value", "training.demo", ["--finetune_seconds=soon"],
     r"flag --finetune_seconds=soon"),
    # A RuntimeError traceback from tf.data (set_shape), after three evaluations.
    ("demo_context_huge", "training.demo", ["--model={root}/model",
                                            "--context=9223372036854775808"],
     r"^error: the loss-by-context curve \(--context\) \(batch 8, segment 9223372036854775808, "
     r"memory 0\) needs at least "),
    # NaN passed `< 0` and meant no fine-tuning, without a word.
    ("demo_finetune_seconds_nan", "training.demo", ["--finetune_seconds=nan"],
     r"^error: --finetune_seconds must be >= 0, got nan$"),
    # The decoder's "max_new_tokens must be ..." without the flag, after the evaluations.
    ("demo_num_tokens_huge", "training.demo", ["--model={root}/model", "--eval_segments=1",
                                               "--context=8", "--num_tokens=1073741825"],
     r"^error: --num_tokens must be in \[0, 1073741824\], got 1073741825$"),
    # Unchecked: fine-tuning with NaN weights after the evaluations and the generation.
    ("demo_finetune_learning_rate_nan", "training.demo",
     ["--model={root}/model", "--eval_segments=1", "--context=8", "--num_tokens=1",
      "--finetune_steps=1", "--finetune_learning_rate=nan"],
     r"^error: --finetune_learning_rate must be a finite number > 0, got nan$"),
    # "[Errno 20] Not a directory" without the flag, after the evaluations.
    ("demo_output_dir_under_a_file", "training.demo",
     ["--model={root}/model", "--eval_segments=1", "--context=8",
      "--output_dir={scratch}/latin1.txt/demo"],
     r"^error: --output_dir: .*latin1\.txt is not a folder, so it cannot hold .*latin1\.txt/demo; "
     r"choose another --output_dir$"),
    # "text is not UTF-8 (...)" without the flag, after the evaluations. (A byte that is not
    # UTF-8 in argv is a lone surrogate in Python.)
    ("demo_prompt_not_utf8", "training.demo", ["--model={root}/model", "--eval_segments=1",
                                               "--context=8", "--prompt=\udcff"],
     r"^error: --prompt cannot be encoded: text is not UTF-8 "),
    ("demo_model", "training.demo", ["--model={scratch}/no_model"],
     r"model directory '.*no_model' does not exist"),
    ("train_bad_value", "training.train", ["--train_steps=many"], r"flag --train_steps=many"),
    ("train_positional", "training.train", ["--model_dir={scratch}/t", "extra"],
     r"unexpected arguments: extra"),
    ("train_preset", "training.train", ["--preset=huge", "--model_dir={root}/run"],
     r"unknown preset 'huge'; known presets: .*tiny"),
    ("train_steps", "training.train", ["--train_steps=0", "--model_dir={root}/run"],
     r"--train_steps must be a positive integer, got 0"),
    # A MemoryError traceback (a list of that many logical device configurations).
    ("train_num_cpu_devices_huge", "training.train", ["--num_cpu_devices=9223372036854775807",
                                                      "--model_dir={root}/run"],
     r"^error: --num_cpu_devices must be in \[0, 1024\], got 9223372036854775807$"),
    ("train_adam_beta2", "training.train", ["--adam_beta2=1.5", "--model_dir={root}/run"],
     r"--adam_beta2 must be in \[0, 1\), got 1.5"),
    ("train_adam_epsilon", "training.train", ["--adam_epsilon=0", "--model_dir={root}/run"],
     r"--adam_epsilon must be a finite number > 0, got 0.0"),
    # NaN and inf passed the checks: "the weights hold NaN or inf ... lower --learning_rate" after
    # the first step, or a run that trained nothing (--adam_epsilon=inf, --clip=nan) or ignored
    # its limit (--max_time_s=nan) without a word.
    *[(f"train_{flag}_{value}", "training.train", [f"--{flag}={value}", "--model_dir={root}/run"],
       rf"^error: --{flag} must be {rule}, got {value}$")
      for flag, rule in (("learning_rate", "a finite number > 0"),
                         ("clip", r"a finite number >= 0 \(0: none\)"),
                         ("adam_epsilon", "a finite number > 0"))
      for value in ("nan", "inf")],
    ("train_max_time_s_nan", "training.train", ["--max_time_s=nan", "--model_dir={root}/run"],
     r"^error: --max_time_s must be >= 0 \(0: no limit\), got nan$"),
    *[(f"classify_{flag}_{value}", "training.classify",
       ["--mode=train", "--train_data={corpus}", "--preset=tiny", "--output_dir={scratch}/c",
        f"--{flag}={value}"], rf"^error: --{flag} must be {rule}, got {value}$")
      for flag, rule in (("learning_rate", "a finite number > 0"),
                         ("clip", r"a finite number >= 0 \(0: none\)"))
      for value in ("nan", "inf")],
    *[(f"train_lstm_{flag}_{value}", "training.train_lstm",
       ["--model_dir={scratch}/lstm", f"--{flag}={value}"],
       rf"^error: --{flag} must be {rule}, got {value}$")
      for flag, rule in (("learning_rate", "a finite number > 0"),
                         ("clip", r"a finite number >= 0 \(0: none\)"))
      for value in ("nan", "inf")],
    ("train_other_model", "training.train",
     ["--model_dir={root}/run", "--dataset=text", "--data_dir={corpus}", "--preset=small",
      "--cache_dir={scratch}/cache", "--strategy=one_device"],
     r"--model_dir holds a run of another model"),
    ("evaluate_max_segments", "training.evaluate", ["--model_dir={root}/run",
                                                    "--max_segments=0"],
     r"--max_segments must be positive, got 0"),
    ("evaluate_mem_len", "training.evaluate", ["--model_dir={root}/run", "--mem_len=-1"],
     r"--mem_len must be >= 0, got -1"),
    ("evaluate_no_model_dir", "training.evaluate", [], r"--model_dir is required"),
    ("evaluate_split", "training.evaluate", ["--split=dev"], r"flag --split=dev"),
    ("evaluate_checkpoint", "training.evaluate", ["--model_dir={root}/run",
                                                  "--checkpoint=ckpt-99"],
     r"checkpoint 'ckpt-99' not found"),
    ("evaluate_truncated_checkpoint", "training.evaluate", ["--model_dir={root}/run_cut"],
     r"checkpoint .*run_cut/checkpoints/ckpt-2 cannot be read \(.*\): is it truncated\?"),
    ("evaluate_missing_dir", "training.evaluate", ["--model_dir={root}/nowhere"],
     r"model directory '.*nowhere' does not exist"),
    ("evaluate_empty_weights", "training.evaluate", ["--model_dir={root}/empty"],
     r"cannot load weights '.*empty/weights\.npz'.*the file is empty"),
    ("evaluate_truncated_weights", "training.evaluate", ["--model_dir={root}/broken"],
     r"cannot load weights '.*broken/weights\.npz'.*not a complete \.npz archive"),
    ("generate_top_k", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                             "--top_k=1000"],
     r"--top_k 1000 exceeds the vocabulary of 256 tokens"),
    ("generate_temperature", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                                   "--temperature=-1"],
     r"--temperature must be a finite number >= 0, got -1"),
    ("generate_mem_len", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                               "--mem_len=-1"], r"--mem_len must be >= 0"),
    # tf.zeros' "out-of-range integer" traceback (an OOM traceback at 2**31), not a budget line.
    ("generate_mem_len_huge", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                                    "--mem_len=9223372036854775808"],
     r"^error: generating \(batch 1, segment 8, memory 9223372036854775808\) needs at least "),
    # 2**31 and beyond ran without end (the printed text, not an id buffer, bounded it).
    ("generate_num_tokens", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                                  "--num_tokens=2147483648"],
     r"^error: --num_tokens must be in \[0, 1073741824\], got 2147483648$"),
    ("generate_top_p", "training.generate", ["--model_dir={root}/model", "--prompt=a",
                                             "--top_p=0"], r"--top_p must be in \(0, 1\], got 0"),
    ("generate_penalty", "training.generate", ["--model={root}/model", "--prompt=a",
                                               "--repetition_penalty=0.5"],
     r"--repetition_penalty must be a finite number >= 1, got 0.5"),
    # inf passed the CLI's checks: the library's "temperature must be ..." without the flag, and
    # "--repetition_penalty must be >= 1, got inf".
    ("generate_temperature_inf", "training.generate", ["--model={root}/model", "--prompt=a",
                                                       "--temperature=inf"],
     r"^error: --temperature must be a finite number >= 0, got inf$"),
    # The temperature was dropped without a word: greedy decoding.
    ("generate_greedy_and_temperature", "training.generate",
     ["--model={root}/model", "--prompt=a", "--greedy", "--temperature=0.5"],
     r"^error: --greedy takes the most likely token, so --temperature=0\.5 would be ignored: "
     r"pass one of them$"),
    ("generate_penalty_inf", "training.generate", ["--model={root}/model", "--prompt=a",
                                                   "--repetition_penalty=inf"],
     r"^error: --repetition_penalty must be a finite number >= 1, got inf$"),
    ("generate_stop_ids", "training.generate", ["--model={root}/model", "--prompt=a",
                                                "--stop_ids=x"],
     r"--stop_ids must be token ids \(integers >= 0\), got 'x'"),
    # str.isdigit() accepts "²", which int() refuses: a ValueError traceback.
    ("generate_stop_ids_superscript", "training.generate", ["--model={root}/model", "--prompt=a",
                                                            "--stop_ids=\u00b2"],
     r"^error: --stop_ids must be token ids \(integers >= 0\), got '\u00b2'$"),
    ("generate_stop_id_range", "training.generate", ["--model={root}/model", "--prompt=a",
                                                     "--stop_ids=256"],
     r"--stop_ids must be ids below the vocabulary size 256, got 256"),
    ("generate_seed", "training.generate", ["--model={root}/model", "--prompt=a",
                                            "--seed=9223372036854775808"],
     r"^error: --seed must be in \[0, 9223372036854775807\], got 9223372036854775808$"),
    ("recl_seed", "training.recl", ["--model_dir={root}/model", "--seed=-1"],
     r"^error: --seed must be >= 0, got -1$"),  # numpy's traceback, once the models loaded
    # A list of every context up to --max_context before the text's length was checked: a
    # MemoryError traceback (at 2**31, minutes of filling memory).
    ("recl_max_context_huge", "training.recl",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--max_context=9223372036854775808"],
     r"^error: --max_context 9223372036854775808: the valid split has \d+ ids, too few for the "
     r"longest context measured \(9223372036854775\d+\) and one target after it$"),
    # "[Errno 20] Not a directory" without the flag, once every context was scored.
    ("recl_output_dir_under_a_file", "training.recl",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--max_context=32", "--positions=8",
      "--output_dir={scratch}/latin1.txt/recl"],
     r"^error: --output_dir: .*latin1\.txt is not a folder, so it cannot hold .*latin1\.txt/recl; "
     r"choose another --output_dir$"),
    ("generate_two_models", "training.generate", ["--model={root}/model",
                                                  "--model_dir={root}/model", "--prompt=a"],
     r"pass --model or --model_dir, not both"),
    ("generate_no_model", "training.generate", ["--prompt=a"], r"--model is required"),
    ("generate_missing_model", "training.generate", ["--model={root}/nowhere.onnx",
                                                     "--prompt=a"],
     r"model directory '.*nowhere.onnx' does not exist"),
    ("generate_export_mem_len", "training.generate", ["--model={scratch}/exported/model.onnx",
                                                      "--prompt=a", "--mem_len=8"],
     r"--mem_len cannot change an export's memory length"),
    ("generate_export_no_vocab", "training.generate",
     ["--model={scratch}/exported/saved_model", "--prompt=a"],
     r".*exported/saved_model: the model has no vocabulary: no vocab/"),
    ("generate_truncated_onnx", "training.generate",
     ["--model={scratch}/truncated/model.onnx", "--prompt=a"],
     r"cannot open the ONNX model .*truncated/model.onnx: .*INVALID_PROTOBUF"),
    ("generate_truncated_saved_model", "training.generate",
     ["--model={scratch}/truncated/saved_model", "--prompt=a"],
     r"cannot load the SavedModel .*truncated/saved_model: Cannot parse file"),
    ("generate_cut_variables", "training.generate", ["--model={scratch}/cut_variables/saved_model",
                                                     "--prompt=a"],
     r"cannot load the SavedModel .*cut_variables/saved_model: Read less bytes"),
    ("generate_cut_onnx_data", "training.generate", ["--model={scratch}/cut_model", "--prompt=a"],
     r"cannot open the ONNX model .*cut_model/model\.onnx: its weight .* ends at byte \d+ of "
     r".*cut_model/model\.onnx\.data, which holds \d+ \(a truncated file\?\)"),
    ("generate_cut_decode_graph", "training.generate", ["--model={scratch}/cut_decode_step",
                                                        "--prompt=a"],
     r"cannot read the ONNX graph .*cut_decode_step/decode_step\.onnx"),
    ("generate_no_vocab", "training.generate", ["--model_dir={root}/novocab", "--prompt=a"],
     r".*novocab: the model has no vocabulary: no vocab/.*: copy it there"),  # no --vocab_dir
    ("generate_truncated_weights", "training.generate", ["--model_dir={root}/broken",
                                                         "--prompt=a"],
     r"cannot load weights '.*broken/weights\.npz'"),
    ("export_unknown_flag", "export", ["--bogus"], r"Unknown command line flag 'bogus'"),
    ("export_bad_value", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                    "--mem_len=abc"], r"flag --mem_len=abc"),
    ("export_no_output_dir", "export", ["--model_dir={root}/model"],
     r"^error: --output_dir is required$"),
    ("export_no_model", "export", ["--output_dir={root}/out"],
     r"^error: pass --model_dir, or both --config and --weights$"),
    ("export_formats", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                  "--formats=pdf"],
     r"^error: --formats must be a non-empty list of saved_model, onnx, triton, got 'pdf'$"),
    ("export_opset", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                "--opset=3"], r"--opset must be an ONNX opset from 13 to"),
    ("export_opset_high", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                     "--opset=99"],
     r"^error: --opset must be an ONNX opset from 13 to \d+ \(tf2onnx's newest\), got 99$"),
    ("export_tolerance", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                    "--tolerance=-1"],
     r"^error: --tolerance must be >= 0, got -1.0$"),
    # Passed: a --verify whose parity check could never fail.
    ("export_tolerance_inf", "export", ["--model_dir={root}/model",
                                        "--output_dir={scratch}/out_tolerance",
                                        "--tolerance=inf"],
     r"^error: --tolerance must be finite \(inf passes any difference\), got inf$"),
    ("export_mem_len", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                  "--mem_len=-1"], r"^error: --mem_len must be >= 0, got -1$"),
    ("export_log_probs", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                    "--log_probs=first"], r"flag --log_probs=first"),
    ("export_triton_batch", "export", ["--model_dir={root}/model", "--output_dir={root}/out",
                                       "--triton_max_batch_size=0"],
     r"^error: --triton_max_batch_size must be >= 1, got 0$"),
    # "[Errno 2] No such file or directory" without the flag, after the weights loaded; a folder
    # without a tokenizer was copied into the export as its vocab/.
    ("export_vocab_dir_missing", "export", ["--model_dir={root}/model",
                                            "--output_dir={scratch}/out_vocab",
                                            "--vocab_dir={scratch}/nowhere"],
     r"^error: --vocab_dir: cannot read the vocabulary in .*nowhere: tokenizer file not found"),
    ("export_vocab_dir_not_a_vocabulary", "export", ["--model_dir={root}/model",
                                                     "--output_dir={scratch}/out_vocab",
                                                     "--vocab_dir={root}/model"],
     r"^error: --vocab_dir: cannot read the vocabulary in .*root/model: tokenizer file not "
     r"found"),
    # Written into config.pbtxt, whose max_batch_size and max_candidate_sequences are int32:
    # an export that Triton cannot load.
    ("export_triton_batch_huge", "export", ["--model_dir={root}/model",
                                            "--output_dir={scratch}/out_triton",
                                            "--formats=triton",
                                            "--triton_max_batch_size=2147483648"],
     r"^error: cannot write a Triton repository: max_batch_size \(--triton_max_batch_size\) "
     r"must be at most 2147483647 "),
    ("export_triton_candidates_huge", "export", ["--model_dir={root}/model",
                                                 "--output_dir={scratch}/out_triton",
                                                 "--formats=triton",
                                                 "--triton_max_batch_size=1073741824"],
     r"^error: cannot write a Triton repository: max_candidate_sequences must be at most "
     r"2147483647 .*got 4294967296$"),
    # numpy's "This file contains pickled (object) data. If you trust the file you can load it
    # unsafely using the `allow_pickle=` keyword argument or `pickle.load()`".
    ("export_weights_not_npz", "export", ["--config={root}/model/config.json",
                                          "--weights={scratch}/latin1.txt",
                                          "--output_dir={scratch}/out_weights"],
     r"^error: cannot load weights '.*latin1\.txt'.*: cannot read weights file .*latin1\.txt: "
     r"not an \.npz archive \(it does not start with a zip file's signature\)$"),
    ("export_truncated_weights", "export", ["--model_dir={root}/broken",
                                            "--output_dir={scratch}/out"],
     r"cannot load weights '.*broken/weights\.npz'.*not a complete \.npz archive"),
    ("export_output_not_empty", "export", ["--model_dir={root}/model",
                                           "--output_dir={root}/run"],
     r"output folder '.*root/run' is not empty; pass --overwrite"),
    ("export_output_is_input", "export", ["--model_dir={root}/run", "--output_dir={root}/run",
                                          "--overwrite"],
     r"output folder '.*root/run' holds the export's input '.*root/run'"),
    ("export_output_holds_weights", "export", ["--model_dir={root}/run",
                                               "--output_dir={root}/run/export",
                                               "--overwrite"],
     r"output folder '.*root/run/export' holds the export's input '.*root/run/export/"),
    ("export_missing_weights", "export", ["--config={root}/model/config.json",
                                          "--weights={root}/missing.npz",
                                          "--output_dir={root}/out"],
     r"weights file '.*missing\.npz' does not exist"),
    # A file where a folder must go: the flag and the path, before any work (the first
    # write's "[Errno 17] File exists", at the end of an evaluation for its --output).
    ("export_output_under_a_file", "export", ["--model_dir={root}/model",
                                              "--output_dir={scratch}/latin1.txt/out"],
     r"^error: --output_dir: .*latin1\.txt is not a folder, so it cannot hold "
     r".*latin1\.txt/out; choose another --output_dir$"),
    ("train_model_dir_is_a_file", "training.train", ["--model_dir={scratch}/latin1.txt"],
     r"^error: --model_dir: .*latin1\.txt exists and is not a folder; choose another "
     r"--model_dir$"),
    ("train_model_dir_under_a_file", "training.train", ["--model_dir={scratch}/latin1.txt/run"],
     r"^error: --model_dir: .*latin1\.txt is not a folder, so it cannot hold"),
    # The corpus cache's OSError, "cannot load corpus 'text': [Errno 17] File exists", without
    # the flag.
    ("evaluate_cache_dir_is_a_file", "training.evaluate",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/latin1.txt"],
     r"^error: --cache_dir: .*latin1\.txt exists and is not a folder; choose another "
     r"--cache_dir$"),
    ("train_cache_dir_under_a_file", "training.train",
     ["--model_dir={scratch}/cache_run", "--dataset=text", "--data_dir={corpus}",
      "--preset=tiny", "--cache_dir={scratch}/latin1.txt/cache"],
     r"^error: --cache_dir: .*latin1\.txt is not a folder, so it cannot hold "
     r".*latin1\.txt/cache; choose another --cache_dir$"),
    ("evaluate_output_under_a_file", "training.evaluate",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--output={scratch}/latin1.txt/e.json"],
     r"^error: --output: .*latin1\.txt is not a folder, so it cannot hold .*e\.json; choose "
     r"another --output$"),
    # Written over at the end of the evaluation: the model's config, the corpus, the documents.
    ("evaluate_output_is_the_models_config", "training.evaluate",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--output={root}/model/config.json"],
     r"^error: --output: .*root/model/config\.json is the model's config\.json, which this job "
     r"reads; choose another --output$"),
    ("evaluate_output_is_the_corpus", "training.evaluate",
     ["--model_dir={root}/model", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--output={corpus}"],
     r"^error: --output: .*corpus\.txt is the corpus \(--data_dir\), which this job reads"),
    ("evaluate_output_is_a_split_file", "training.evaluate",
     ["--model_dir={root}/model", "--dataset=wt2", "--data_dir={root}/wt2",
      "--cache_dir={scratch}/cache", "--output={root}/wt2/valid.txt"],
     r"^error: --output: .*root/wt2/valid\.txt is the corpus \(--data_dir\), which this job "
     r"reads; choose another --output$"),
    ("classify_output_is_the_documents", "training.classify",
     ["--mode=predict", "--classifier_dir={root}/model", "--predict_data={scratch}/labels.tsv",
      "--output={scratch}/labels.tsv"],
     r"^error: --output: .*labels\.tsv is the documents \(--predict_data\), which this job "
     r"reads; choose another --output$"),
    ("attention_output_under_a_file", "training.attention_picture",
     ["--model_dir={root}/model", "--text=ab", "--output={scratch}/latin1.txt/a.png"],
     r"^error: --output: .*latin1\.txt is not a folder"),
    ("classify_output_under_a_file", "training.classify",
     ["--mode=evaluate", "--classifier_dir={root}/model", "--eval_data={corpus}",
      "--output={scratch}/latin1.txt/m.json"], r"^error: --output: .*latin1\.txt is not a folder"),
    # A training run's (or model's) folder took the classifier: its flags.json, train_log.jsonl
    # and vocab/ replaced, its export/ deleted.
    ("classify_output_dir_holds_a_run", "training.classify",
     ["--mode=train", "--train_data={corpus}", "--preset=tiny", "--output_dir={root}/run"],
     r"^error: --output_dir: .*root/run holds a model or training run \(config\.json, "
     r"checkpoints, export\), not a classifier; choose another --output_dir$"),
    # Each job's own run written over the other's: train_log.jsonl replaced, export/config.json
    # rewritten beside the other model's weights.
    ("classify_output_dir_holds_an_lstm", "training.classify",
     ["--mode=train", "--train_data={corpus}", "--preset=tiny", "--output_dir={root}/lstm"],
     r"^error: --output_dir: .*root/lstm holds a model or training run \(export\), not a "
     r"classifier; choose another --output_dir$"),
    ("train_lstm_model_dir_holds_a_run", "training.train_lstm",
     ["--model_dir={root}/run", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--train_steps=1", "--nofinal_eval"],
     r"^error: --model_dir: .*root/run holds a model or training run \(config\.json, "
     r"checkpoints, export\), not an LSTM baseline; choose another --model_dir$"),
    ("train_model_dir_holds_an_lstm", "training.train",
     ["--model_dir={root}/lstm", "--dataset=text", "--data_dir={corpus}",
      "--cache_dir={scratch}/cache", "--preset=tiny", "--train_steps=1", "--batch_size=4",
      "--strategy=one_device"],
     r"^error: --model_dir .*root/lstm holds the LSTM baseline of txl-train-lstm \(in "
     r".*root/lstm/export\), not a Transformer-XL run; choose another --model_dir$"),
    # "tokenizer file not found: ..." without the flag.
    ("classify_vocab_dir_missing", "training.classify",
     ["--mode=train", "--train_data={scratch}/labels.tsv", "--preset=tiny",
      "--output_dir={scratch}/c", "--vocab_dir={scratch}/nowhere"],
     r"^error: --vocab_dir: cannot read the tokenizer in .*nowhere: tokenizer file not found"),
    # -1 and 7 were taken as 1.
    ("classify_verbose", "training.classify",
     ["--mode=train", "--train_data={corpus}", "--preset=tiny", "--output_dir={scratch}/c",
      "--verbose=-1"], r"^error: --verbose must be 0 or 1, got -1$"),
    ("classify_output_dir_under_a_file", "training.classify",
     ["--mode=train", "--train_data={corpus}", "--preset=tiny",
      "--output_dir={scratch}/latin1.txt/c"], r"^error: --output_dir: .*latin1\.txt is not a "
                                              r"folder"),
    # "[Errno 17] File exists" without the flag (after the corpus loaded, under a file).
    ("train_lstm_model_dir_is_a_file", "training.train_lstm", ["--model_dir={scratch}/latin1.txt"],
     r"^error: --model_dir: .*latin1\.txt exists and is not a folder; choose another "
     r"--model_dir$"),
    # A ResourceExhaustedError traceback building the weights (--d_model), or no end making
    # the layers (--n_layer).
    *[(f"train_lstm_{flag}_huge", "training.train_lstm",
       ["--model_dir={scratch}/lstm", "--dataset=text", "--data_dir={corpus}",
        "--cache_dir={scratch}/cache", f"--{flag}=1000000000000"],
       r"^error: training the LSTM needs at least .* GiB \(weights, gradients and Adam's "
       r"moments .*\) and (this process can allocate|this machine has) .*; lower --d_model or "
       r"--n_layer$")
      for flag in ("d_model", "n_layer")],
    # A ValueError traceback (--seed); --eval_max_segments refused after the training, and
    # --warmup_steps and --min_lr_ratio by the schedule without the flag.
    *[(f"train_lstm_{flag}", "training.train_lstm",
       ["--model_dir={scratch}/lstm", "--train_steps=2", f"--{flag}={value}"],
       rf"^error: {message}$")
      for flag, value, message in (
          ("seed", "-1", r"--seed must be in \[0, 4294967295\], got -1"),
          ("eval_max_segments", "0", "--eval_max_segments must be a positive integer, got 0"),
          ("warmup_steps", "3", r"--warmup_steps \(3\) exceeds --train_steps \(2\)"),
          ("min_lr_ratio", "nan", r"--min_lr_ratio must be in \[0, 1\], got nan"))],
    ("flagfile_not_utf8", "training.train", ["--flagfile={scratch}/latin1.txt"],
     r"^error: a --flagfile is not UTF-8 text: 'utf-8' codec can't decode"),
    ("flagfile_missing", "export", ["--flagfile={scratch}/nowhere.cfg"],
     r"^error: Unable to open flagfile: .*nowhere\.cfg"),
    ("generate_model_is_a_file", "training.generate", ["--model={scratch}/latin1.txt",
                                                      "--prompt=a"],
     r"model directory '.*latin1\.txt' is a file, not a directory"),
    ("attention_head_superscript", "training.attention_picture",
     ["--model_dir={root}/model", "--text=ab", "--head=\u00b2", "--output={scratch}/a.png"],
     r"^error: --head must be 'mean' or a head number >= 0, got '\u00b2'$"),
    # tf.zeros' "out-of-range integer" traceback (an OOM traceback at 2**31), not a budget line.
    ("attention_mem_len_huge", "training.attention_picture",
     ["--model_dir={root}/model", "--text=ab", "--mem_len=9223372036854775808",
      "--output={scratch}/a.png"],
     r"^error: the attention picture \(batch 1, segment 2, memory 9223372036854775808\) needs "),
    # "does not exist".
    ("attention_text_file_a_folder", "training.attention_picture",
     ["--model_dir={root}/model", "--text_file={scratch}", "--output={scratch}/a.png"],
     r"^error: --text_file '.*scratch' is a folder, not a file$"),
    ("attention_text_not_utf8", "training.attention_picture",
     ["--model_dir={root}/model", "--text_file={scratch}/latin1.txt", "--output={scratch}/a.png"],
     r"--text_file '.*latin1\.txt' is not valid UTF-8"),
    ("convert_vocab_not_utf8", "txl_tf.weights.convert",
     ["--source=tf", "--input={root}/run/checkpoints/ckpt-2", "--config={root}/model/config.json",
      "--vocab={scratch}/latin1.txt", "--output_dir={scratch}/converted"],
     r"vocabulary file .*latin1\.txt is not UTF-8 text \(byte \d+\)"),
    ("convert_not_a_checkpoint", "txl_tf.weights.convert",
     ["--source=tf", "--input={scratch}/latin1.txt", "--config={root}/model/config.json",
      "--output_dir={scratch}/converted"], r"'.*latin1\.txt' is not a TF checkpoint"),
]


@pytest.mark.parametrize("module, args, pattern", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_fails_in_one_line(prepared, jobs, module, args, pattern):
    places = {k: str(prepared[k]) for k in ("root", "scratch", "corpus")}
    before = snapshot(prepared["root"])
    proc = jobs.run(module, [a.format(**places) for a in args])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    report = f"exit {proc.returncode}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, report
    assert "Traceback" not in proc.stderr + proc.stdout, report
    assert len(errors) == 1, report
    assert re.search(pattern, errors[0]), report
    assert not NOISE.search(proc.stderr), report
    assert snapshot(prepared["root"]) == before


def test_cli_success_has_no_start_up_noise(prepared):
    env = job_env()
    env.pop("CUDA_VISIBLE_DEVICES")  # let TensorFlow look for a GPU (and log about it)
    proc = run_job("training.generate", [f"--model_dir={prepared['root']}/run", "--prompt=ab",
                                         "--num_tokens=3", "--greedy"], env=env)
    assert proc.stdout.startswith("ab") and len(proc.stdout.rstrip("\n")) >= 2
    assert not NOISE.search(proc.stderr), proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_snapshot_sees_changes(tmp_path):
    (tmp_path / "a").write_bytes(b"1")
    before = snapshot(tmp_path)
    (tmp_path / "a").write_bytes(b"2")
    assert snapshot(tmp_path) != before
    shutil.copy(tmp_path / "a", tmp_path / "b")
    assert set(snapshot(tmp_path)) == {"a", "b"}


def console_scripts():
    """`{command: module}` of setup.py's console scripts (`txl-export` runs
    `python -m export`)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "setup.py"),
              encoding="utf-8") as setup:
        text = setup.read()
    return {command: module.removesuffix(".__main__")
            for command, module in re.findall(r'"(txl-[\w-]+) = ([\w.]+):console"', text)}


def own_flags(module):
    """The names of the flags the job `module` declares (its SPEC)."""
    if module == "txl_tf.weights.convert":
        return [spec[1] for spec in importlib.import_module(module)._spec()]
    return [spec[1] for spec in importlib.import_module(
        "export.job" if module == "export" else module).SPEC]


# The commands that are jobs with flags (txl-configs takes a name: its usage is tested in
# tests/test_packaging.py).
FLAG_COMMANDS = sorted(command for command, module in console_scripts().items()
                       if module != "training.configs")


@pytest.mark.parametrize("command", FLAG_COMMANDS)
def test_every_installed_commands_help_lists_its_own_flags(jobs, command):
    module = console_scripts()[command]
    shown = jobs.run(module, ["--help"])
    flags = own_flags(module)
    assert len(flags) >= 3, (module, flags)
    missing = [f for f in flags if not re.search(rf"^  --(\[no\])?{f}:", shown.stdout, re.M)]
    assert missing == [], (command, missing, shown.stdout[-1000:])


@pytest.mark.parametrize("statement", ["from export import export_onnx",
                                       "import export; export.export_saved_model",
                                       "import txl_tf.core", "import txl_tf; txl_tf.TransformerXL"])
def test_the_export_api_as_a_first_import_has_no_start_up_noise(statement):
    """`from export import export_onnx` as a script's or a notebook's first
    import printed TensorFlow's C++ start-up lines (its modules import
    tensorflow and keras before txl_tf, whose import quiets them); the
    package's modules and its model names import TensorFlow when used."""
    import subprocess
    import sys
    env = job_env()
    env.pop("CUDA_VISIBLE_DEVICES")  # let TensorFlow look for a GPU (and log about it)
    proc = subprocess.run([sys.executable, "-c", statement], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not NOISE.search(proc.stderr), proc.stderr[-3000:]
