"""`llamaspec batch`'s files: requests in (requests.py), records out and resume (results.py).

Plain Python (no llama_cpp, no CLI libraries), so all of it is tested without a model.
"""

from llamaspec.batch.requests import CHAT, COMPLETIONS, LineError, Request, parse_requests, read_input
from llamaspec.batch.results import OutputFile, check_or_write_manifest, error_record, manifest_path, result_record

__all__ = ["Request", "LineError", "parse_requests", "read_input", "result_record", "error_record",
           "OutputFile", "check_or_write_manifest", "manifest_path", "CHAT", "COMPLETIONS"]
