"""Small file helpers of the jobs."""
import contextlib
import json
import os
import shutil

from txl_tf.app.files import WriteError, naming, parse_json


def write_atomically(path, text):
    """Writes `text` to `path` through a temporary file and a rename, so a
    reader (or a kill) never sees half a file; creates the parent folder. A
    write that fails (a full disk) deletes the temporary and raises an
    `OSError` naming `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(path + ".tmp")
        if err.filename == path + ".tmp":  # a read-only folder: named by the file written
            raise WriteError(path, err.strerror, err.errno) from err
        raise naming(err, path) from err


LOG_FILE = "train_log.jsonl"
PREVIOUS_LOG_FILE = "train_log.previous.jsonl"

# What a model directory or training run holds at its top: a Transformer-XL's config,
# weights and checkpoints, and a run's exported model (a Transformer-XL's, the LSTM
# baseline's or a classifier's).
RUN_FILES = ("config.json", "weights.npz", "checkpoints", "export")


def run_files_in(folder):
    """The `RUN_FILES` that `folder` holds, in that order ([] where it does
    not exist): a job that writes its own run there would replace them."""
    return [name for name in RUN_FILES if os.path.lexists(os.path.join(folder, name))]


def set_aside_log(folder, replaces_a_model):
    """Makes way for a new run's `train_log.jsonl` in `folder` without losing
    the log of the model the run will replace: it is moved to
    `train_log.previous.jsonl`, which the run deletes when it saves its own
    model (`Staged.drop`), so a run that fails or is killed leaves the kept
    model with its own log under that name. One already there (a run failed
    or was killed before) is the kept model's log: kept, and the failed run's
    `train_log.jsonl` is deleted. Without a model to replace, a log there is
    deleted.

    Args:
        folder: the run's folder.
        replaces_a_model: whether `folder` holds a model the run replaces.

    Returns:
        The path of `train_log.previous.jsonl`, for the save to delete.
    """
    log, previous = os.path.join(folder, LOG_FILE), os.path.join(folder, PREVIOUS_LOG_FILE)
    try:
        if replaces_a_model and os.path.isfile(log) and not os.path.lexists(previous):
            os.replace(log, previous)
        elif os.path.lexists(log):
            os.remove(log)
    except OSError as err:
        raise naming(err, log) from err
    return previous


def save_vocab(tokenizer, directory):
    """Saves `tokenizer` into `directory` through a staging folder and a
    rename (replacing what was there), so a kill never leaves half of one;
    a save that fails (a full disk) deletes the staging folder and raises an
    `OSError` naming `directory`."""
    staging = directory + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tokenizer.save(staging)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        name = err.filename
        if isinstance(name, str) and (name == staging or name.startswith(staging + os.sep)):
            # a file it could not make (no inode left): named by its final path
            raise WriteError(directory + name[len(staging):], err.strerror or str(err),
                             err.errno) from err
        raise naming(err, directory) from err
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)


def trim_log(path, step):
    """Drops the lines of the JSON-lines log `path` whose `step` is past
    `step` (those of a run killed after its last checkpoint, which the resumed
    run logs again), and a last line cut short; returns how many."""
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if lines and not lines[-1].endswith("\n"):
        lines, cut = lines[:-1], 1
    else:
        cut = 0
    kept = [line for line in lines if _step(line) <= step]
    if cut or len(kept) < len(lines):
        write_atomically(path, "".join(kept))
    return cut + len(lines) - len(kept)


def log_record(path, record):
    """Appends `record` (a dict with a `step`) as a line of the JSON-lines log
    `path`, replacing the lines already there at its step (a finished job run
    again evaluates its last step again): one line per step."""
    step, line = int(record["step"]), json.dumps(record) + "\n"
    lines = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    kept = [old for old in lines if _step(old) != step]
    if len(kept) < len(lines):
        write_atomically(path, "".join(kept) + line)
    else:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
        except OSError as err:
            raise naming(err, path) from err


def _step(line):
    """A log line's step (-1 for a line that is not a record of one)."""
    try:
        return int(parse_json(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -1
