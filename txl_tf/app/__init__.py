"""What every command-line job shares (training, export, the converter):
flag specs, the one-line exit on bad input, a quiet TensorFlow start-up,
and progress for terminals and logs. Standard library and absl only."""
