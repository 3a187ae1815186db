"""What the commands print of TensorFlow's Python log records: each once."""
import subprocess
import sys
import textwrap

from job_helpers import job_env


def test_a_tensorflow_warning_in_a_job_is_one_line():
    """TensorFlow's logger has a stderr handler of its own (it is imported
    before absl's app puts one on the root logger), so each of its records
    in a job came out twice: `WARNING:tensorflow:...` and absl's `W1130 ...`
    (the demo's tf.function retracing warnings)."""
    code = textwrap.dedent("""
        from txl_tf.app import cli
        def main(argv):
            import tensorflow as tf
            tf.get_logger().warning("a warning of TensorFlow's")
        cli.run(main)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=job_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("a warning of TensorFlow's") == 1, done.stderr
