"""Vocabulary signatures: whether two model files tokenize alike, so one can draft for the other.

Read from the vocabulary alone (no weights), so a configuration naming a mismatched draft model is
refused at startup with both names and the difference, not at the first drafted token.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from router.backends.llama.native import route_native_logs
from router.errors import ModelError

# Token ids read (as text, specials included) to tell two vocabularies apart, beyond their sizes.
VOCAB_SAMPLE = 512


def vocab_signature(vocab: Any) -> tuple[Any, ...]:
    """What tells two vocabularies apart: their size, special ids, and the text of a spread of
    tokens. Two models agreeing here tokenize alike, so one's tokens can be the other's draft."""
    import llama_cpp as lc

    n = lc.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    pieces = []
    for t in sorted({*range(0, n, max(1, n // VOCAB_SAMPLE)), n - 1}):
        k = lc.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        pieces.append(bytes(buf.raw[: max(k, 0)]))
    specials = tuple(
        int(f(vocab)) for f in (lc.llama_vocab_bos, lc.llama_vocab_eos, lc.llama_vocab_eot, lc.llama_vocab_pad)
    )
    return (n, specials, tuple(pieces))


def read_vocab_signature(path: Path) -> tuple[Any, ...]:
    """A model file's vocabulary signature, reading the vocabulary only (no weights)."""
    import llama_cpp as lc

    route_native_logs()
    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        return vocab_signature(lc.llama_model_get_vocab(model))
    finally:
        lc.llama_model_free(model)


def vocab_mismatch(target: Path, draft: Path) -> str | None:
    """Why `draft` cannot draft for `target` (their vocabularies differ), naming both; None if it can."""
    a, b = read_vocab_signature(target), read_vocab_signature(draft)
    if a == b:
        return None
    if a[0] != b[0]:
        why = f"{a[0]} tokens against {b[0]}"
    elif a[1] != b[1]:
        why = f"special token ids (bos, eos, eot, pad) {a[1]} against {b[1]}"
    else:
        why = "the same size but different token texts"
    return f"draft model {draft.name} has another vocabulary than {target.name}: {why}"
