"""Fitting and scoring a language model: the optimizer, the learning-rate
schedule, token-weighted metrics and corpus evaluation with carried memory."""
