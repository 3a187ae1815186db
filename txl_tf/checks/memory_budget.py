"""Sizes that cannot fit in this machine's memory, refused before anything is allocated.

`check_fits(config, batch_size, seq_len, mem_len, training=...)` estimates a
lower bound of the bytes a step needs (float32 weights, the recurrence
memory, one layer's attention scores, the output log-probs; in training also
gradients, Adam's slots and every layer's activations) and raises
`MemoryBudgetError` when it exceeds the memory available (`available_bytes`:
the OS's, a container's limit, the process's `RLIMIT_AS`). The bound is
deliberately low: a refusal means the job would certainly fail (or swap, or
be killed by the kernel), never that it might be tight. The other checks
(`check_weights`, `check_memory_state`, `check_new_ids`, `check_bytes`) refuse
the weights, stream memories, generation outputs and dataset arrays alike,
all through `check_total`.
"""
import os

from txl_tf.checks.numpy_checks import InputError

FLOAT = 4  # bytes; float32 (mixed precision keeps float32 weights and memory too)
GIB = 2 ** 30
MIB = 2 ** 20


def size_words(size):
    """`size` bytes as a refusal says them: in GiB from 1 GiB, else in MiB
    from 1 MiB, else in bytes (a small need said "0.0 GiB").

    Args:
        size: bytes.

    Returns:
        The words, e.g. "1.5 GiB", "12.0 MiB", "4,096 bytes".
    """
    if size >= GIB:
        return f"{size / GIB:,.1f} GiB"
    if size >= MIB:
        return f"{size / MIB:,.1f} MiB"
    return f"{int(size):,} bytes"


class MemoryBudgetError(InputError):
    """A batch, segment or memory length this machine's memory cannot hold."""


def available_bytes():
    """What can be allocated without swapping: `MemAvailable` of /proc/meminfo
    (else the physical memory), or less where a cgroup (a container's memory
    limit, v2 or v1) or the process's address-space limit (`ulimit -v`,
    `RLIMIT_AS`, as batch schedulers set) leaves less; None where nothing can
    be read."""
    found = [_cgroup_room(), _address_space_room()]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    if found == [None, None]:
        try:
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    found = [n for n in found if n is not None]
    return min(found) if found else None


def _address_space_room():
    """`RLIMIT_AS` less the process's address space (`VmSize`); None without a
    limit (or where it cannot be read)."""
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError):
        return None
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, ValueError, StopIteration):
        return None
    return max(limit - size, 0)


def room_words(available):
    """How a refusal names `available` bytes: "this process can allocate X
    GiB" where the process's address-space limit (`_address_space_room`)
    leaves no more, else "this machine has X GiB available".

    Args:
        available: bytes.

    Returns:
        The words.
    """
    room = _address_space_room()
    if room is not None and room <= available:
        return f"this process can allocate {size_words(available)}"
    return f"this machine has {size_words(available)} available"


def _cgroup_room():
    """The cgroup's memory limit less its usage; None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2 ** 60:  # "max" or a huge number: no limit
            return max(int(limit) - usage, 0)
    return None


def parameter_count(config):
    """The model's matrices (biases and LayerNorms left out: a lower bound
    within a few percent), from its config, adaptive bins included."""
    d, heads = config.d_model, config.n_head * config.d_head
    layer = 5 * d * heads + 2 * d * config.d_inner  # q, k, v, r, o; the feed-forward
    bounds = [0, *config.cutoffs, config.n_token]
    embed = 0
    for i in range(len(bounds) - 1):
        width = config.d_embed // config.div_val ** i
        embed += (bounds[i + 1] - bounds[i]) * width + (width * d if width != d else 0)
    return config.n_layer * layer + embed


def estimate_bytes(config, batch_size, seq_len, mem_len, training=False, host_only=False,
                   grad_segments=1):
    """`{part: bytes}`: a lower bound of what one step needs (see module doc);
    `host_only`: only what stays in host memory when an accelerator computes
    (a copy of the weights and of the memory, as checkpoints and runtimes keep);
    `grad_segments`: in training, segments of `seq_len` whose activations are
    kept for the backward pass (the classifier's)."""
    b, t, m, layers = int(batch_size), int(seq_len), int(mem_len), config.n_layer
    scores = b * config.n_head * t * (t + m) * FLOAT * 3  # content, position, probabilities
    hidden = b * t * (6 * config.d_model + config.d_inner) * FLOAT
    weights = parameter_count(config) * FLOAT
    memory = memory_bytes(config, b, m)
    if host_only:
        return {"weights": weights, "memory": memory}
    parts = {"weights": weights * (4 if training else 1),  # + gradients and Adam's 2 slots
             "memory": 2 * memory}  # in and out
    if training:
        parts["activations"] = int(grad_segments) * layers * (scores + hidden)
    else:
        parts["activations"] = scores + hidden
        parts["log-probs"] = b * t * config.n_token * FLOAT
    return parts


def check_memory_state(n_layer, d_model, batch_size, mem_len, what="the memory",
                       available=None):
    """Raises `MemoryBudgetError` unless a memory of `batch_size` streams and
    `mem_len` slots, in and out of a step, fits in what is available (for a
    model whose weights are already loaded)."""
    return _check({"memory": 2 * n_layer * int(batch_size) * int(mem_len) * d_model * FLOAT},
                  f"{what} (batch {batch_size}, memory {mem_len})", available)


ADVICE = "lower the memory length, the batch size or the segment length"


def check_weights(config, what="the model's weights", available=None, itemsize=FLOAT):
    """Raises `MemoryBudgetError` unless the weights of `config` (the
    matrices `parameter_count` counts) fit in what is available; returns
    their bytes.

    Args:
        config: a `TransformerXLConfig`.
        what: what the refusal names.
        available: bytes (None: `available_bytes()`).
        itemsize: bytes of a weight (the variables' dtype: 2 for bfloat16).

    Returns:
        The bytes of the weights.
    """
    count = parameter_count(config)
    return _check({"weights": count * int(itemsize)}, f"{what} ({count:,} parameters)", available,
                  advice="lower n_token (or use adaptive cutoffs with div_val > 1), d_model, "
                         "d_inner or n_layer")


def check_bytes(parts, what, advice, available=None):
    """Raises `MemoryBudgetError` unless `parts` fit in what is available.

    Args:
        parts: `{part: bytes}`.
        what: what the refusal names.
        advice: what the refusal suggests.
        available: bytes (None: `available_bytes()`).

    Returns:
        The bytes in all.
    """
    return _check(parts, what, available, advice)


def check_total(total, need, advice, available=None):
    """Raises `MemoryBudgetError` "`need(total)` and <what is available>;
    `advice`" unless `total` bytes fit in what is available: the one refusal
    the checks of this module (and `SessionTable`'s) share.

    Args:
        total: bytes.
        need: `need(words)`: what needs `words` (`size_words(total)`).
        advice: what the refusal suggests.
        available: bytes (None: `available_bytes()`).

    Returns:
        `total`.
    """
    available = available_bytes() if available is None else available
    if available is not None and total > available:
        raise MemoryBudgetError(f"{need(size_words(total))} and {room_words(available)}; "
                                f"{advice}")
    return total


def _check(parts, what, available, advice=ADVICE):
    biggest = max(parts, key=parts.get)
    return check_total(sum(parts.values()), lambda words: (
        f"{what} needs at least {words} ({biggest} {size_words(parts[biggest])})"),
        advice, available)


# A new id's int32 and its float32 log-prob, in a generation's outputs.
NEW_ID_BYTES = 8


def check_new_ids(batch_size, num_tokens, what="max_new_tokens", available=None,
                  advice="ask for fewer new ids (a decode resumed from its state goes on "
                         "exactly) or fewer rows", holds="the new ids and their log-probs",
                  buffer=0):
    """Raises `MemoryBudgetError` unless a generation's outputs (`[B, n]`
    int32 ids and float32 log-probs, allocated whole even when a stop id
    ends every row early), and the buffer of as many positions a compiled
    decode loop fills before them, fit in what is available; returns their
    bytes.

    Args:
        batch_size: rows.
        num_tokens: new ids per row.
        what: the argument or flag that asked for `num_tokens`.
        available: bytes (None: `available_bytes()`).
        advice: what the refusal suggests.
        holds: what the `NEW_ID_BYTES` of a position are, in the refusal.
        buffer: positions per row of the compiled loop's buffer (the
            `Decoder`'s: a power of two >= `num_tokens`; 0 for none).

    Returns:
        The bytes of the outputs and the buffer.
    """
    rows = f"{int(batch_size):,} row" + ("s" if int(batch_size) != 1 else "")
    held = f", and the decode loop's buffer of {int(buffer):,}" if buffer else ""
    return check_total(
        int(batch_size) * (int(num_tokens) + int(buffer)) * NEW_ID_BYTES,
        lambda words: (f"{what} {int(num_tokens):,} for {rows} needs at least {words} "
                       f"({holds}{held}, {NEW_ID_BYTES} bytes each)"), advice, available)


def memory_bytes(config, batch_size, mem_len):
    """The bytes of one recurrence memory (float32 `[n_layer, B, M, d_model]`)."""
    return config.n_layer * int(batch_size) * int(mem_len) * config.d_model * FLOAT


def check_fits(config, batch_size, seq_len, mem_len, training=False, what="this job",
               host_only=None, available=None, extra=None, grad_segments=1):
    """Raises `MemoryBudgetError` (naming the estimate, its biggest part and
    the memory available) when one step cannot fit; returns the estimate.
    `host_only` (default: whether TensorFlow sees a GPU): see `estimate_bytes`;
    `extra`: `{part: bytes}` the job holds besides the step; `grad_segments`:
    see `estimate_bytes`."""
    if host_only is None:
        import tensorflow as tf
        host_only = bool(tf.config.list_physical_devices("GPU"))
    parts = {**estimate_bytes(config, batch_size, seq_len, mem_len, training, host_only,
                              grad_segments),
             **(extra or {})}
    kept = f", {grad_segments} segments kept for the backward pass" if grad_segments > 1 else ""
    return _check(parts, f"{what} (batch {batch_size}, segment {seq_len}, memory {mem_len}{kept})",
                  available)
