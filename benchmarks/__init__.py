"""Benchmarks: one script per suite, each printing a table and writing one
JSON result (README.md); what one-off investigations found is in NOTES.md."""
