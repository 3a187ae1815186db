"""Ids and files that do not depend on the process's string hashing: two
processes with different PYTHONHASHSEED values build the same vocabularies,
labels, cached corpus and first batches."""
import json
import subprocess
import sys

from job_helpers import REPO, job_env, tail

# Ties everywhere: words, characters and labels seen equally often, class
# folders and files whose order a set or an unsorted listing would change.
_BUILD = r"""
import hashlib, json, sys
from pathlib import Path
import numpy as np
from txl_tf.classification.data import read_examples
from txl_tf.classification.labels import LabelSet
from txl_tf.data.corpora import load_corpus
from txl_tf.data.stream import segment_dataset
from txl_tf.text import CharTokenizer, WordTokenizer

root = Path(sys.argv[1])
text = " ".join(f"w{i} v{i} t{i % 7} é{i % 3}" for i in range(40)) + "\nfoo bar baz qux\n"
out = {"word": WordTokenizer.build(text).entries(), "char": CharTokenizer.build(text).entries(),
       "labels": LabelSet.from_labels(["b", "a", "é", "B", "zz", "a", "Q"]).names}
(root / "tsv.txt").write_text("".join(f"{c}\t{c} {i}\n" for i, c in enumerate("yxzαwx" * 2)),
                              encoding="utf-8")
for name, where in (("folder", root / "classes"), ("tsv", root / "tsv.txt")):
    if name == "folder":
        for c in ["pos", "neg", "Zed", "ämne", "mid"]:
            (where / c / "sub").mkdir(parents=True)
            for k in "qbza":
                (where / c / f"{k}.txt").write_text(f"{c} {k}", encoding="utf-8")
                (where / c / "sub" / f"{k}.txt").write_text(f"{c} sub {k}", encoding="utf-8")
    examples = read_examples(where)
    out[name] = [examples.labels.names, list(examples.texts), examples.label_ids.tolist()]
(root / "wt2").mkdir()
for split in ("train", "valid", "test"):
    (root / "wt2" / f"wiki.{split}.tokens").write_text(text * 2, encoding="utf-8")
corpus = load_corpus("wt2", root / "wt2", cache_dir=root / "cache")
(entry,) = (root / "cache").iterdir()  # meta.json holds the sources' paths and mtimes
out["cache"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(entry.rglob("*")) if p.is_file() and p.name != "meta.json"}
out["batches"] = [[np.asarray(t).tolist() for t in batch]
                  for batch in segment_dataset(np.asarray(corpus.train), 2, 5).take(2)]
print(json.dumps(out, ensure_ascii=False))
"""


def _build(folder, hash_seed):
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(folder)], cwd=REPO,
                          env=job_env(PYTHONHASHSEED=str(hash_seed)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, tail(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_hash_seeds_build_the_same_ids_files_and_batches(tmp_path):
    first, second = _build(tmp_path / "a", 0), _build(tmp_path / "b", 12345)
    for key in first:
        assert first[key] == second[key], key
    assert first["folder"][0] == ["Zed", "mid", "neg", "pos", "ämne"]  # code point order
    assert first["labels"] == ["B", "Q", "a", "b", "zz", "é"]
