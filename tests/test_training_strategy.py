"""`--strategy=auto`: which strategy the job picks for the devices present
(injected device counts; no accelerator needed)."""
import pytest

from training.strategy import choose_strategy, one_device


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
