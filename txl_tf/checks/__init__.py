"""Checks that turn bad input into one clear error: argument checks of the
core and runtimes, and sizes that cannot fit in this machine's memory."""
