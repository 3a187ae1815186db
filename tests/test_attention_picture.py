"""Attention pictures: the core's probabilities, hidden cells drawn blank, the
memory | segment line, the PNG and the job."""
import sys

import keras
import matplotlib
import matplotlib.image
import numpy as np
import pytest
from reference_numpy import forward as reference_forward
from test_core import VARIANTS, ids, make_core

from training import attention_picture as job
from training.errors import TrainingError
from txl_tf import TransformerXL, TransformerXLConfig
from txl_tf.classification.attention_picture import (BLANK, LINE, SegmentAttention, attention_image,
                                      cell_slices, segment_attention, write_attention_png)
from txl_tf.weights import get_weights, save_pretrained


# ------------------------------------------------------- the core's probabilities
@pytest.mark.parametrize("name", ["plain", "untied_r_same_length_clamp",
                                  "pre_lnorm_untied_outputs"])
def test_probabilities_equal_the_numpy_transcription_of_the_paper_code(name):
    core = make_core(**VARIANTS[name])
    cfg, weights = core.config, get_weights(core)
    x1, x2 = ids(2, 5, 1), ids(2, 5, 2)
    zero = [np.zeros((cfg.mem_len, 2, cfg.d_model))] * cfg.n_layer
    ref1, ref2 = [], []
    _, ref_mems = reference_forward(weights, cfg, x1.T, zero, attention=ref1)
    reference_forward(weights, cfg, x2.T, ref_mems, attention=ref2)
    for layer in range(cfg.n_layer):
        memory = core.initial_memory(2, zero_filled=True)
        probs1, memory = core.attention_probabilities(x1, memory, layer)
        probs2, _ = core.attention_probabilities(x2, memory, layer)
        for probs, ref in ((probs1, ref1), (probs2, ref2)):
            assert probs.dtype == "float32" and probs.shape == (2, cfg.n_head, 5, 21)
            np.testing.assert_allclose(probs.numpy(), ref[layer].transpose(2, 3, 0, 1),
                                       atol=2e-6)
            np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, atol=1e-5)


def test_hidden_keys_get_exactly_zero_and_the_memory_is_calls():
    core = make_core()
    x1, x2 = ids(2, 5, 1), ids(2, 5, 2)
    _, memory = core(x1, core.initial_memory(2, mem_len=8))  # 3 empty slots, then 5
    probs, new_memory = core.attention_probabilities(x2, memory, 1)
    _, expected_memory = core(x2, memory)
    np.testing.assert_array_equal(new_memory.mems.numpy(), expected_memory.mems.numpy())
    np.testing.assert_array_equal(new_memory.mem_mask.numpy(), expected_memory.mem_mask.numpy())
    p = probs.numpy()
    query, key = np.arange(5)[:, None], np.arange(13)[None, :]
    hidden = (key < 3) | (key > 8 + query)  # empty slots; future keys
    assert (p[:, :, hidden] == 0).all() and (p[:, :, ~hidden] > 0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    # Read with memory, segment 2 attends as one 10-token pass does.
    whole, _ = core.attention_probabilities(np.concatenate([x1, x2], 1),
                                            core.initial_memory(2, mem_len=0), 1)
    np.testing.assert_allclose(p[..., 3:], whole.numpy()[:, :, 5:], atol=1e-5)


@pytest.mark.parametrize("attn_type", [1, 2, 3])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_every_attention_type_gives_its_probabilities(attn_type, pre_lnorm):
    """attn_type 2 and 3 (no u, v biases: None) failed inside TensorFlow
    casting the biases ("Attempt to convert a value (None)")."""
    keras.utils.set_random_seed(1)
    core = TransformerXL(TransformerXLConfig(n_token=256, n_layer=2, d_model=16, n_head=2,
                                             d_head=8, d_inner=16, tgt_len=5, mem_len=8,
                                             attn_type=attn_type, pre_lnorm=pre_lnorm,
                                             init_std=0.3, dropout=0.0))
    x1, x2 = ids(2, 5, 1), ids(2, 5, 2)
    _, memory = core(x1, core.initial_memory(2))  # 3 empty slots, then 5
    for layer in range(2):
        probs, new_memory = core.attention_probabilities(x2, memory, layer)
        _, expected_memory = core(x2, memory)
        np.testing.assert_array_equal(new_memory.mems.numpy(), expected_memory.mems.numpy())
        p = probs.numpy()
        assert p.dtype == np.float32 and p.shape == (2, 2, 5, 13)
        query, key = np.arange(5)[:, None], np.arange(13)[None, :]
        hidden = (key < 3) | (key > 8 + query)  # empty slots; future keys
        assert (p[:, :, hidden] == 0).all() and (p[:, :, ~hidden] > 0).all()
        np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
        assert p[:, :, ~hidden].std() > 1e-3  # not uniform: the scores reached it


def test_the_normal_path_is_unchanged_by_asking_for_probabilities():
    core = make_core()
    x = ids(1, 6)
    memory = core.initial_memory(1, mem_len=4)
    before, _ = core(x, memory)
    core.attention_probabilities(x, memory, 0)
    after, _ = core(x, memory)
    np.testing.assert_array_equal(before.numpy(), after.numpy())


@pytest.mark.parametrize("layer", [2, -1, 0.5, True])
def test_a_bad_layer_is_named(layer):
    core = make_core()
    with pytest.raises(ValueError, match=r"layer must be an integer in \[0, 2\)"):
        core.attention_probabilities(ids(1, 3), core.initial_memory(1), layer)


# ------------------------------------------------------------ one segment's attention
def test_segment_attention_reads_the_earlier_segments_into_memory():
    core = make_core()
    tokens = ids(1, 13)[0]
    attn = segment_attention(core, tokens, layer=1, segment=-1, seg_len=5, mem_len=8)
    assert attn.segment == 2 and attn.n_memory == 8 and attn.layer == 1
    np.testing.assert_array_equal(attn.key_ids, tokens[2:13])  # 8 slots, then 3 tokens
    np.testing.assert_array_equal(attn.query_ids, tokens[10:13])
    first = segment_attention(core, tokens, layer=1, segment=0, seg_len=5, mem_len=8)
    np.testing.assert_array_equal(first.key_ids, [-1] * 8 + list(tokens[:5]))
    assert not first.visible[:, :8].any()
    np.testing.assert_allclose(attn.weights(), attn.probs.mean(0))
    np.testing.assert_array_equal(attn.weights(1), attn.probs[1])
    with pytest.raises(ValueError, match=r"head must be None \(the mean\) or an integer"):
        attn.weights(2)
    with pytest.raises(ValueError, match=r"segment must be an integer in \[-3, 3\): 13 tokens "
                                         r"make 3 segments of 5, got 3"):
        segment_attention(core, tokens, layer=1, segment=3, seg_len=5)
    for bad in (dict(segment=1.7), dict(segment=True), dict(seg_len=5.5), dict(seg_len=0)):
        with pytest.raises(ValueError, match=r"(segment|seg_len) must be an integer"):
            segment_attention(core, tokens, layer=1, **{"seg_len": 5, **bad})


@pytest.mark.parametrize("bad", [2 ** 32 + 3, -1, 2 ** 31])
def test_segment_attention_names_an_id_that_int32_would_wrap(bad):
    core = make_core()
    n_token = core.config.n_token
    tokens = np.array([1, 2, bad], np.int64)  # 2**32 + 3 as int32 is 3, a valid id
    with pytest.raises(ValueError, match=rf"token id {bad} at position \(2,\) is out of "
                                         rf"range for a vocabulary of {n_token} tokens"):
        segment_attention(core, tokens, layer=0)


# ------------------------------------------------------------------ the picture
def _picture(cell=4, line=2):
    core = make_core()
    attn = segment_attention(core, ids(1, 10)[0], layer=0, segment=1, seg_len=5, mem_len=8)
    weights = attn.weights(None)
    return attn, weights, attention_image(weights, attn.visible, attn.n_memory, cell, line)


def test_hidden_cells_are_blank_and_visible_cells_are_coloured():
    attn, weights, image = _picture()
    assert image.dtype == np.uint8 and image.shape == (5 * 4, 13 * 4 + 2, 3)
    hidden = 0
    for i in range(5):
        for j in range(13):
            block = image[cell_slices(i, j, 8, 4, 2)]
            colours = {tuple(c) for c in block.reshape(-1, 3)}
            assert len(colours) == 1  # one flat colour per cell
            future, empty = j > 8 + i, j < 3  # 5 tokens fill 5 of the 8 slots
            if future or empty:
                assert colours == {BLANK}, (i, j)
                hidden += 1
            else:
                assert colours.isdisjoint({BLANK, LINE}), (i, j)
    assert hidden == 5 * 3 + (4 + 3 + 2 + 1)  # the empty slots and the causal triangle
    # The most attended visible cell is the colormap's top (viridis yellow).
    i, j = np.unravel_index(np.where(attn.visible, weights, -1).argmax(), weights.shape)
    top = tuple(matplotlib.colormaps["viridis"](1.0, bytes=True)[:3])
    assert tuple(image[cell_slices(i, j, 8, 4, 2)][0, 0]) == top


@pytest.mark.parametrize("n_memory", [0, 3, 7])
def test_the_line_parts_memory_from_segment(n_memory):
    weights = np.full((4, n_memory + 4), 0.25)
    image = attention_image(weights, np.ones_like(weights, bool), n_memory, cell=5, line=3)
    columns = [j for j in range(image.shape[1]) if (image[:, j] == LINE).all()]
    assert columns == [5 * n_memory, 5 * n_memory + 1, 5 * n_memory + 2]


def test_the_png_holds_the_image_pixel_for_pixel(tmp_path):
    attn, weights, _ = _picture()
    labels = [str(i) for i in attn.key_ids]
    path = write_attention_png(str(tmp_path / "a.png"), weights, attn.visible, attn.n_memory,
                               key_labels=labels, query_labels=labels[8:], title="t", cell=6)
    png = (matplotlib.image.imread(path)[..., :3] * 255).round().astype(np.uint8)
    image = attention_image(weights, attn.visible, attn.n_memory, cell=6, line=1)
    height, width = image.shape[:2]
    found = [(y, x) for y in range(png.shape[0] - height + 1)
             for x in range(png.shape[1] - width + 1)
             if (png[y, x] == image[0, 0]).all()
             and (png[y:y + height, x:x + width] == image).all()]
    assert len(found) == 1


def test_bad_picture_inputs_are_named():
    with pytest.raises(ValueError, match=r"weights must be \[T, M \+ T\] and visible the same"):
        attention_image(np.zeros((2, 3)), np.zeros((2, 4), bool), 1)
    with pytest.raises(ValueError, match=r"n_memory must be in \[0, 3\], got 4"):
        attention_image(np.zeros((2, 3)), np.ones((2, 3), bool), 4)
    with pytest.raises(ValueError, match=r"key_labels needs 3 labels, got 2"):
        write_attention_png("x.png", np.zeros((2, 3)), np.ones((2, 3), bool), 1,
                            key_labels=["a", "b"])
    assert isinstance(_picture()[0], SegmentAttention)


# ------------------------------------------------------------------------- the job
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from txl_tf.text import ByteTokenizer
    keras.utils.set_random_seed(3)
    path = tmp_path_factory.mktemp("attention") / "model"
    save_pretrained(TransformerXL(TransformerXLConfig.preset("tiny", init_std=0.3)), str(path))
    ByteTokenizer().save(str(path / "vocab"))
    return str(path)


TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind"


def test_the_job_writes_a_png_of_the_segment(model_dir, tmp_path, jobs):
    out = str(tmp_path / "pic" / "attention.png")
    proc = jobs.run("training.attention_picture",
                   [f"--model_dir={model_dir}", f"--text={TEXT}", "--layer=-1", "--head=1",
                    "--segment=2", "--seg_len=16", "--mem_len=24", f"--output={out}"],
                    check=True)
    assert f"wrote {out}: 16 queries x 40 keys (24 memory slots)" in proc.stdout
    png = (matplotlib.image.imread(out)[..., :3] * 255).round().astype(np.uint8)
    colours = {tuple(c) for c in png.reshape(-1, 3)}
    assert BLANK in colours and LINE in colours and len(colours) > 50  # not a blank page
    # In-process, the same options give the attention the PNG was drawn from.
    attn = job.run(model_dir=model_dir, text=TEXT, layer=-1, head="1", segment=2, seg_len=16,
                   mem_len=24, output=str(tmp_path / "again.png"))
    assert attn.layer == 1 and attn.segment == 2 and attn.visible.shape == (16, 40)
    assert bytes(attn.key_ids[24:].astype(np.uint8)) == TEXT.encode()[32:48]


@pytest.mark.parametrize("options, message", [
    (dict(head="x"), r"--head must be 'mean' or a head number >= 0, got 'x'"),
    (dict(head="2"), r"--head 2 is out of range: the model has 2 heads"),
    (dict(layer=2), r"--layer 2 is out of range: the model has 2 layers"),
    (dict(segment=5, seg_len=16), r"--segment 5 is out of range: the text's 74 tokens make "
                                  r"5 segments of 16"),
    (dict(seg_len=0), r"--seg_len must be positive, got 0"),
    (dict(mem_len=-1), r"--mem_len must be >= 0, got -1"),
    (dict(output="a.jpg"), r"--output must name a \.png file"),
    (dict(text=None), r"exactly one of --text or --text_file"),
    (dict(text_file="nowhere.txt"), r"exactly one of --text or --text_file"),
    (dict(text=None, text_file="nowhere.txt"), r"--text_file 'nowhere.txt' does not exist"),
])
def test_bad_options_are_named(model_dir, tmp_path, options, message):
    base = dict(model_dir=model_dir, text=TEXT, output=str(tmp_path / "a.png"))
    with pytest.raises(TrainingError, match=message):
        job.run(**{**base, **options})


@pytest.mark.parametrize("args, message", [
    (["--layer=abc"], "error: flag --layer=abc: invalid literal"),
    (["--head=-1"], "error: --head must be 'mean' or a head number >= 0, got '-1'"),
    (["--text_file=nowhere.txt", "--text="], "error: pass the text with exactly one"),
])
def test_bad_flags_exit_2_with_one_error_line(model_dir, jobs, tmp_path, args, message):
    base = [f"--model_dir={model_dir}", f"--output={tmp_path / 'a.png'}"]
    if not any(a.startswith("--text") for a in args):
        base.append("--text=abc")
    proc = jobs.run("training.attention_picture", base + args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert not (tmp_path / "a.png").exists()


def test_a_missing_model_dir_exits_2(jobs, tmp_path):
    proc = jobs.run("training.attention_picture",
                    [f"--model_dir={tmp_path / 'nothing'}", "--text=abc",
                     f"--output={tmp_path / 'a.png'}"])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "nothing" in lines[0]


def test_without_matplotlib_the_picture_and_the_job_say_how_to_get_it(model_dir, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(ImportError, match=r"txl_tf\[viz\]"):
        attention_image(np.ones([2, 2]), np.ones([2, 2], bool), 0)
    with pytest.raises(TrainingError, match=r"need matplotlib"):
        job.run(model_dir=model_dir, text=TEXT, output=str(tmp_path / "a.png"))
    assert not (tmp_path / "a.png").exists()
