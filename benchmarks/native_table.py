"""Tables per category from `compare_llamacpp.py --native-modes --rows FILE`: specli's
`-k auto` over its own plain decoding (median and lowest over the category's prompts) and
over llama.cpp's best n-gram mode where the two wrote the same text (geometric mean), for
each prompt set, and the same for `--before` where it ran; with `--equal`, the same ratio
timed over the same number of tokens (compare_llamacpp.py --equal-length).

    python benchmarks/native_table.py benchmarks/out/native-rows.jsonl \\
        benchmarks/prompts/public-dev.toml benchmarks/prompts/public-heldout.toml

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from specli.comparison import load_workloads


def load_rows(path: Path) -> dict[str, dict]:
    """The latest row of each prompt, by name."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["name"]] = row
    return rows


def prompt_set(path: Path) -> list[tuple[str, str]]:
    """(name, kind) of each workload in a prompt set, in order."""
    return [(workload.name, workload.kind) for workload in load_workloads(path)]


def _geo(values: list[float]) -> float | None:
    return statistics.geometric_mean(values) if values else None


def _cell(values: list[float]) -> str:
    """median (lowest) of speedups, or '-'."""
    return f"{statistics.median(values):.2f} ({min(values):.2f})" if values else "-"


def _like(values: list[float]) -> str:
    return f"{_geo(values):.2f} ({len(values)})" if values else "-"


def table(rows: dict[str, dict], workloads: list[tuple[str, str]], title: str,
          equal: dict[str, dict] | None = None) -> str:
    measured = [(name, kind) for name, kind in workloads if name in rows]
    before = any(rows[name].get("before_over_plain") for name, _ in measured)
    head = "| category | prompts | after: over plain, median (lowest) | after: over best native, like for like |"
    rule = "| --- | --- | --- | --- |"
    if before:
        head += " before: over plain | before: over best native |"
        rule += " --- | --- |"
    if equal:
        head += " after: over best native, equal length | before: the same |"
        rule += " --- | --- |"
    lines = [f"**{title}** ({len(measured)} of {len(workloads)} prompts measured)", "", head, rule]
    kinds = list(dict.fromkeys(kind for _, kind in measured)) + ["all"]
    for kind in kinds:
        names = [name for name, k in measured if kind in ("all", k)]
        chosen = [rows[name] for name in names]
        cells = [kind if kind != "all" else "**all**", str(len(names)),
                 _cell([r["specli_over_plain"] for r in chosen]),
                 _like([r["specli_over_best_native"] for r in chosen if r["specli_over_best_native"]])]
        if before:
            cells += [_cell([r["before_over_plain"] for r in chosen if r.get("before_over_plain")]),
                      _like([r["before_over_best_native"] for r in chosen if r.get("before_over_best_native")])]
        if equal:
            same = [equal[name] for name in names if name in equal]
            cells += [_like([r["specli_over_native"] for r in same]),
                      _like([r["before_over_native"] for r in same if r.get("before_over_native")])]
        lines.append("| " + " | ".join(cells) + " |")
    if measured:
        everything = [rows[name] for name, _ in measured]
        lines.append("")
        lines.append("geometric mean over plain: after {:.2f}".format(_geo([r["specli_over_plain"] for r in everything]))
                     + (", before {:.2f}".format(_geo([r["before_over_plain"] for r in everything if r.get("before_over_plain")]))
                        if before else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, help="The --rows file of compare_llamacpp.py --native-modes.")
    parser.add_argument("prompts", type=Path, nargs="+", help="Prompt sets (TOML), one table each.")
    parser.add_argument("--equal", type=Path, help="The rows of compare_llamacpp.py --equal-length, as more columns.")
    args = parser.parse_args(argv)
    rows = load_rows(args.rows)
    equal = load_rows(args.equal) if args.equal else None
    print("\n\n".join(table(rows, prompt_set(path), path.stem, equal) for path in args.prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
