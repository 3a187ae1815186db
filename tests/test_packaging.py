"""What `pip install` gives a user: the license, the gpu extra, the flagfiles,
the shipped models."""
import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

from training import configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: builds in two test workers must not share build/
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", "benchmarks", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(out), str(source)], check=True, capture_output=True)
    (path,) = out.glob("txl_tf-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(wheel_file):
    with zipfile.ZipFile(wheel_file) as z:
        return {name: z.read(name) for name in z.namelist()
                if name.endswith((".cfg", "METADATA", "entry_points.txt")) or "LICENSE" in name
                or "/shipped/" in name}


def test_the_wheel_carries_the_license_and_the_flagfiles(wheel):
    assert any(name.endswith("LICENSE") and ".dist-info/" in name for name in wheel)
    for name in configs.names():
        assert f"training/configs/{name}.cfg" in wheel


def test_the_wheel_carries_the_shipped_models(wheel):
    from txl_tf.weights.shipped import SHIPPED
    for name in SHIPPED:
        folder = f"txl_tf/weights/shipped/{name}/"
        for file in ("config.json", "weights.npz", "vocab/tokenizer.json", "TRAINING.md"):
            assert folder + file in wheel, (folder + file, sorted(wheel))


def test_the_gpu_extra_brings_tensorflows_cuda_wheels_and_onnxruntime_gpu(wheel):
    (metadata,) = [text.decode() for name, text in wheel.items() if name.endswith("METADATA")]
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    gpu = [line for line in requires if 'extra == "gpu"' in line]
    assert any("tensorflow[and-cuda]" in line for line in gpu), gpu
    assert any("onnxruntime-gpu" in line for line in gpu), gpu
    # the ptxas XLA accepts for Hopper: CUDA 12.6.3's (the wheel 12.6.85), not and-cuda's floor
    nvcc = "Requires-Dist: nvidia-cuda-nvcc-cu12>=12.6.85"
    assert any(line.startswith(nvcc) for line in gpu), gpu
    assert "Apache-2.0" in metadata


def test_requires_python_admits_no_python_the_pinned_requirements_refuse(wheel):
    """`python_requires` said >= 3.10 while keras 3.15 and keras-hub 0.32 need
    3.11: pip on 3.10 failed on keras instead of naming the Python."""
    from importlib.metadata import distribution

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    (metadata,) = [text.decode() for name, text in wheel.items() if name.endswith("METADATA")]
    ours = SpecifierSet(re.search(r"^Requires-Python: (.+)$", metadata, re.M).group(1))
    pythons = [f"3.{minor}" for minor in range(6, 20)]
    for line in re.findall(r"^Requires-Dist: (.+)$", metadata, re.M):
        requirement = Requirement(line)
        if requirement.marker is not None:  # an extra's
            continue
        theirs = SpecifierSet(distribution(requirement.name).metadata["Requires-Python"] or "")
        refused = [v for v in pythons if v in ours and v not in theirs]
        assert not refused, (requirement.name, str(theirs), refused)


@pytest.mark.parametrize("name,broken,first_good", [
    ("tensorflow-text", "2.21.0", "2.21.1"),  # its wheel fails to import: undefined icudt77_dat
    ("torch", "2.2.2", "2.3.0"),  # built for numpy 1: beside numpy 2 no tensor reaches numpy
])
def test_the_requirements_refuse_releases_that_do_not_work(wheel, name, broken, first_good):
    from packaging.requirements import Requirement
    (metadata,) = [text.decode() for name_, text in wheel.items() if name_.endswith("METADATA")]
    (requirement,) = [Requirement(line) for line in
                      re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
                      if Requirement(line).name == name]
    assert broken not in requirement.specifier, requirement
    assert first_good in requirement.specifier, requirement


def test_flagfiles_are_found_by_name():
    assert {"enwik8_base", "wt103_large"} <= set(configs.names())
    with open(configs.path("enwik8_base"), encoding="utf-8") as f:
        assert "--warmup_steps=0" in f.read()
    with pytest.raises(ValueError, match="unknown training configuration 'nope'; known: "):
        configs.path("nope")
    listed = subprocess.run([sys.executable, "-m", "training.configs", "wt103_base"],
                            capture_output=True, text=True, cwd=ROOT, check=True)
    assert listed.stdout.strip() == configs.path("wt103_base")


def test_the_configs_module_answers_help_with_its_usage():
    """`python -m training.configs --help` was `error: unknown training
    configuration '--help'` (exit 2)."""
    for flag in ("--help", "-h"):
        shown = subprocess.run([sys.executable, "-m", "training.configs", flag],
                               capture_output=True, text=True, cwd=ROOT)
        assert shown.returncode == 0 and shown.stderr == "", (flag, shown.stderr)
        assert "python -m training.configs [NAME]" in shown.stdout, shown.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_the_configs_module_at_a_full_stdout_says_so_in_one_line():
    """`txl-configs > file` on a full disk was an OSError traceback (exit 1)."""
    with open("/dev/full", "w") as full:
        shown = subprocess.run([sys.executable, "-m", "training.configs"], stdout=full,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr == "error: cannot write to stdout: No space left on device\n"


@pytest.mark.parametrize("closed", [1, 2])
def test_the_configs_module_with_a_closed_stream_writes_nothing_there(closed):
    """`txl-configs >&-` was an AttributeError traceback ('NoneType' object
    has no attribute 'flush'), as the jobs were before `closed_streams`."""
    shown = subprocess.run([sys.executable, "-m", "training.configs", "nope"], cwd=ROOT,
                           capture_output=True, text=True, preexec_fn=lambda: os.close(closed))
    assert shown.returncode == 2 and shown.stdout == "", shown.stderr
    assert shown.stderr.startswith("" if closed == 2 else
                                   "error: unknown training configuration 'nope'")
    assert closed == 1 or shown.stderr == ""
    listed = subprocess.run([sys.executable, "-m", "training.configs"], cwd=ROOT,
                            capture_output=True, text=True, preexec_fn=lambda: os.close(closed))
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr


def test_the_installed_commands_cannot_be_shadowed_by_a_users_folders(wheel, tmp_path):
    (entry_points,) = [text.decode() for name, text in wheel.items()
                       if name.endswith("entry_points.txt")] or [None]
    for command in ("txl-train", "txl-train-lstm", "txl-evaluate", "txl-generate",
                    "txl-classify", "txl-demo", "txl-attention", "txl-recl", "txl-export",
                    "txl-convert", "txl-configs"):
        assert f"{command} = " in entry_points, command
    (tmp_path / "training").mkdir()  # a user's own package of that name
    (tmp_path / "training" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    script = os.path.join(os.path.dirname(sys.executable), "txl-train")
    shown = subprocess.run([script, "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert "--train_steps" in shown.stdout, shown.stderr[-500:]  # absl exits 1 after --help
    # `python -m training.configs` there would run the user's package: the command does not.
    script = os.path.join(os.path.dirname(sys.executable), "txl-configs")
    shown = subprocess.run([script, "wt103_base"], capture_output=True, text=True, cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.strip() == configs.path("wt103_base"), \
        shown.stderr[-500:]


def test_an_installed_commands_help_shows_its_jobs_description(tmp_path):
    """`txl-train --help` began with a bare `USAGE: .../txl-train [flags]`
    (absl shows `__main__`'s docstring: the script's, which has none), while
    `python -m training.train --help` shows the job's."""
    for command, source in (("txl-train", "training/train.py"),
                            ("txl-export", "export/__main__.py")):
        doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, source)).read()))
        script = os.path.join(os.path.dirname(sys.executable), command)
        shown = subprocess.run([script, "--help"], capture_output=True, text=True, cwd=tmp_path)
        assert shown.stdout.lstrip().startswith(doc.splitlines()[0]), shown.stdout[:300]
        assert "--model_dir" in shown.stdout, shown.stderr[-500:]


def test_the_train_helps_flagfile_example_works_outside_the_repository(tmp_path):
    """The `--flagfile=` of `training.train --help` named
    `training/configs/enwik8_base.cfg`, a path only a clone has."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    shown = subprocess.run([sys.executable, "-m", "training.train", "--help"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    value = re.search(r'--flagfile=("\$\(python -m training\.configs \w+\)"|\S+)',
                      shown.stdout).group(1)
    by_name = re.fullmatch(r'"\$\(python -m training\.configs (\w+)\)"', value)
    path = configs.path(by_name.group(1)) if by_name else tmp_path / value
    assert os.path.isfile(path), value


def dependency_folders():
    """The folders this interpreter's installed distributions are in (its
    purelib, and platlib, the user's site, a system site where they differ:
    TensorFlow is often in one of those), never the repository's own."""
    from importlib.metadata import distributions
    folders = {os.path.realpath(sysconfig.get_paths()["purelib"])}
    for dist in distributions():
        if (dist.metadata["Name"] or "").lower().replace("_", "-") != "txl-tf":
            folders.add(os.path.realpath(str(dist.locate_file(""))))
    return sorted(f for f in folders if os.path.isdir(f) and f != os.path.realpath(ROOT))


def test_the_wheel_in_a_fresh_venv_runs_from_an_empty_folder(wheel_file, tmp_path):
    """A user's install: the wheel alone in a new venv (this one's packages for
    TensorFlow and the rest, through a path file, not its txl_tf), run from a
    folder that is not the repository: the modules, the flagfiles and the
    shipped model come from the venv, and a command evaluates the shipped model."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no repository
    env.update(TXL_TF_CACHE=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", str(wheel_file)], check=True, capture_output=True, env=env)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_dependencies.pth"), "w") as f:
        f.writelines(folder + "\n" for folder in dependency_folders())
    home.mkdir()

    def run(*command):
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                              cwd=home, env=env, timeout=300)
        assert done.returncode == 0, (command, done.stderr[-2000:])
        return done.stdout

    files = run(python, "-c", "import txl_tf, training, export; from txl_tf.weights.shipped "
                "import shipped_model_dir; print(txl_tf.__file__, training.__file__, "
                "export.__file__, shipped_model_dir('pystdlib_small'))").split()
    assert all(path.startswith(site) for path in files), (site, files)
    flagfile = run(python, "-m", "training.configs", "wt103_base").strip()
    assert flagfile.startswith(site) and os.path.isfile(flagfile), flagfile
    shown = run(venv / "bin" / "txl-evaluate", "--model_dir=pystdlib_small", "--max_segments=1",
                "--batch_size=1", "--noprogress")
    assert shown.startswith("pystdlib valid: bpc "), shown


def test_a_wheel_built_from_the_sdist_holds_what_the_repositorys_does(wheel_file, tmp_path):
    """The sdist carries what building the wheel needs: setup.py's README and
    LICENSE, the flagfiles and the shipped model (no MANIFEST.in)."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", "benchmarks", "tests"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "sdist")],
                   cwd=source, check=True, capture_output=True)
    (sdist,) = (tmp_path / "sdist").glob("txl_tf-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "unpacked",
                       **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(tmp_path / "dist"), str(unpacked)], check=True,
                   capture_output=True)
    (rebuilt,) = (tmp_path / "dist").glob("txl_tf-*.whl")
    with zipfile.ZipFile(wheel_file) as a, zipfile.ZipFile(rebuilt) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
