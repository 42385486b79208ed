"""benchmarks/batched_raw.py: specli's side decodes the shapes llama-batched-bench decodes, and
the table reads llama-batched-bench's own figures."""

from __future__ import annotations

import json

from benchmarks import batched_raw
from specli.llama.backend import LoadSettings, Model


def test_specli_side_decodes_batched_bench_shapes(smollm_path):
    prompt, steps = 6, 3
    with Model(smollm_path, LoadSettings(ctx_size=prompt + steps, sequences=2, batch_size=8)) as model:
        calls = []
        decode = model.decode_sequences

        def recorded(parts):
            calls.append([(sequence, first, len(tokens), list(outputs)) for sequence, first, tokens, outputs in parts])
            return decode(parts)

        model.decode_sequences = recorded
        rates = batched_raw.specli_rates(model, [1, 2], prompt, steps)
    assert set(rates) == {1, 2} and all(rate > 0 for pair in rates.values() for rate in pair)
    alone, beside = calls[: 1 + steps], calls[1 + steps :]
    assert alone[0] == [(0, 0, prompt, [False] * (prompt - 1) + [True])]
    assert alone[1:] == [[(0, prompt + step, 1, [True])] for step in range(steps)]
    # two prompts of 6 in batches of 8: sequence 0's whole, then sequence 1's split at the batch's end
    assert beside[0] == [(0, 0, 6, [False] * 5 + [True]), (1, 0, 2, [False, False])]
    assert beside[1] == [(1, 2, 4, [False] * 3 + [True])]
    assert beside[2:] == [[(0, prompt + step, 1, [True]), (1, prompt + step, 1, [True])] for step in range(steps)]


def test_table_reads_llama_batched_bench(tmp_path, smollm_path, capsys):
    arguments = tmp_path / "arguments"
    binary = tmp_path / "llama-batched-bench"
    lines = [json.dumps({"pl": 1, "speed_pp": 100.0, "speed_tg": 40.0}),
             json.dumps({"pl": 2, "speed_pp": 120.0, "speed_tg": 60.0})]
    binary.write_text("#!/bin/sh\necho \"$@\" > " + str(arguments) + "\necho 'main: a log line'\n"
                      + "".join(f"echo '{line}'\n" for line in lines))
    binary.chmod(0o755)
    assert batched_raw.main(["-m", str(smollm_path), "--llama-batched-bench", str(binary), "--npl", "2,1",
                             "-npp", "8", "-ntg", "2", "-t", "2", "--rounds", "2"]) == 0
    passed = arguments.read_text().split()
    assert passed[passed.index("-c") + 1] == "20"  # 2 sequences x (8 + 2)
    assert [passed[passed.index(flag) + 1] for flag in ("-npp", "-ntg", "-npl", "-t")] == ["8", "2", "1,2", "2"]
    assert "-kvu" in passed
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 ") or
            line.startswith("| 2 ")]
    assert [row[2] for row in rows] == ["100.0", "120.0"]  # llama.cpp's prompt rates
    assert [row[5] for row in rows] == ["40.0", "60.0"]  # and generation rates
    assert rows[0][7].endswith("/ 1.00x |") and rows[1][7].endswith("/ 1.50x |")  # 60 / 40
