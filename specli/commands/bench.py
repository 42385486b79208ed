"""`specli bench`: plain against speculative decoding on the same prompts, in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specli import drafts
from specli.commands import options as opt
from specli.commands.app import Command, app
from specli.commands.tables import report_console
from specli.decode.request import AUTO
from specli.errors import UsageError


@app.command("bench", cls=Command)
@opt.with_options(opt.MODELS, opt.DRAFTING_OPTIONS, opt.SAMPLING_OPTIONS, opt.HARDWARE_OPTIONS)
def bench(
    ctx: typer.Context,
    *,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="PATH", rich_help_panel=opt.MODEL, help="Workloads: a TOML file of [\\[workload]] tables (default: the shipped ones).")] = None,
    draft_tokens: opt.DraftTokensList = f"{AUTO},2,4,8,16",
    runs: Annotated[int, typer.Option("--runs", metavar="N", callback=opt.positive, rich_help_panel=opt.SAMPLING, help="Measured runs of each configuration, after a warm-up.")] = 5,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N", callback=opt.positive, rich_help_panel=opt.SAMPLING, help="Override every workload's token budget.")] = None,
    json_output: Annotated[bool, typer.Option("--json", rich_help_panel=opt.OUTPUT, help="The report as one JSON object.")] = False,
    verify_on_device: opt.VerifyOnDevice = False,
) -> None:
    """Compare plain and speculative decoding on the same prompts: tok/s, speedup, acceptance, recommended K."""
    # Greedy runs (the default) are checked against plain's text too; sampled runs are keyed
    # by --seed (0 when not given), so every configuration draws the same tokens.
    from specli.comparison import benchmark, load_workloads

    models = opt.models(ctx.params)
    if not drafts.get(models.draft).drafts:
        raise UsageError("bench compares against plain decoding by itself: give --draft a model file or ngram")
    spec = opt.session_spec(models, ctx.params)
    request = opt.generation_request(models, {**ctx.params, "draft_tokens": AUTO, "seed": ctx.params["seed"] or 0},
                                     max_tokens=opt.DEFAULT_MAX_TOKENS)
    report = benchmark(spec, request, load_workloads(prompts), draft_tokens, runs, max_tokens,
                       progress=None if json_output else print_progress)
    if json_output:
        typer.echo(json.dumps(report, indent=1))
    else:
        render_report(report, report_console())


def render_report(report: dict, console) -> None:
    """A line naming the llama.cpp build (its kernels decide the costs), then a Rich table per
    workload."""
    from rich.table import Table
    from rich.text import Text

    from specli.decode.exact import BatchCap

    build = report.get("llama_cpp")
    if build:
        console.print(Text(f"llama-cpp-python {build['llama_cpp_python']}: {build['system_info']}", style="dim"))
    exact = report.get("exact_batch")
    if exact:
        used = "repacking on" if report.get("repack") else "repacking off"
        on, off = (BatchCap.from_report(exact[name]).describe() for name in ("repack", "no_repack"))
        console.print(Text(f"exact verify batches: with repacking {on}; without, {off}"
                           f"{'; --exact, ' + used if report.get('exact') else ''}", style="dim"))
    if report.get("translated"):
        console.print(Text("the draft model has another vocabulary: it drafts through text, re-tokenized for the target",
                           style="dim"))
    if report.get("verify_on_device"):
        console.print(Text("verified on the device: llama.cpp takes each row's argmax, reads are its candidates",
                           style="dim"))

    for workload in report["workloads"]:
        table = Table(
            title=f"{workload['name']} ({workload['kind']}, {workload['prompt_tokens']} prompt tokens, "
            f"{workload['max_tokens']} max) — recommended K: {workload['recommended_k']}",
            title_justify="left",
        )
        for column in ("config", "tok/s", "speedup (min–max)", "accept", "per step", "by position",
                       "draft/verify/other", "py ms/step: loop + reads", "= plain"):
            table.add_column(column, justify="right" if column not in ("config", "by position") else "left")
        for label, s in workload["configs"].items():
            speedup = s["speedup"]
            split = s["time_split"]
            table.add_row(
                label,
                f"{s['tokens_per_second']['median']:.1f}",
                f"{speedup['median']:.2f}× ({speedup['min']:.2f}–{speedup['max']:.2f})" if speedup else "1.00×",
                f"{100 * s['acceptance_rate']:.0f}%" if s["acceptance_rate"] is not None else "–",
                f"{s['mean_accepted_length']:.2f}" if s["mean_accepted_length"] is not None else "–",
                " ".join(f"{100 * a:.0f}" for a in s["acceptance_by_position"][:6]) or "–",
                f"{100 * split['draft']:.0f}/{100 * split['verify']:.0f}/{100 * split['overhead']:.0f}%",
                _python_overhead(s),
                _agreement(s),
            )
        console.print(table)


def _python_overhead(summary: dict) -> str:
    """'0.85 = 0.31 + 12×45µs': the Python time per step, as the loop's own part plus the
    logits rows read to verify (a vocabulary-sized scan each)."""
    text = f"{summary['python_overhead_ms_per_step']:.2f} = {summary['loop_overhead_ms_per_step']:.2f}"
    if summary["read_us_per_row"] is not None:
        text += f" + {summary['rows_read_per_step']:.1f}×{summary['read_us_per_row']:.0f}µs"
    return text


def _agreement(summary: dict) -> str:
    """'yes', or how many runs left plain's output, the earliest token where one did, plain's
    top-two margin there, and the speedup on the text the runs shared with plain:
    '2/5 from 77 (tie 0.12), 1.91× to there'."""
    if summary["identical_to_plain"] is None:
        return "–"
    if summary["identical_to_plain"]:
        return "yes"
    margin = summary["plain_margin_at_first_difference"]
    text = f"{summary['runs_differing']}/{summary['runs']} from {summary['first_difference']}"
    text += f" (tie {margin:.2f})" if margin is not None else ""
    shared = summary.get("speedup_on_plain_text")
    return text + (f", {shared['median']:.2f}× to there" if shared else "")


def print_progress(message: str) -> None:
    print(f"specli bench: {message}", file=sys.stderr, flush=True)
