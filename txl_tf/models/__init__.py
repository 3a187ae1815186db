"""Model families shaped as keras-hub lays them out (backbone, task,
preprocessor, tokenizer, presets), each a thin shell over the pure core."""
