"""The openai SDK's own structured-output helpers against `llamaspec serve` (issue 26): the real server
in a subprocess on SmolLM2 F16 with its default speculation, driven by `client.chat.completions.parse`
and `.stream` with pydantic models as response_format (the SDK sends a strict json_schema built from
the model, with $defs/$ref for nested models, and parses the reply back into the model)."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel

from test_serve import Server

pytestmark = [pytest.mark.real, pytest.mark.slow]


class Contact(BaseModel):
    name: str
    email: str
    company: str


class Reporter(BaseModel):
    name: str
    email: str


class Bug(BaseModel):
    title: str
    severity: Literal["low", "medium", "high", "critical"]
    reporter: Reporter
    labels: list[str]


CONTACT_ASK = [{"role": "system", "content": "Extract the contact details as JSON."},
               {"role": "user", "content": "Best regards,\nMaria Lopez\nBrightwater Logistics\nmaria.lopez@brightwater.com"}]
_EXAMPLE = Bug(title="Page freezes on scroll", severity="medium",
               reporter=Reporter(name="Ben Clark", email="ben.clark@example.com"), labels=["viewer", "scroll"])
# one worked example turn: what extraction scripts send a small model so it copies instead of looping
BUG_ASK = [{"role": "user", "content": "Extract the bug report as JSON: Title: Page freezes on scroll. Severity: medium. "
                                       "Labels: viewer, scroll. Reported by Ben Clark (ben.clark@example.com)."},
           {"role": "assistant", "content": _EXAMPLE.model_dump_json()},
           {"role": "user", "content": "Extract the bug report as JSON: Title: Login button does nothing on Safari. "
                                       "Severity: high. Labels: ui, safari. Reported by Nina Patel (nina.patel@example.com)."}]


@pytest.fixture(scope="module")
def server(smollm2_f16, tmp_path_factory):
    s = Server(smollm2_f16, tmp=tmp_path_factory.mktemp("serve-sdk"))   # default speculation, as users get it
    yield s
    assert s.stop() == 0, s.log.read_text()


def test_parse_returns_an_instance_of_the_pydantic_model(server):
    r = server.client().chat.completions.parse(model="m", messages=CONTACT_ASK, response_format=Contact,
                                               temperature=0, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    parsed = choice.message.parsed
    assert isinstance(parsed, Contact), parsed
    assert parsed == Contact.model_validate(json.loads(choice.message.content))
    assert parsed.name == "Maria Lopez" and parsed.company == "Brightwater Logistics", parsed   # copied from the text


def test_parse_with_a_nested_model_an_enum_and_a_list(server):
    r = server.client().chat.completions.parse(model="m", messages=BUG_ASK, response_format=Bug,
                                               temperature=0, max_tokens=150)
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    bug = r.choices[0].message.parsed
    assert isinstance(bug, Bug) and isinstance(bug.reporter, Reporter), bug
    assert bug.severity == "high" and bug.reporter.email == "nina.patel@example.com", bug
    assert all(isinstance(x, str) for x in bug.labels)


def test_the_stream_helper_gives_the_parsed_object_of_the_whole_reply(server):
    client = server.client()
    whole = client.chat.completions.parse(model="m", messages=CONTACT_ASK, response_format=Contact,
                                          temperature=0, max_tokens=100)
    with client.chat.completions.stream(model="m", messages=CONTACT_ASK, response_format=Contact,
                                        temperature=0, max_tokens=100) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 1 and "".join(deltas) == whole.choices[0].message.content   # streamed in pieces
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.parsed == whole.choices[0].message.parsed
