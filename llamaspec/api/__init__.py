"""The public Python API: `Generator` and what goes in and out of it.

    generator.py       Generator: loads the models, generate / generate_many, life cycle
    preparation.py     a Request -> (prompt tokens, the engine's config, tool plan), and the Result
    request.py         Request, Result: one generation's input and output
    options.py         GenerationOptions: what run's flags build (the Generator's fixed settings)
    constraints.py     a request's grammar / json_schema / tools / logit_bias / logprobs, checked
    streaming.py       TextStream: generate(stream=True)
    ownership.py       one generation at a time uses the models; close() frees them when unused
    openai_methods.py  create_chat_completion, create_completion, __call__ (llama-cpp-python's shape)
    resolve.py         model references, --draft, --spec-type and the default -> files and drafters

`llamaspec/__init__.py` re-exports Generator, Request, Result, GenerationOptions and
SamplingParams lazily, so `import llamaspec` stays light.
"""
