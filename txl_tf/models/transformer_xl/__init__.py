"""Transformer-XL as a keras-hub model family: `TransformerXLBackbone`,
`TransformerXLCausalLM`, `TransformerXLCausalLMPreprocessor`,
`TransformerXLTokenizer`; `presets` says where `from_preset` looks."""
from txl_tf.models.transformer_xl.transformer_xl_backbone import TransformerXLBackbone
from txl_tf.models.transformer_xl.transformer_xl_causal_lm import TransformerXLCausalLM
from txl_tf.models.transformer_xl.transformer_xl_causal_lm_preprocessor import (
    TransformerXLCausalLMPreprocessor)
from txl_tf.models.transformer_xl.transformer_xl_tokenizer import TransformerXLTokenizer

__all__ = ["TransformerXLBackbone", "TransformerXLCausalLM", "TransformerXLCausalLMPreprocessor",
           "TransformerXLTokenizer"]
