"""unmask: pretrain, fine-tune and serve BERT-style encoders."""

import importlib

__version__ = "0.1.0"

# imported on first use (PEP 562), so that `import unmask` and `unmask --help` do not wait for torch
_EXPORTS = {"MLMCollator": "unmask.data.collate", "mlm_mask": "unmask.data.masking",
            "whole_word_mask": "unmask.data.masking", "whole_word_spans": "unmask.data.masking",
            "Tokenizer": "unmask.tokenizer", "train_tokenizer": "unmask.tokenizer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'unmask' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
