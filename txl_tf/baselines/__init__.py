"""Baselines of the paper's comparisons, with the core's contract."""
from txl_tf.baselines.lstm import (LSTMConfig, LSTMLanguageModel, load_lstm, lstm_folder,
                                   lstm_scorer, save_lstm)

__all__ = ["LSTMConfig", "LSTMLanguageModel", "load_lstm", "lstm_folder", "lstm_scorer",
           "save_lstm"]
