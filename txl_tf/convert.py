"""`python -m txl_tf.convert`: published weights → a txl_tf model directory
(the command; see `txl_tf.weights.convert`)."""
from txl_tf.weights.convert import console

if __name__ == "__main__":
    console()
