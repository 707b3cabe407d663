"""huggingface_hub / httpx exceptions -> one clear HubError line with a hint.

Used where Hub calls are made (with the reference at hand for a precise message) and by
`llamaspec.cli._errors.explain` for anything that escapes elsewhere. Never imports huggingface_hub
unless the exception came from it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from llamaspec.errors import HubError

TOKEN_HINT = "set HF_TOKEN or run `hf auth login`"
OFFLINE_HINT = "models already in the cache still work offline (HF_HUB_OFFLINE=1)"


def endpoint() -> str:
    """The Hub URL, read at call time (huggingface_hub reads HF_ENDPOINT only at import)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def network_down(reason: object = None) -> HubError:
    why = f": {reason}" if reason else ""
    return HubError(f"cannot reach the Hugging Face Hub at {endpoint()}{why}",
                    f"check your network connection; {OFFLINE_HINT}")


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _sent_token(exc: BaseException) -> bool:
    request = getattr(getattr(exc, "response", None), "request", None)
    headers = getattr(request, "headers", None)
    return headers is not None and "authorization" in headers


def translate(exc: BaseException, ref: object = None) -> HubError | None:
    """The HubError for a Hub/network exception, or None if `exc` is not one."""
    module = type(exc).__module__ or ""
    if not module.startswith(("huggingface_hub", "httpx", "httpcore")):
        return None
    import huggingface_hub.errors as e

    repo = getattr(ref, "repo_id", None) or getattr(exc, "repo_id", None) or "the repository"
    rev = getattr(ref, "rev", None)
    what = str(ref) if ref is not None else repo
    if isinstance(exc, e.GatedRepoError):
        if _sent_token(exc):
            return HubError(f"{repo} is gated and your token has no access to it",
                            f"accept its conditions at {endpoint()}/{repo} with the account of your token")
        return HubError(f"{repo} is gated: downloading it needs a token",
                        f"accept its conditions at {endpoint()}/{repo}, then {TOKEN_HINT}")
    if isinstance(exc, e.DisabledRepoError):
        return HubError(f"{repo} has been disabled on the Hub", "use another repository")
    if isinstance(exc, e.RepositoryNotFoundError):
        hint = "check the spelling (and that no local file by that name was meant)"
        if not _sent_token(exc):
            hint += f"; if it is private, {TOKEN_HINT}"
        return HubError(f"repository {repo} not found on the Hub", hint)
    if isinstance(exc, e.RevisionNotFoundError):
        return HubError(f"revision {rev or '?'} not found in {repo}", "check the branch, tag or commit after '@'")
    if isinstance(exc, e.RemoteEntryNotFoundError):
        return HubError(f"file not found on the Hub: {what}", "check the file path inside the repository")
    if isinstance(exc, e.OfflineModeIsEnabled):
        return not_cached_offline(what)
    if isinstance(exc, e.LocalEntryNotFoundError):
        return HubError(f"{what} is not in the cache and the Hub could not be reached",
                        f"check your network connection; {OFFLINE_HINT}")
    if isinstance(exc, e.HfHubHTTPError):
        status = _status(exc)
        if status == 401:
            return HubError(f"the Hub rejected the token for {what}", f"check HF_TOKEN, or {TOKEN_HINT} again")
        if status == 403:
            return HubError(f"access to {what} denied by the Hub", "check that your token has read access")
        if status == 429:
            return HubError("rate limited by the Hugging Face Hub",
                            f"wait a minute and retry; {TOKEN_HINT} for higher limits")
        if status is not None and status >= 500:
            return HubError(f"the Hugging Face Hub answered with an error ({status})",
                            "the Hub may be down; retry later")
        # No Hub error code: not the Hub answering (a proxy, a captive portal, a wrong HF_ENDPOINT).
        return HubError(f"{endpoint()} answered HTTP {status} for {what}", "check HF_ENDPOINT and proxy settings")
    import httpx2

    if isinstance(exc, httpx2.ProxyError):
        return HubError(f"the proxy refused the connection to {endpoint()}", "check HTTPS_PROXY / NO_PROXY")
    if isinstance(exc, httpx2.TimeoutException):
        return network_down("timed out")
    if isinstance(exc, (httpx2.NetworkError, httpx2.RemoteProtocolError)):
        return network_down(_short(exc))
    if isinstance(exc, httpx2.HTTPError):
        return HubError(f"Hub request failed: {_short(exc)}", None)
    return None


def not_cached_offline(what: object) -> HubError:
    return HubError(f"{what} is not in the cache and offline mode is on",
                    "unset HF_HUB_OFFLINE (or drop --offline) to download it, or pull it first")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def hub_errors(ref: object = None) -> Iterator[None]:
    """Turn Hub/network exceptions raised inside the block into HubError."""
    try:
        yield
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - translated or re-raised untouched
        err = translate(exc, ref)
        if err is None:
            raise
        raise err from exc
