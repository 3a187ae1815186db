"""Benchmarks: one script per suite (a suite with several questions runs them
as parts, `--part=NAME`), each part printing a table and writing one JSON
result (README.md); what one-off investigations found is in NOTES.md."""
