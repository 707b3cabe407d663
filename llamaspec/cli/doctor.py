"""`llamaspec doctor`: what the installed llama.cpp build can do, and how to get a GPU build."""

from __future__ import annotations

from llamaspec.cli._options import output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app


def _render(info: dict, console) -> None:
    from rich.table import Table

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("llamaspec", info["llamaspec"])
    t.add_row("llama-cpp-python", info["llama_cpp_python"])
    t.add_row("python", f"{info['python']} ({info['platform']})")
    t.add_row("backends", ", ".join(info["backends"]) or "?")
    for d in info["devices"]:
        t.add_row("device", f"{d['name']} [{d['type']}] {d['description']}")
    t.add_row("CPU features", " ".join(info["cpu_features"]) or "-")
    amx = info.get("amx")
    if amx:
        t.add_row("AMX", _amx_line(amx))
        used = ", ".join(amx["extra_buffer_types_used"]) or "none"
        avail = amx["extra_buffer_types"]
        t.add_row("weight buffers", f"extra buffer types in use: {used}"
                  + ("" if avail is None else f" (this build has: {', '.join(avail) or 'none'})"))
        link = (amx["avoid_amx"] or amx["cpu_has_amx"] or amx["amx_weight_buffer"]) and amx["issue"] not in amx["reason"]
        t.add_row("AMX policy", amx["reason"] + (f" ({amx['issue']})" if link else ""))
    t.add_row("GPU offload", "[green]yes[/green]" if info["gpu_offload"] else "[yellow]no (CPU-only build)[/yellow]")
    off = info.get("offload")
    if off:
        for d in off["devices"]:
            mem = (f"{d['free'] / 2**30:.1f} GiB free of {d['total'] / 2**30:.1f} GiB" if d["total"]
                   else "memory not reported")
            t.add_row("memory", f"{d['name']} ({d['type']}) {mem}")
        t.add_row("-ngl/-ngld", off["auto"] + (f" ({off['error']})" if off["error"] else ""))
    if info.get("thread_wait"):
        t.add_row("thread waiting", info["thread_wait"])
    if info.get("draft_loading"):
        t.add_row("draft loading", info["draft_loading"])
    console.print(t)
    if info["gpu_build_commands"]:
        console.print("\nFor GPU offload (-ngl / -ngld), reinstall llama-cpp-python with your backend:")
        for name, cmd in info["gpu_build_commands"].items():
            console.print(f"  [bold]{name}[/bold]: {cmd}", soft_wrap=True)


def _amx_line(amx: dict) -> str:
    cpu = " ".join(amx["cpu_amx_flags"]) if amx["cpu_has_amx"] else "no amx flags"
    build = "AMX_INT8" if amx["build_has_amx"] else "no AMX_INT8"
    has = "yes" if amx["amx_weight_buffer"] else "no"
    return f"{has} (CPU /proc/cpuinfo: {cpu}; ggml build: {build})"


@app.command()
@output_flags
def doctor(*, out: Output) -> None:
    """Show llama-cpp-python / llama.cpp versions, CPU features (and the AMX policy), backends and GPU support."""
    from llamaspec.runtime.devices import offload_report
    from llamaspec.runtime.info import collect

    info = collect()
    info["offload"] = offload_report()   # devices, free memory, what -ngl/-ngld auto does here
    from llamaspec.runtime import wait_policy

    # what this process chose at start-up (cli/__init__.py), as run/batch/serve choose it
    policy = wait_policy.chosen() or wait_policy.choose(None)
    info["thread_wait"] = policy.reason
    info["thread_wait_env"] = policy.env
    info["openmp_runtime"] = wait_policy.openmp_runtime()
    from llamaspec.speculative.drafters import lazy

    # where the default's draft model loads, at the default threads on this machine (drafters/lazy.py)
    gpu = bool(info["offload"] and info["offload"].get("gpu_devices"))
    info["draft_loading"] = "a draft the default chooses loads " + lazy.decide(None, -1 if gpu else 0)[1]
    if out.verbose:
        out.detail(info["system_info"])
    out.data(info, human=lambda c: _render(info, c), quiet=info["llama_cpp_python"])
