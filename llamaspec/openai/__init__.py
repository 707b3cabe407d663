"""OpenAI's wire format, one place for the server (serve/), batch lines (batch/) and the Python API
(api/openai_methods.py):

- fields.py: what every way in shares without pydantic (RequestError, `stop`, NO_LIMIT);
- requests.py: request bodies -> `generator.Request` keyword arguments, refusals naming the field;
- unsupported.py: fields llamaspec does not implement, with the values that ask for nothing;
- responses.py: chat.completion / chunk / text_completion objects, usage, timings, error bodies;
- tools.py (+ tool_*.py): tool plans, parsers and streamers.

Import the module you need (`from llamaspec.openai import requests`): this file imports nothing,
so the CLI's flags (fields.py) do not pay for pydantic.
"""
