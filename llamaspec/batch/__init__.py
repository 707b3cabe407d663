"""`llamaspec batch`'s files: requests in (requests.py), records out and resume (results.py), the
manifest that keeps one OUTPUT to one job (manifest.py), and the checks made before any model
loads: OUTPUT writable, no other job writing it (guard.py).

Plain Python (no llama_cpp, no CLI libraries), so all of it is tested without a model.
"""

from llamaspec.batch.guard import OutputLock, check_output_path
from llamaspec.batch.manifest import check_or_write_manifest, input_identity, manifest_path
from llamaspec.batch.requests import CHAT, COMPLETIONS, LineError, Request, parse_requests, read_input
from llamaspec.batch.results import InOrder, OutputFile, error_record, record_failed, recorded_ids, result_record

__all__ = ["Request", "LineError", "parse_requests", "read_input", "result_record", "error_record",
           "record_failed", "recorded_ids", "OutputFile", "InOrder", "check_or_write_manifest", "manifest_path", "input_identity",
           "check_output_path", "OutputLock", "CHAT", "COMPLETIONS"]
