"""Choosing a `tf.distribute` strategy from flags, and facts about the replicas."""
import json
import os

import tensorflow as tf

from txl_tf.errors import TxlError

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")


def split_cpu(num_devices):
    """Splits the host CPU into `num_devices` logical devices (for trying
    `mirrored` without accelerators). Must run before TensorFlow initialises."""
    if num_devices and num_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def _tf_config():
    try:
        return json.loads(os.environ.get("TF_CONFIG", "") or "{}")
    except json.JSONDecodeError as err:
        raise TxlError(f"TF_CONFIG is not valid JSON: {err}") from None


def _num_workers(tf_config):
    cluster = tf_config.get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def choose_strategy(tpu, workers, gpus, cpus):
    """The strategy `auto` means (a name of `STRATEGIES`): `tpu` if a TPU is
    named, `multi_worker` for several workers, `mirrored` over several GPUs
    (or, without a GPU, over several logical CPUs), else `one_device`, on
    the GPU where there is one (logical CPUs beside it do not count).

    Args:
        tpu: the `--tpu` name or address (None or "": none).
        workers: workers of the cluster in TF_CONFIG.
        gpus: GPUs visible.
        cpus: logical CPU devices.
    """
    if tpu:
        return "tpu"
    if workers > 1:
        return "multi_worker"
    if gpus > 1 or (gpus == 0 and cpus > 1):
        return "mirrored"
    return "one_device"


def unused_gpu_warning(driver, gpus, built_with_cuda):
    """What to tell a user whose machine has NVIDIA's GPU driver when
    TensorFlow lists no GPU (the job would train on the CPU without a word).

    Args:
        driver: the driver's version line (`nvidia_driver`), None if none.
        gpus: the GPUs TensorFlow lists.
        built_with_cuda: whether this TensorFlow is built with CUDA.

    Returns:
        The warning (str), or None where there is nothing to say.
    """
    if driver is None or gpus:
        return None
    why = ("TensorFlow's lines above say why" if built_with_cuda
           else "this TensorFlow is built without CUDA")
    return (f"this machine has NVIDIA's GPU driver ({driver}) but TensorFlow lists no GPU, so "
            f"the job runs on the CPU: {why}; the gpu extra (pip install '.[gpu]' in the "
            "repository) installs TensorFlow with the CUDA libraries it needs")


def gpu_setup_warning():
    """`unused_gpu_warning` of this machine and this TensorFlow."""
    from txl_tf.app.nvidia_driver import nvidia_driver
    return unused_gpu_warning(nvidia_driver(), tf.config.list_physical_devices("GPU"),
                              tf.test.is_built_with_cuda())


def one_device(gpus):
    """The device of `one_device`: the first of `gpus` (logical GPU names),
    else the CPU."""
    return gpus[0] if gpus else "/cpu:0"


# Every MirroredStrategy numbers its collective ops from the same group and
# instance keys, and TensorFlow's runtime keeps each instance's shapes for the
# life of the process: a second strategy in one process (a second training
# run, a notebook, a test session) fails its first all-reduce of another shape
# with "Shape mismatch in the collective instance". TensorFlow's own tests
# move the class's key base before each strategy
# (tensorflow/python/distribute/strategy_combinations.py); so does this.
_KEY_BASE_STRIDE = 100_000
if not hasattr(tf.distribute.MirroredStrategy, "_collective_key_base"):
    raise ImportError(f"TensorFlow {tf.__version__} has no MirroredStrategy._collective_key_base; "
                      "training.strategy.mirrored_strategy must be updated for this version")


def mirrored_strategy(devices):
    """A `tf.distribute.MirroredStrategy` over `devices` whose collective keys
    no other strategy of this process uses (see above).

    Args:
        devices: device names, e.g. `["/gpu:0", "/gpu:1"]`.

    Returns:
        The strategy.
    """
    tf.distribute.MirroredStrategy._collective_key_base += _KEY_BASE_STRIDE
    strategy = tf.distribute.MirroredStrategy(devices)
    # A later MirroredStrategy made directly starts past this one's keys too.
    tf.distribute.MirroredStrategy._collective_key_base += _KEY_BASE_STRIDE
    return strategy


def make_strategy(name="auto", tpu=None):
    """A strategy by name.

    `auto`: `choose_strategy` of the devices TensorFlow sees (one GPU: that
    GPU). `multi_worker` reads the cluster from TF_CONFIG.
    """
    if name not in STRATEGIES:
        raise TxlError(f"unknown strategy {name!r}; choose one of {list(STRATEGIES)}")
    if name == "auto":
        name = choose_strategy(tpu, _num_workers(_tf_config()),
                               len(tf.config.list_physical_devices("GPU")),
                               len(tf.config.list_logical_devices("CPU")))
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if name == "multi_worker":
        if _num_workers(_tf_config()) < 1:
            raise TxlError("--strategy=multi_worker needs TF_CONFIG with a cluster "
                           "(e.g. {'cluster': {'worker': [...]}, 'task': {...}})")
        # Must come before anything initialises the TF runtime: physical
        # devices only (listing logical devices would start it).
        gpus = tf.config.list_physical_devices("GPU")
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                          if gpus else tf.distribute.experimental.CommunicationImplementation.RING)
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return mirrored_strategy(devices)
    return tf.distribute.OneDeviceStrategy(
        one_device([d.name for d in tf.config.list_logical_devices("GPU")]))


def worker_info(strategy):
    """`(task_id, is_chief, num_workers)` of this process."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None:
        task_type, task_id = resolver.task_type, resolver.task_id or 0
        workers = max(_num_workers(_tf_config()), 1)
        is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and
                                            "chief" not in resolver.cluster_spec().as_dict())
        if task_type == "worker" and "chief" in resolver.cluster_spec().as_dict():
            task_id += 1
        return task_id, is_chief, workers
    return 0, True, 1


def local_replicas(strategy):
    """Number of replicas driven by this process."""
    return len(strategy.extended.worker_devices)
