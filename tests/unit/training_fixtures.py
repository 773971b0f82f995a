"""A small tokenizer trained by training/bpe.py, shared by the training unit tests."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from training.bpe import save_tokenizer, train_tokenizer

CODE = [
    "import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n        yield name\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'print("héllo wörld €", 3.14, [1, 2, 3], {"a": 1})\n',
] * 30


def small_tokenizer(out_dir: Path | None = None) -> Tokenizer:
    tok = train_tokenizer(CODE, 384)
    if out_dir is not None:
        save_tokenizer(tok, out_dir, model_max_length=256)
    return tok
