"""Benchmarks: one script per question, each printing a table and writing JSON."""
