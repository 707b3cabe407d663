"""The grammar error (a grammar or JSON schema that cannot be used, naming where it came from)
and how llama.cpp's grammar parser says why it refused one."""

from __future__ import annotations

from llamaspec.errors import UsageError


class GrammarError(UsageError):
    """A grammar or JSON schema that cannot be compiled; `field` names where it came from."""

    def __init__(self, message: str, field: str, hint: str | None = None):
        super().__init__(message, hint, field)


def parse_error(stderr_text: str, log_lines: list[str]) -> str:
    r"""Why llama.cpp refused a grammar: its parser's "parse: error parsing grammar: <why>" (written
    to stderr), else the last specific line of its log (not the generic "failed to parse grammar").

        >>> parse_error("parse: error parsing grammar: Undefined rule identifier 'foo'\n\nroot ::= foo\n", [])
        "Undefined rule identifier 'foo'"
        >>> parse_error("", ["grammar does not contain a 'root' symbol\n"])
        "grammar does not contain a 'root' symbol"
    """
    for line in stderr_text.splitlines():
        if "error parsing grammar: " in line:
            return line.split("error parsing grammar: ", 1)[1].strip()
    for line in reversed(log_lines):
        line = line.strip()
        if line and line != "failed to parse grammar":
            return line
    return ""
