"""What every command-line job shares (training, export, the converter):
flag specs, the one-line exit on bad input, a quiet TensorFlow start-up
(`tf_startup`, on `first_imports`' watch of TensorFlow's and Keras's first
import; TensorFlow's absl logging kept from configuring the process:
`tf_logs`), and progress for terminals and logs; and what the library says about its
own names: where a module went (`moved_modules`) and when a deprecated name
goes (`deprecation`). Standard library and absl only."""

# Bound here, so that it is an attribute of txl_tf.app even when `import
# export` read it first, from its file (export/__init__.py says why).
from txl_tf.app import moved_modules  # noqa: E402,F401
