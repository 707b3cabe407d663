"""Streamed logprobs go with the text they belong to: each chunk carries the logprobs of exactly
the tokens whose text ends in that chunk, and the chunks' logprobs, joined, are the whole reply's.

A grammar (json_schema) makes the grammar drafter verify several tokens in one step, so one step
gives several text pieces: the case where logprobs read from a list that grows after the text
callback land on the wrong chunk. Checked through the Python API's chunks and through `serve`'s
SSE (the engine thread hands the text to the event loop), on the real SmolLM2 Q4_1, greedy."""

from __future__ import annotations

import json

import pytest

from llamaspec.api.generator import Generator

pytestmark = pytest.mark.real

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
ASK = [{"role": "user", "content": "Describe a person as JSON with a name, an age and a city."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}


def _check(chunks: list[dict], whole: dict) -> int:
    """Every chunk's logprob tokens spell its content; joined, they are the whole reply's (tokens
    and values). Returns how many chunks carried text."""
    with_text = 0
    for c in chunks:
        if not c["choices"]:
            continue
        choice = c["choices"][0]
        content = choice["delta"].get("content") or ""
        tokens = [t["token"] for t in (choice["logprobs"] or {}).get("content", ())]
        assert "".join(tokens) == content, (content, tokens)
        with_text += bool(content)
    streamed = [t for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for t in c["choices"][0]["logprobs"]["content"]]
    expected = whole["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in streamed] == [t["token"] for t in expected]
    assert [t["logprob"] for t in streamed] == pytest.approx([t["logprob"] for t in expected], abs=0.2)
    return with_text


def test_python_api_chunks_carry_their_own_tokens_logprobs(smollm2_q4):
    kw = dict(max_tokens=60, logprobs=True, top_logprobs=1, response_format=FORMAT)
    with Generator(smollm2_q4, temperature=0, threads=1) as g:
        whole = g.create_chat_completion(ASK, **kw)
        chunks = list(g.create_chat_completion(ASK, **kw, stream=True))
    text = whole["choices"][0]["message"]["content"]
    json.loads(text)
    assert _check(chunks, whole) > 3, text
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text


@pytest.mark.slow
def test_served_chunks_carry_their_own_tokens_logprobs(smollm2_q4, tmp_path):
    from test_serve import Server, http

    server = Server(smollm2_q4, tmp=tmp_path)
    try:
        body = {"messages": ASK, "max_tokens": 60, "logprobs": True, "top_logprobs": 1, "response_format": FORMAT}
        whole = http("POST", server.url + "/v1/chat/completions", json_body=body, timeout=120).json()
        raw = http("POST", server.url + "/v1/chat/completions", json_body={**body, "stream": True}, timeout=120)
        events = [line[len("data: "):] for line in raw.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", raw.text
        chunks = [json.loads(e) for e in events[:-1]]
    finally:
        assert server.stop() == 0, server.log.read_text()
    assert _check(chunks, whole) > 3


def test_a_piece_carries_the_tokens_whose_text_ends_in_it(smollm2_q4):
    """Multi-byte characters split over tokens and a stop string's hold: after each piece, the
    tokens handed over spell a prefix of the text sent, and one more token would spell past it;
    the stop string's tokens are handed over with no piece (the last chunk sends them)."""
    grammar = 'root ::= "Sure: \U0001F389 caf\u00e9, \u65e5\u672c. The END is near"'
    with Generator(smollm2_q4, temperature=0, threads=1) as g:
        stream = g.generate("Say something.", grammar=grammar, stop=[" END"], logprobs=0, stream=True)
        pairs = list(stream.with_logprobs())
        piece = g.pipeline.target.piece
    tokens = stream.result.tokens

    def spelled(toks) -> str:
        return b"".join(piece(t) for t in toks).decode("utf-8", "replace")

    sent, covered = "", []
    for text, lps in pairs:
        sent += text
        covered += [lp.token for lp in lps]
        assert covered == tokens[:len(covered)]
        assert sent.startswith(spelled(covered)) and spelled(tokens[:len(covered) + 1]).startswith(sent), (sent, covered)
    assert sent == "Sure: \U0001F389 caf\u00e9, \u65e5\u672c. The" == stream.result.text
    assert spelled(covered) == sent and len(covered) < len(tokens)   # (" END": its tokens, no text)
