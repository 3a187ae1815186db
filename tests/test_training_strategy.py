"""`--strategy=auto`: which strategy the job picks for the devices present
(injected device counts; no accelerator needed); mirrored strategies made one
after another in one process."""
import pytest
import tensorflow as tf

from training.strategy import choose_strategy, make_strategy, one_device


@pytest.mark.parametrize("tpu,workers,gpus,cpus,expected", [
    (None, 0, 1, 1, "one_device"),    # one GPU: one device, that GPU
    (None, 0, 1, 2, "one_device"),    # logical CPUs beside one GPU do not count
    (None, 0, 2, 1, "mirrored"),
    (None, 0, 8, 2, "mirrored"),
    (None, 0, 0, 1, "one_device"),
    (None, 0, 0, 2, "mirrored"),      # logical CPUs (--num_cpu_devices)
    (None, 2, 1, 1, "multi_worker"),
    (None, 1, 2, 1, "mirrored"),      # a cluster of one worker is this machine
    ("grpc://10.0.0.2:8470", 0, 1, 1, "tpu"),
])
def test_auto_picks(tpu, workers, gpus, cpus, expected):
    assert choose_strategy(tpu, workers, gpus, cpus) == expected


def test_one_device_is_the_first_gpu():
    assert one_device(["/device:GPU:0", "/device:GPU:1"]) == "/device:GPU:0"
    assert one_device([]) == "/cpu:0"


def test_mirrored_strategies_made_one_after_another_each_reduce_their_own_shapes():
    # Each MirroredStrategy used to number its all-reduces from the same keys,
    # and the runtime remembers an instance's shape for the process: the
    # second strategy's first all-reduce of another shape failed ("Shape
    # mismatch in the collective instance"), as a second training run in one
    # process did.
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "tests/conftest.py splits the CPU"
    for size in (3, 5, 3):
        strategy = make_strategy("mirrored")

        @tf.function
        def summed():
            return strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.ones([size])))

        assert [r.numpy().tolist() for r in strategy.experimental_local_results(summed())] \
            == [[2.0] * size] * 2


def test_bad_tf_config_and_strategy_names_are_one_clear_error(monkeypatch):
    from txl_tf.errors import TxlError
    with pytest.raises(TxlError, match=r"unknown strategy 'mirror'; choose one of"):
        make_strategy("mirror")
    monkeypatch.setenv("TF_CONFIG", "{'cluster': ")
    with pytest.raises(TxlError, match="TF_CONFIG is not valid JSON"):
        make_strategy("auto")
    monkeypatch.setenv("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}')
    with pytest.raises(TxlError, match="--strategy=multi_worker needs TF_CONFIG with a cluster"):
        make_strategy("multi_worker")


def test_a_gpu_driver_without_a_gpu_in_tensorflow_is_one_warning():
    """On a machine with NVIDIA's driver, a TensorFlow that lists no GPU
    (no CUDA libraries: `pip install tensorflow` on a GPU machine) trained
    on the CPU without a word; the job now says so, and what to install."""
    from training.strategy import unused_gpu_warning
    driver = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07"
    warning = unused_gpu_warning(driver, [], built_with_cuda=True)
    assert driver in warning and "lists no GPU" in warning and "[gpu]" in warning
    assert "lines above say why" in warning
    assert "built without CUDA" in unused_gpu_warning(driver, [], built_with_cuda=False)
    assert unused_gpu_warning(None, [], built_with_cuda=True) is None  # no GPU here: nothing
    assert unused_gpu_warning(driver, ["/physical_device:GPU:0"], built_with_cuda=True) is None


def test_the_warning_reads_this_machines_driver_and_tensorflows_gpus(tmp_path, monkeypatch):
    from txl_tf.app import nvidia_driver
    from training.strategy import gpu_setup_warning
    monkeypatch.setattr(nvidia_driver, "DRIVER_FILE", str(tmp_path / "absent"))
    assert gpu_setup_warning() is None
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX Kernel Module  580.82.07\n"
                                      "GCC version: gcc 12\n")
    monkeypatch.setattr(nvidia_driver, "DRIVER_FILE", str(tmp_path / "version"))
    if tf.config.list_physical_devices("GPU"):
        assert gpu_setup_warning() is None
    else:
        assert "(NVRM version: NVIDIA UNIX Kernel Module  580.82.07)" in gpu_setup_warning()
