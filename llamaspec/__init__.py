"""llamaspec: speculative decoding for local GGUF models, on llama.cpp via llama-cpp-python.

The Python API for scripts is `Generator` (llamaspec/api/generator.py), imported on first use so that
`import llamaspec` and `llamaspec --help` stay light (no llama_cpp).
"""

from llamaspec._version import __version__

__all__ = ["__version__", "Generator", "Result", "Request", "GenerationInterrupted", "GenerationOptions",
           "SamplingParams"]


def __getattr__(name: str):
    if name in ("Generator", "Result", "Request", "GenerationInterrupted"):
        from llamaspec.api import generator

        return getattr(generator, name)
    if name == "GenerationOptions":
        from llamaspec.api.options import GenerationOptions

        return GenerationOptions
    if name == "SamplingParams":
        from llamaspec.speculative.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'llamaspec' has no attribute {name!r}")
