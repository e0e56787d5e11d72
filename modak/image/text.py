"""Text in, token ids out: the job's Hugging Face tokenizer (``model.tokenizer``) as the image runs it.

The folder is what ``save_pretrained`` writes; only its ``tokenizer.json`` (the fast tokenizer: normalizer,
pre-tokenizer, model, post-processor) and the pad token of ``tokenizer_config.json`` or
``special_tokens_map.json`` are read, by the ``tokenizers`` package (no ``transformers`` in the image). Every text
is padded or truncated to ``max_length``, the length the plan predicted at, as
``tokenizer(texts, padding="max_length", truncation=True, max_length=...)`` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"
# The model's token inputs (model.input_shape's names, as Hugging Face names them) -> the Encoding's field
TOKEN_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
TEXT_INPUT = "text"  # the served BYTES input that the tokenizer turns into the model's token inputs
_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")  # where the pad token is named, in that order


@dataclass(frozen=True)
class TextInput:
    """A loaded tokenizer that fills the model's token inputs (``names``) at ``max_length``."""

    tokenizer: Any  # tokenizers.Tokenizer, padding and truncation set
    max_length: int
    names: tuple[str, ...]  # the model's inputs it fills: input_ids, attention_mask, token_type_ids
    input_name: str = TEXT_INPUT

    def encode(self, texts: Sequence[str | bytes], dtypes: Mapping[str, Any]) -> dict[str, Any]:
        """The model's token inputs for ``texts`` (strings, or their UTF-8 bytes), as arrays of ``dtypes`` (input
        name -> NumPy dtype); ValueError names an item that is not UTF-8."""
        import numpy as np

        decoded = []
        for index, text in enumerate(texts):
            try:
                decoded.append(text.decode() if isinstance(text, bytes) else text)
            except UnicodeDecodeError:
                raise ValueError(f"item {index} is not UTF-8 text") from None
        encodings = self.tokenizer.encode_batch(decoded)
        return {name: np.array([getattr(e, TOKEN_FIELDS[name]) for e in encodings], dtype=dtypes[name])
                .reshape(len(texts), self.max_length) for name in self.names}


def load_text_input(folder: Path, max_length: int, names: Sequence[str]) -> TextInput:
    """The tokenizer in ``folder`` padding and truncating to ``max_length``; ValueError if it names no pad
    token."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    pad = _pad_token(folder)
    pad_id = tokenizer.token_to_id(pad) if pad is not None else None
    if pad_id is None:
        raise ValueError(f"the tokenizer in {folder} names no pad token in its vocabulary "
                         f"(pad_token in {' or '.join(_CONFIGS)})")
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(length=max_length, pad_id=pad_id, pad_token=pad)
    return TextInput(tokenizer, max_length, tuple(names))


def _pad_token(folder: Path) -> str | None:
    for name in _CONFIGS:
        path = folder / name
        if path.is_file():
            token = json.loads(path.read_text()).get("pad_token")
            if isinstance(token, dict):
                token = token.get("content")
            if isinstance(token, str):
                return token
    return None
