"""benchmarks.memory_worth's shakespeare part: a quality row is a
distribution, one model per seed, each memory's median bpc and its range."""
import json

import pytest

import benchmarks.memory_worth as mw
from training.errors import TrainingError
from txl_tf.app.flagspec import defaults


def options(tmp_path, **changes):
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be\n", encoding="utf-8")
    o = dict(defaults(mw.SHAKESPEARE_SPEC), data=str(data), model_dir=str(tmp_path / "runs"),
             output=str(tmp_path / "out.json"))
    o.update(changes)
    return o


def test_one_model_per_seed_and_each_memorys_median_and_range(tmp_path, monkeypatch):
    trained = []

    def run(o, seed, model_dir):
        trained.append((seed, model_dir))
        bpc = {0: 2.40, 1: 2.43, 2: 2.38}[seed]
        return {"seed": seed, "config": {}, "parameters": 10, "tgt_len": 64,
                "train_mem_len": 64, "steps": 100 + seed, "train_bytes": 90, "valid_bytes": 10,
                "validation": [{"mem_len": 64, "bpc": bpc}, {"mem_len": 192, "bpc": bpc + 0.01},
                               {"mem_len": 0, "bpc": bpc + 0.2}]}
    monkeypatch.setattr(mw, "shakespeare_run", run)
    report = mw.run_shakespeare(options(tmp_path, seeds="0,1,2"))
    assert [seed for seed, _ in trained] == [0, 1, 2]
    assert len({folder for _, folder in trained}) == 3  # a folder per seed
    rows = json.loads((tmp_path / "out.json").read_text())["validation"]
    assert rows == report["validation"]
    assert [r["mem_len"] for r in rows] == [64, 192, 0]
    assert rows[0]["bpc"] == pytest.approx(2.40)
    assert (rows[0]["bpc_min"], rows[0]["bpc_max"]) == pytest.approx((2.38, 2.43))
    assert rows[2]["bpc_by_seed"] == pytest.approx([2.60, 2.63, 2.58])
    assert report["seeds"] == [0, 1, 2] and len(report["runs"]) == 3


@pytest.mark.parametrize("seeds", ["", "0,0", "a", "-1"])
def test_bad_seeds_are_an_error_naming_the_flag(tmp_path, seeds):
    with pytest.raises(TrainingError, match="seed"):
        mw.run_shakespeare(options(tmp_path, seeds=seeds))
