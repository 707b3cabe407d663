"""Logprobs in OpenAI's shapes, from the engine's TokenLogprob list (speculative/logprobs.py:
token id, logprob, top (id, logprob) pairs) and the model's piece bytes of a token id.

Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.

    >>> from collections import namedtuple
    >>> T = namedtuple("T", "token logprob top")
    >>> pieces = {1: b"Hi", 2: b" there"}.__getitem__
    >>> chat_logprobs([T(1, -0.5, ((1, -0.5), (2, -1.5)))], pieces)["content"][0]["top_logprobs"][1]
    {'token': ' there', 'logprob': -1.5, 'bytes': [32, 116, 104, 101, 114, 101]}
    >>> completion_logprobs([T(1, -0.5, ()), T(2, -0.25, ())], pieces, offset=3)["text_offset"]
    [3, 5]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

Piece = Callable[[int], bytes]   # a token id's bytes (runtime.llama.Model.piece)


def _entry(tok: int, logprob: float, piece: Piece) -> dict:
    b = piece(tok)
    return {"token": b.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(b)}


def chat_logprobs(logprobs: Sequence[Any] | None, piece: Piece) -> dict | None:
    """choices[].logprobs of a chat completion (or chunk); None when none were asked for."""
    if logprobs is None:
        return None
    return {"content": [{**_entry(lp.token, lp.logprob, piece),
                         "top_logprobs": [_entry(t, v, piece) for t, v in lp.top]} for lp in logprobs],
            "refusal": None}


def completion_logprobs(logprobs: Sequence[Any] | None, piece: Piece, offset: int = 0) -> dict | None:
    """choices[].logprobs of a text completion (or chunk); text_offset counts characters from
    `offset` (where this chunk's text starts in the whole reply)."""
    if logprobs is None:
        return None
    tokens, offsets = [], []
    for lp in logprobs:
        text = piece(lp.token).decode("utf-8", "replace")
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{piece(t).decode("utf-8", "replace"): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets}
