"""`llamaspec serve`: an OpenAI-compatible HTTP server over one loaded Generator.

scheduler.py  the engine thread: it alone touches the Generator (llama.cpp contexts are not
              thread-safe), decoding up to --parallel slots together, a queue beyond them
metrics.py    llama-server's counters plus the speculative ones, as Prometheus text
app.py        the FastAPI routes; they talk to the engine thread through queues
server.py     uvicorn with a draining SIGTERM
The OpenAI objects themselves are built in llamaspec/openai/ (requests.py, responses.py).
"""
