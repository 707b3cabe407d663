"""ngram-cache's cache files: llama.cpp's -lcs/--lookup-cache-static and -lcd/--lookup-cache-dynamic,
through `llamaspec run` on a tiny model (lossless, drafts from the files) and their errors."""

from __future__ import annotations

import pytest

from llamaspec.speculative.drafters.ngram_cache import (
    NGRAM_STATIC, NgramCacheDrafter, load_ngram_cache, ngram_cache_update, save_ngram_cache,
)

PROMPT = "Tell me about the sea."


def _run(run_cli, *args):
    r = run_cli("run", *args, "--json", "-t", "1")
    assert r.exit_code == 0, r.stderr
    return r.json()


def _common(tiny_models):
    return (str(tiny_models["target"]), "-p", PROMPT, "-n", "40", "--temp", "0", "--raw", "--fixed-draft")


def _static_from(tokens):
    """What llama-lookup-create writes: the 2-grams of a corpus (here: the plain output itself)."""
    cache = {}
    ngram_cache_update(cache, tokens, len(tokens), NGRAM_STATIC, NGRAM_STATIC)
    return cache


def test_static_cache_drafts_and_output_matches_plain(run_cli, tiny_models, tmp_path):
    plain = _run(run_cli, *_common(tiny_models), "--spec-type", "none")
    static = tmp_path / "static.bin"
    save_ngram_cache(_static_from(plain["tokens"]), static)
    without = _run(run_cli, *_common(tiny_models), "--spec-type", "ngram-cache")
    got = _run(run_cli, *_common(tiny_models), "--spec-type", "ngram-cache", "-lcs", str(static))
    assert got["tokens"] == plain["tokens"] == without["tokens"]
    # The static cache knows the output's 2-grams: it drafts where the context cache alone cannot.
    assert got["drafted"] > without["drafted"] and got["accepted"] > without["accepted"]
    assert got["accepted"] > 0
    assert static.read_bytes() == save_bytes(_static_from(plain["tokens"]), tmp_path)  # never written


def save_bytes(cache, tmp_path):
    p = tmp_path / "ref.bin"
    save_ngram_cache(cache, p)
    return p.read_bytes()


def test_dynamic_cache_created_then_reused(run_cli, tiny_models, tmp_path):
    dyn = tmp_path / "dyn.bin"
    plain = _run(run_cli, *_common(tiny_models), "--spec-type", "none")
    first = _run(run_cli, *_common(tiny_models), "--spec-type", "ngram-cache", "--lookup-cache-dynamic", str(dyn))
    assert first["tokens"] == plain["tokens"]
    assert dyn.is_file() and not (tmp_path / "dyn.bin.tmp").exists()
    saved = load_ngram_cache(dyn)
    # It holds the n-grams this run saw: every 1-gram of the generated text is a key.
    gen = plain["tokens"]
    assert all((t, -1, -1, -1) in saved for t in gen[:-1])
    # Second run: the dynamic cache (strict thresholds) drafts from the first run's n-grams.
    second = _run(run_cli, *_common(tiny_models), "--spec-type", "ngram-cache", "-lcd", str(dyn))
    assert second["tokens"] == plain["tokens"]
    assert second["accepted"] > first["accepted"]
    # ... and adds its own counts to the file.
    again = load_ngram_cache(dyn)
    key = next(iter(saved))
    assert sum(again[key].values()) > sum(saved[key].values())


def test_drafter_close_saves_unfinished_sequences(tmp_path):
    dyn = tmp_path / "d.bin"
    d = NgramCacheDrafter(dynamic_path=dyn)
    d.propose(0, [1, 2, 1, 2], 4)
    d.close()
    assert load_ngram_cache(dyn)[(1, -1, -1, -1)] == {2: 2}
    d.close()   # twice: harmless


@pytest.mark.parametrize("flag, make, needle, code", [
    ("-lcs", lambda p: p / "missing.bin", "--lookup-cache-static file not found", 2),
    ("-lcs", lambda p: p, "--lookup-cache-static file is a directory", 2),
    ("-lcd", lambda p: p / "no-dir" / "d.bin", "--lookup-cache-dynamic: directory", 2),
    ("-lcd", lambda p: p, "--lookup-cache-dynamic is a directory", 2),
])
def test_bad_paths_are_one_line_usage_errors(run_cli, tiny_models, tmp_path, flag, make, needle, code):
    r = run_cli("run", str(tiny_models["target"]), "-p", "x", "-n", "2", "--spec-type", "ngram-cache",
                flag, str(make(tmp_path)))
    assert r.exit_code == code, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) <= 2   # error + hint
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("flag", ["-lcs", "-lcd"])
def test_corrupt_cache_file_is_a_one_line_error(run_cli, tiny_models, tmp_path, flag):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x00\x00\x00" * 5)   # an n-gram with a token count of 1 and no pairs
    r = run_cli("run", str(tiny_models["target"]), "-p", "x", "-n", "2", "--spec-type", "ngram-cache",
                flag, str(bad))
    assert r.exit_code != 0 and "corrupt n-gram cache" in r.stderr and "Traceback" not in r.stderr
    assert bad.read_bytes() == b"\x01\x00\x00\x00" * 5   # a corrupt dynamic file is not overwritten


@pytest.mark.parametrize("bad_token, needle", [(-5, "token id -5"), (10**6, "token id 1000000")])
def test_cache_file_with_a_token_the_model_lacks_is_refused(run_cli, tiny_models, tmp_path, bad_token, needle):
    # Every n-gram of the plain output drafts `bad_token`: it used to reach llama_decode, which
    # failed with "raise --ctx-size".
    plain = _run(run_cli, *_common(tiny_models), "--spec-type", "none")
    cache = {key: {bad_token: 9} for key in _static_from(plain["tokens"])}
    static = tmp_path / "static.bin"
    save_ngram_cache(cache, static)
    r = run_cli("run", *_common(tiny_models), "--spec-type", "ngram-cache", "-lcs", str(static), "-t", "1")
    assert r.exit_code in (1, 2), r.stderr
    assert needle in r.stderr and str(static) in r.stderr, r.stderr
    assert "llama_decode" not in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2   # error + hint
