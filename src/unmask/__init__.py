"""unmask: pretrain, fine-tune and serve BERT-style encoders."""

__version__ = "0.1.0"

from unmask.data.collate import MLMCollator
from unmask.data.masking import mlm_mask, whole_word_mask, whole_word_spans
from unmask.tokenizer import Tokenizer, train_tokenizer

__all__ = ["MLMCollator", "Tokenizer", "mlm_mask", "train_tokenizer", "whole_word_mask", "whole_word_spans"]
