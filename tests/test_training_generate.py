"""Incremental generation with carried memory picks what a full recomputation picks."""
import os

import keras
import numpy as np
import pytest

from training.errors import TrainingError
from training.generate import continue_ids, run
from txl_tf import TransformerXL, TransformerXLConfig


def test_greedy_continuation_matches_full_recomputation():
    keras.utils.set_random_seed(7)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40, mem_len=64,
                                                    init_std=0.3))
    prompt = np.array([3, 14, 15, 9, 2, 6], np.int32)
    generated = continue_ids(core, prompt, 12, mem_len=64, greedy=True)
    sequence = list(prompt)
    for token in generated:
        log_probs, _ = core(np.array([sequence], np.int32), core.initial_memory(1, 0))
        last = log_probs.numpy()[0, -1]
        assert last[token] >= last.max() - 1e-5  # the best token (up to float ties)
        sequence.append(token)


def test_sampling_is_seeded():
    keras.utils.set_random_seed(8)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=40))
    a = continue_ids(core, [1, 2, 3], 20, temperature=1.0, top_k=3, seed=5)
    b = continue_ids(core, [1, 2, 3], 20, temperature=1.0, top_k=3, seed=5)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.int32 and len(a) == 20 and a.min() >= 0 and a.max() < 40


def test_word_level_continuation_is_joined_with_a_space():
    from training.generate import continue_text, continuation, prompt_ids
    from txl_tf.text import ByteTokenizer, WordTokenizer
    words = WordTokenizer(["<unk>", "<eos>", "the", "every", "river"])
    ids = prompt_ids(words, "the")
    assert list(ids) == [2]  # the prompt's line goes on: no end-of-line id
    assert "the" + continuation(words, ids, [3, 4]) == "the every river"
    assert "the\n" + continuation(words, prompt_ids(words, "the\n"), [3]) == "the\nevery"
    byte = ByteTokenizer()
    assert "ab" + continuation(byte, prompt_ids(byte, "ab"), [99, 100]) == "abcd"
    keras.utils.set_random_seed(9)
    core = TransformerXL(TransformerXLConfig.preset("tiny", n_token=5))
    text = continue_text(core, words, "the", 4, greedy=True)
    assert text.startswith((" ", "\n"))


def test_a_character_cut_between_chunks_is_printed_once_whole():
    """A byte model writes a two-byte character in two chunks: the first
    printed a replacement character, and nothing after it was printed."""
    from types import SimpleNamespace
    from training.generate import continue_text
    from txl_tf.text import ByteTokenizer

    class Backend:  # streams its ids one at a time, as the decoders do
        def generate(self, prompt, num_tokens, stream=None, **options):
            new = list("\u00e9!\u20ac".encode())[:num_tokens]
            for i in new:
                stream(np.array([[i]], np.int32))
            return SimpleNamespace(ids=np.array([new], np.int32), lengths=np.array([len(new)]))

    pieces = []
    text = continue_text(Backend(), ByteTokenizer(), "ab", 6, write=pieces.append)
    assert text == "".join(pieces) == "\u00e9!\u20ac"


def test_the_job_generates_from_a_model_dir_an_onnx_file_and_a_saved_model(tmp_path):
    import shutil
    from export import export_onnx, export_saved_model
    from training.generate import run
    from txl_tf.weights import save_pretrained
    from txl_tf.text import ByteTokenizer
    keras.utils.set_random_seed(10)
    core = TransformerXL(TransformerXLConfig.preset("tiny", init_std=0.3))
    save_pretrained(core, str(tmp_path / "model"))
    ByteTokenizer().save(str(tmp_path / "model" / "vocab"))
    out = tmp_path / "out"
    out.mkdir()
    export_onnx(core, str(out / "model.onnx"), 16, log_probs="last")
    export_saved_model(core, str(out / "saved_model"), 16, vocab_dir=str(tmp_path / "model" /
                                                                         "vocab"))
    shutil.copytree(tmp_path / "model" / "vocab", out / "vocab")
    texts = {}
    for model in ("model", "out/model.onnx", "out/saved_model", "out"):
        pieces = []
        texts[model] = run(write=pieces.append, model=str(tmp_path / model), prompt="ab",
                           num_tokens=12, temperature=0.9, top_p=0.9, seed=4, progress=False)
        assert "".join(pieces) == texts[model]
    assert len(set(texts.values())) == 1, texts
    stop = texts["model"][3]
    for model in ("model", "out/model.onnx", "out/saved_model"):
        pieces = []  # what is printed as it streams must be what is returned
        stopped = run(write=pieces.append, model=str(tmp_path / model), prompt="ab",
                      num_tokens=12, temperature=0.9, top_p=0.9, seed=4, progress=False,
                      stop_ids=[str(ord(stop))])
        assert stopped == texts["model"][:texts["model"].index(stop) + 1], model
        assert "".join(pieces) == stopped, model


@pytest.mark.parametrize("count", [-1, 2 ** 30 + 1, 2 ** 31, 2 ** 63])
def test_num_tokens_outside_what_one_decode_holds_is_refused_with_the_flags(count):
    """2**31 and beyond ran without end; refused before the model is read."""
    with pytest.raises(TrainingError, match=rf"^--num_tokens must be in \[0, 1073741824\], "
                                            rf"got {count}$"):
        run(model="nowhere", prompt="a", num_tokens=count)


def test_num_tokens_whose_ids_cannot_fit_are_refused_with_the_flag(monkeypatch):
    """Refused before the model is read (it was after: `max_new_tokens`, or a
    MemoryError once generated)."""
    from txl_tf.checks import memory_budget
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 2 ** 30)
    with pytest.raises(memory_budget.MemoryBudgetError,
                       match=r"^--num_tokens 134,217,729 for 1 row needs at least 1\.0 GiB .* "
                             r"lower --num_tokens$"):
        run(model="nowhere", prompt="a", num_tokens=2 ** 27 + 1)


def test_num_tokens_whose_ids_fit_but_not_the_decode_loops_buffer_are_refused_with_the_flag(
        monkeypatch):
    """The early check left out the core's decode loop buffer (8 positions
    when streamed): a size just under the limit passed it and was refused
    later as `max_new_tokens`, after the model was read."""
    from txl_tf.checks import memory_budget
    monkeypatch.setattr(memory_budget, "available_bytes", lambda: 2 ** 30)
    count = 2 ** 27 - 4  # its ids and log-probs fit in 2**30 bytes, with 8 more positions not
    with pytest.raises(memory_budget.MemoryBudgetError,
                       match=r"^--num_tokens 134,217,724 for 1 row needs at least 1\.0 GiB "
                             r"\(.*decode loop's buffer of 8, .* lower --num_tokens$"):
        run(model="nowhere", prompt="a", num_tokens=count)


@pytest.mark.parametrize("options, message", [
    (dict(prompt=""), r"--prompt must not be empty"),
    (dict(top_k=-1), r"--top_k must be >= 0, got -1"),
    (dict(device="tpu"), r"--device must be auto, cpu, cuda or gpu, got 'tpu'"),
])
def test_generation_flags_wrong_on_their_own_are_named_before_the_model_loads(options, message):
    with pytest.raises(TrainingError, match=f"^{message}$"):
        run(**{"model_dir": "nowhere", "prompt": "a", **options})


class _Stream:
    """A text stream that is (or is not) a terminal, or writes into a pipe."""

    def __init__(self, tty, pipe=None):
        import io
        self.buffer, self.tty, self.pipe = io.StringIO(), tty, pipe

    def isatty(self):
        return self.tty

    def fileno(self):
        if self.pipe is None:
            import io
            raise io.UnsupportedOperation("fileno")
        return self.pipe

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass


@pytest.mark.parametrize("stdout_tty,flag,bar,lines,piped", [
    (True, None, False, False, False),   # the text itself shows the progress
    (True, True, False, True, False),    # asked for: lines, never a bar over the text
    (False, None, True, False, False),   # `> out.txt`: the terminal shows a bar
    (False, None, False, False, True),   # `| tee out.txt`: the text shows on the terminal
    (False, True, False, True, True),
])
def test_the_command_draws_no_bar_over_the_text_it_streams_to_the_same_terminal(
        tmp_path, monkeypatch, stdout_tty, flag, bar, lines, piped):
    """On a terminal `txl-generate` drew its tqdm bar on stderr while it
    streamed the continuation to stdout, the same terminal: each frame's
    `\\r` wrote the bar over the text just printed, and the bar's closing
    erased the last line of the text. Through a pipe (`| tee out.txt`,
    `| less`) the text most likely lands on that terminal too."""
    from training import generate
    from txl_tf.text import ByteTokenizer
    from txl_tf.weights import save_pretrained
    keras.utils.set_random_seed(11)
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny")), str(tmp_path / "m"),
                    ByteTokenizer())
    options = {**generate.merge(generate.SPEC, {}), "model": str(tmp_path / "m"),
               "prompt": "ab", "num_tokens": 40, "progress": flag}
    monkeypatch.setattr(generate, "values", lambda spec: dict(options))
    read_end, write_end = os.pipe() if piped else (None, None)
    out, err = _Stream(stdout_tty, write_end), _Stream(True)
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    try:
        generate.main([])
    finally:
        if piped:
            os.close(read_end)
            os.close(write_end)
    text, log = out.buffer.getvalue(), err.buffer.getvalue()
    assert text.startswith("ab") and len(text) > 3
    assert ("\r" in log) == bar, repr(log)
    assert ("generating: 40/40 (100%)\n" in log) == lines, repr(log)
