"""Serving the ONNX export needs onnxruntime and numpy, not TensorFlow: a
process where TensorFlow, Keras, tf2onnx and tensorflow-text cannot be
imported opens the export, reads text with its vocab/ and generates the same
ids as this one."""
import importlib.metadata
import json
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from export import open_runtime, run_export
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.text import ByteTokenizer, CharTokenizer, SentencePieceTokenizer, WordTokenizer
from txl_tf.text.prompt import prompt_ids
from txl_tf.weights import save_pretrained

CONFIG = TransformerXLConfig.preset("tiny", n_token=50, cutoffs=[20], mem_len=4)
SEED = 0
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

def _blocking(*packages):
    """Source that makes the top-level `packages` unimportable, as on a box
    without them."""
    return textwrap.dedent(f"""
        import sys
        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {packages!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Blocked())
    """)


# The TensorFlow side, unimportable.
BLOCK = _blocking("tensorflow", "keras", "tensorflow_text", "tf2onnx")


def _run_without_tensorflow(code, also=()):
    """`code` in a fresh Python without TensorFlow (nor the packages `also`
    names); returns its stdout."""
    done = subprocess.run([sys.executable, "-c", BLOCK + _blocking(*also) + textwrap.dedent(code)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _real_text(name, size):
    """`size` characters of `../shared/data/<name>` (real text beside the
    repository), or of this Python's standard library where it is absent."""
    path = SHARED_DATA / name
    if path.is_file():
        return path.read_text(encoding="utf-8")[:size]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "".join((stdlib / f).read_text(encoding="utf-8") for f in ("argparse.py", "ast.py",
                                                                     "typing.py"))[:size]


@pytest.fixture(scope="module")
def words():
    """The model's vocabulary: words of real text, `n_token` of them."""
    return WordTokenizer.build(_real_text("ptb.valid.txt", 100_000), max_size=CONFIG.n_token - 2)


@pytest.fixture(scope="module")
def model_onnx(tmp_path_factory, words):
    root = tmp_path_factory.mktemp("no_tf")
    # Seeded: the weights (and so the greedy text the tests read) must not
    # depend on what ran before in the worker.
    keras.utils.set_random_seed(SEED)
    save_pretrained(TransformerXL(CONFIG), root / "model", words)  # the export ships its vocab/
    # Parity with the core is not the point here: test_export_job.py and
    # test_decode_cache_export.py check it (adaptive softmax included).
    run_export(str(root / "out"), str(root / "model"), formats=("onnx",), verify=False)
    return root / "out" / "model.onnx"


@pytest.mark.parametrize("device_cache", [False, True])
def test_the_onnx_runtime_generates_without_tensorflow(model_onnx, device_cache):
    prompts, options = [[1, 2, 3], [4]], dict(temperature=0.8, seed=7)
    out = _run_without_tensorflow(f"""
        import json, sys
        from export import open_runtime
        rt = open_runtime({str(model_onnx)!r}, device="cpu", device_cache={device_cache})
        first = rt.generate({prompts}, 6, **{options})
        turn = rt.generate([[5], [6, 7]], 4, resume=first.state, **{options})
        assert not [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")]
        print(json.dumps([first.ids.tolist(), turn.ids.tolist()]))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    first = runtime.generate(prompts, 6, **options)
    turn = runtime.generate([[5], [6, 7]], 4, resume=first.state, **options)
    assert json.loads(out) == [first.ids.tolist(), turn.ids.tolist()]
    assert np.asarray(first.ids).shape == (2, 6)


# Generates from an ONNX export through the API, then through `txl-generate`,
# in a process that may import anything, and prints what it generated and the
# TensorFlow-side modules it loaded.
SERVE_WITH_TENSORFLOW_INSTALLED = textwrap.dedent("""
    import contextlib, io, json, runpy, sys
    from export import open_runtime
    api = open_runtime(sys.argv[1], device="cpu").generate([[1, 2, 3]], 6, seed=7).ids.tolist()
    sys.argv = ["txl-generate", f"--model={sys.argv[1]}", "--prompt=the company said",
                "--num_tokens=6", "--greedy"]
    with contextlib.redirect_stdout(io.StringIO()) as job, contextlib.suppress(SystemExit):
        runpy.run_module("training.generate", run_name="__main__")
    loaded = sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow", "keras", "tf2onnx"})
    print(json.dumps([api, job.getvalue(), loaded]))
""")


def test_serving_an_onnx_export_loads_no_tensorflow_where_it_is_installed(model_onnx, jobs):
    """With TensorFlow installed, importing the package imported it (seconds
    and hundreds of MB a serving process, and with the [gpu] extra its CUDA
    libraries beside onnxruntime's): opening an ONNX export and generating,
    through the API or `txl-generate`, now loads neither it nor Keras, and
    gives what a process that has them loaded gives."""
    done = subprocess.run([sys.executable, "-c", SERVE_WITH_TENSORFLOW_INSTALLED,
                           str(model_onnx.parent)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    api, job, loaded = json.loads(done.stdout)
    assert loaded == []
    runtime = open_runtime(str(model_onnx.parent), device="cpu")
    assert api == runtime.generate([[1, 2, 3]], 6, seed=7).ids.tolist()
    with_tf = jobs.run("training.generate", [f"--model={model_onnx.parent}",
                                             "--prompt=the company said", "--num_tokens=6",
                                             "--greedy"], check=True)
    assert job == with_tf.stdout and job.startswith("the company said ")


def test_the_onnx_runtime_on_the_cpu_needs_no_onnx_package(model_onnx):
    """README's serving box: numpy and onnxruntime only (onnx shares the
    weights between sessions when it is there)."""
    out = _run_without_tensorflow(also=("onnx",), code=f"""
        import json, sys
        from export import open_runtime
        rt = open_runtime({str(model_onnx)!r}, device="cpu")
        print(json.dumps(rt.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    assert json.loads(out) == runtime.generate([[1, 2, 3]], 6, temperature=0.8, seed=7).ids.tolist()


def _serving_box_packages(text):
    """The distributions a serving-box install line names (extras and quotes dropped)."""
    words = re.findall(r"[\w.\-\[\],\"]+", text)
    return {w.strip('"').split("[")[0].lower().replace("_", "-") for w in words} - {
        "pip", "install", "--no-deps", ".", "plus", "or"}


def test_the_serving_box_needs_only_the_packages_the_docs_install(model_onnx, words):
    """README's and docs/export-and-serving.md's serving box: the package with
    `--no-deps` plus the packages they name. Every other requirement of
    setup.py is unimportable here (absl-py was needed but not named); text
    goes in and out through the export's word vocabulary."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^`pip install --no-deps \.` plus (.*)$", readme, re.M).group(1)
    docs = (ROOT / "docs" / "export-and-serving.md").read_text()
    section = docs.split("### Serving without TensorFlow", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    installs = " ".join(l.split("#")[0] for l in block.splitlines() if "pip install" in l)
    named = _serving_box_packages(" ".join(re.findall(r"`([^`]*)`", line)))
    named &= _serving_box_packages(installs)  # what both name of setup.py's requirements
    assert "numpy" in named, named
    setup = (ROOT / "setup.py").read_text()
    requires = re.search(r"install_requires=\[(.*?)\]", setup, re.S).group(1)
    required = {re.split(r"[<>=\[]", r)[0].lower() for r in re.findall(r'"([^"]+)"', requires)}
    modules = {name: module for module, names in importlib.metadata.packages_distributions().items()
               for name in (n.lower() for n in names)}
    blocked = sorted(modules.get(name, name.replace("-", "_")) for name in required - named)
    assert "tensorflow" in blocked and "numpy" not in blocked, blocked
    out = _run_without_tensorflow(also=blocked, code=f"""
        import json, sys
        import export
        from txl_tf.text import load_tokenizer
        rt = export.open_runtime({str(model_onnx)!r}, device="cpu")
        table = export.SessionTable(rt, max_batch=2)
        table.open("a", [1, 2, 3], 2)
        table.step()
        words = load_tokenizer({str(model_onnx.parent / "vocab")!r})  # the export's vocab/
        ids = rt.generate([words.encode("the company")], 6, temperature=0.8, seed=7).ids
        print(json.dumps(words.decode(ids[0])))
    """)
    runtime = open_runtime(str(model_onnx), device="cpu")
    ids = runtime.generate([words.encode("the company")], 6, temperature=0.8, seed=7).ids
    assert json.loads(out) == words.decode(ids[0])


# What a tokenizer makes of each text (ids, decoded text, prompt ids, or the
# error) and of bad ids: run here and in the process without TensorFlow.
READINGS = textwrap.dedent("""
    def readings(tok, texts, bad_ids):
        from txl_tf.text.prompt import prompt_ids
        out = []
        for text in texts:
            text = bytes.fromhex(text[1]) if isinstance(text, list) else text
            try:
                ids = tok.encode(text)
                out.append([str(ids.dtype), ids.tolist(), tok.decode(ids),
                            prompt_ids(tok, text).tolist()])
            except Exception as error:
                out.append(f"{type(error).__name__}: {error}")
        for ids in bad_ids:
            try:
                out.append(tok.decode(ids))
            except Exception as error:
                out.append(f"{type(error).__name__}: {error}")
        return out
""")


def test_the_tokenizers_read_text_without_tensorflow_as_with_it(model_onnx, words, tmp_path):
    """Each kind of tokenizer gives the same ids, texts and errors without
    TensorFlow as with it (and encode_tf's ids), on real text, odd text and bad
    input, but SentencePiece's encode, which says it needs tensorflow-text; an
    export's vocab/ turns a prompt into ids and the ids generated into text;
    encode_tf and a SentencePiece model without its package say what they need."""
    import tensorflow as tf
    shakespeare = _real_text("tinyshakespeare.txt", 40_000)
    wiki = _real_text("wikitext2.valid.txt", 40_000)
    kinds = {"byte": ByteTokenizer(), "char": CharTokenizer.build(shakespeare[:20_000]),
             "char_no_unk": CharTokenizer.build(shakespeare[:20_000], unk_char=None),
             "word": words,
             "word_lm1b": WordTokenizer.build(wiki[:20_000], unk_token=None, bos_token="<S>"),
             "sentencepiece": SentencePieceTokenizer.train(texts=shakespeare[:20_000],
                                                           vocab_size=400)}
    folders = {kind: str(tok.save(tmp_path / kind)) for kind, tok in kinds.items()}
    texts = [shakespeare[20_000:], wiki[20_000:], _real_text("ptb.valid.txt", 120_000)[100_000:],
             "", "\n", "\n\n", "First Citizen:\nBefore we proceed", "  indented\tline\n",
             "h\u00e9llo \u2603 na\u00efve \U0001d11e \u65e5\u672c\n", "zyzzyva qwxz\n",
             "a\x00b\r\nc\rd \u2028e\ufeff", "the\r", "a\ud800b", ["bytes", "6f6b20ff"],
             ["bytes", "636166c3a90a"], 5]
    bad_ids = [[], [399], [-1], [1.5], [[1, 2]], "ab"]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([folders, texts, bad_ids]), encoding="utf-8")
    export_dir = model_onnx.parent
    prompt = "the company said"
    out = _run_without_tensorflow(READINGS + textwrap.dedent(f"""
        import json, sys
        class NoSentencePiece:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "sentencepiece":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        no_sentencepiece = NoSentencePiece()
        sys.meta_path.insert(0, no_sentencepiece)
        from txl_tf.text import load_tokenizer
        from txl_tf.text.prompt import prompt_ids
        folders, texts, bad_ids = json.loads(open({str(cases)!r}, encoding="utf-8").read())
        try:
            load_tokenizer(folders["sentencepiece"])
        except ImportError as error:
            needs = {{"sentencepiece": str(error)}}
        sys.meta_path.remove(no_sentencepiece)
        try:
            load_tokenizer(folders["byte"]).encode_tf("a")
        except ImportError as error:
            needs["encode_tf"] = str(error)
        said = {{kind: readings(load_tokenizer(folder), texts, bad_ids)
                for kind, folder in folders.items()}}
        from export import open_runtime
        rt = open_runtime({str(export_dir)!r}, device="cpu")
        tok = load_tokenizer({str(export_dir / "vocab")!r})
        ids = rt.generate([prompt_ids(tok, {prompt!r})], 8, temperature=0.8, seed=7).ids
        tf_modules = [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")]
        print(json.dumps([needs, said, tok.vocab_size == rt.n_token, tok.decode(ids[0]),
                          tf_modules]))
    """))
    needs, said, same_size, generated, tf_modules = json.loads(out)
    assert "pip install sentencepiece" in needs["sentencepiece"], needs
    assert "ByteTokenizer.encode_tf needs TensorFlow" in needs["encode_tf"], needs
    assert same_size and tf_modules == []
    namespace = {}
    exec(READINGS, namespace)
    needs_tf_text = "ImportError: SentencePieceTokenizer.encode needs tensorflow-text"
    for kind, tok in kinds.items():
        want, got = namespace["readings"](tok, texts, bad_ids), said[kind]
        if kind == "sentencepiece":  # its ids are tensorflow-text's: bad text fails first
            assert all(g.startswith(needs_tf_text) for g, w in zip(got, want)
                       if isinstance(w, list)), got
            got = [w if isinstance(w, list) else g for g, w in zip(got, want)]
        assert got == want, kind
        for text, reading in zip(texts, want):
            if isinstance(reading, list):  # encode_tf (tf.data's) gives encode's ids
                text = bytes.fromhex(text[1]) if isinstance(text, list) else text
                assert tok.encode_tf(tf.constant(text)).numpy().tolist() == reading[1], kind
    readable = sum(isinstance(r, list) for r in said["word"])
    assert readable == len(texts) - 3 and said["word"][0][1], said["word"]  # 3 bad texts
    runtime = open_runtime(str(export_dir), device="cpu")
    ids = runtime.generate([prompt_ids(words, prompt)], 8, temperature=0.8, seed=7).ids
    assert generated == words.decode(ids[0]) and generated.strip()


def test_the_tensorflow_names_say_they_need_it():
    out = _run_without_tensorflow("""
        import txl_tf
        try:
            txl_tf.TransformerXL
        except ImportError as error:
            print(error)
    """)
    assert "txl_tf.TransformerXL needs TensorFlow" in out and "ONNX Runtime" in out


def test_a_saved_model_without_tensorflow_says_it_needs_it(tmp_path):
    """`open_runtime` on a SavedModel there was a bare `No module named
    'tensorflow'` from deep in the export package."""
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "saved_model" / "saved_model.pb").write_bytes(b"")
    out = _run_without_tensorflow(f"""
        from export import open_runtime
        try:
            open_runtime({str(tmp_path)!r}, backend="saved_model")
        except ImportError as error:
            print(error)
    """)
    assert "SavedModel" in out and "needs TensorFlow" in out and "model.onnx" in out, out


def test_the_long_memory_benchmark_times_an_export_without_tensorflow(model_onnx, tmp_path):
    """As on the GPU machine: its bound's reads and its ONNX rows need no TensorFlow."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "out").symlink_to(model_onnx.parent)
    _run_without_tensorflow(f"""
        import runpy, sys
        sys.argv = ["long_memory", "--presets=tiny", "--mem_len={CONFIG.mem_len}",
                    "--backends=onnx", "--batch_sizes=1", "--tokens=2", "--noturns",
                    "--nosessions", "--reuse_exports", "--work_dir={tmp_path}",
                    "--output={tmp_path / 'result.json'}"]
        runpy.run_module("benchmarks.long_memory", run_name="__main__")
    """)
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result["reads_gb_per_s"]) == {"numpy", "onnxruntime"}
    [row] = result["rows"]
    assert row["backend"] == "onnx" and row["per_token_ms"] > 0 and row["over_bound"] > 0


def test_the_xla_backend_without_tensorflow_is_one_error_line():
    """`benchmarks.long_memory --backends=xla` on a box without TensorFlow:
    one `error:` line saying what it needs (was an ImportError traceback)."""
    code = BLOCK + textwrap.dedent("""
        import runpy, sys
        sys.argv = ["long_memory", "--backends=xla", "--presets=tiny"]
        runpy.run_module("benchmarks.long_memory", run_name="__main__")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1].startswith(
        "error: --backends=xla needs TensorFlow") and "Traceback" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def sentencepiece_export(tmp_path_factory):
    """An ONNX export whose vocab/ is a SentencePiece model."""
    root = tmp_path_factory.mktemp("spm")
    spm = SentencePieceTokenizer.train(texts=_real_text("tinyshakespeare.txt", 20_000),
                                       vocab_size=400)
    config = TransformerXLConfig.preset("tiny", n_token=spm.vocab_size, mem_len=4)
    save_pretrained(TransformerXL(config), root / "model", spm)
    run_export(str(root / "out"), str(root / "model"), formats=("onnx",), verify=False)
    return root / "out"


# Runs `python -m training.generate` command lines in forked children of a
# process where TensorFlow cannot be imported; "-c" cases run code first.
GENERATE_WITHOUT_TENSORFLOW = textwrap.dedent("""
    import json, sys
    from tests.cli_runner import run_forked
    import training.generate  # noqa: F401  (imported once, before the forks)
    print(json.dumps([run_forked(module, args, 120) for module, args in json.loads(sys.argv[1])]))
""")
NO_SENTENCEPIECE = textwrap.dedent("""
    import runpy, sys
    class NoSentencePiece:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "sentencepiece":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoSentencePiece())
    sys.argv = ["generate", *sys.argv[1:]]
    runpy.run_module("training.generate", run_name="__main__", alter_sys=True)
""")


def test_the_generate_job_on_an_onnx_export_runs_without_tensorflow(model_onnx,
                                                                   sentencepiece_export, jobs):
    """`python -m training.generate --model=<export>` prints the same text
    without TensorFlow as with it (greedy; sampled with a seed, top-k/top-p,
    a repetition penalty and a stop id); a SentencePiece vocab/ (its encode
    needs tensorflow-text; without sentencepiece it cannot load) and a Keras
    model directory are one `error:` line each, naming what to install."""
    export_dir = model_onnx.parent
    runs = {"greedy": [f"--model={export_dir}", "--prompt=the company said", "--num_tokens=12",
                       "--greedy"],
            "sampled": [f"--model={model_onnx}", "--prompt=the company said",
                        "--num_tokens=16", "--temperature=0.8", "--top_k=20", "--top_p=0.9",
                        "--repetition_penalty=1.3", "--seed=7", "--stop_ids=5"]}
    failing = {"tensorflow-text": ("training.generate", [f"--model={sentencepiece_export}",
                                                         "--prompt=First Citizen", "--greedy"]),
               "sentencepiece": ("-c", [NO_SENTENCEPIECE, f"--model={sentencepiece_export}",
                                        "--prompt=First Citizen", "--greedy"]),
               "keras": ("training.generate", [f"--model={export_dir.parent / 'model'}",
                                               "--prompt=the company said"])}
    cases = [("training.generate", args) for args in runs.values()] + list(failing.values())
    code = BLOCK + GENERATE_WITHOUT_TENSORFLOW
    done = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(zip([*runs, *failing], json.loads(done.stdout)))
    for name, args in runs.items():
        with_tf = jobs.run("training.generate", args, check=True)
        assert said[name]["returncode"] == 0, said[name]["stderr"][-3000:]
        assert said[name]["stdout"] == with_tf.stdout, name
        assert with_tf.stdout.startswith("the company said ") and with_tf.stdout.strip() != (
            "the company said"), with_tf.stdout
    for needs in failing:
        out = said[needs]
        lines = out["stderr"].strip().splitlines()
        assert out["returncode"] == 2 and "Traceback" not in out["stderr"], out["stderr"]
        assert lines[-1].startswith("error: ") and out["stdout"] == "", out
    assert "pip install tensorflow-text" in said["tensorflow-text"]["stderr"]
    assert "pip install sentencepiece" in said["sentencepiece"]["stderr"]
    assert "needs TensorFlow" in said["keras"]["stderr"] and "ONNX export" in said["keras"][
        "stderr"]


def test_the_generate_job_draws_no_bar_where_tqdm_is_not_installed(model_onnx, capfd):
    """The serving box's packages hold no tqdm: where the job would draw its
    bar (stderr a terminal, stdout a file: `bar=True`) it generates without
    one (with `--progress`: its lines), not a ModuleNotFoundError."""
    from training.generate import run
    options = dict(model=str(model_onnx.parent), prompt="the company said", num_tokens=8,
                   temperature=0.8, seed=7)
    out = _run_without_tensorflow(also=("tqdm",), code=f"""
        import json, sys
        import contextlib, io
        from training.generate import run
        said = []
        for progress in (None, True):
            with contextlib.redirect_stderr(io.StringIO()) as err:
                said.append([run(bar=True, progress=progress, **{options!r}), err.getvalue()])
        print(json.dumps(said))
    """)
    capfd.readouterr()
    text = run(progress=False, **options)
    (quiet, quiet_err), (lines, lines_err) = json.loads(out)
    assert quiet == lines == text and text.strip()
    assert quiet_err == "" and lines_err.splitlines()[-1] == "generating: 8/8 (100%)", lines_err


def test_the_startup_benchmark_times_serving_beside_tensorflow_loaded_first(model_onnx, jobs,
                                                                          tmp_path):
    """`benchmarks.serving_startup`: both arms generate the same ids, the
    serving process loads neither TensorFlow nor Keras and peaks lower than
    the one that loads them first; a folder without model.onnx is one
    `error:` line."""
    output = tmp_path / "startup.json"
    jobs.run("benchmarks.serving_startup", [f"--export_dir={model_onnx.parent}", "--rounds=1",
                                            "--tokens=2", f"--output={output}"], check=True)
    result = json.loads(output.read_text())
    assert result["arms"]["serving"]["loaded"] == []
    assert result["arms"]["tensorflow_first"]["loaded"] == ["keras", "tensorflow"]
    assert 0 < result["ratios"]["peak_mib"] < 1 and result["ratios"]["wall_s"] > 0
    bad = jobs.run("benchmarks.serving_startup", [f"--export_dir={tmp_path}"])
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "error: --export_dir must be an export folder holding model.onnx"), bad.stderr
