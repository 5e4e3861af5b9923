"""``surrotune best``: the winner as JSON or as a C header that compiles, sanitizer demotions
respected, and clear errors for bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import optuna
import pytest
from analysis_studies import TINY_BEST, Storages

from surrotune.analysis import best_configuration, format_header, open_study
from surrotune.analysis.trials import AnalysisError
from surrotune.cli import main
from surrotune.storage import open_storage
from surrotune.verdicts import SANITIZER_PREFIX, ranked_ok_trials, set_trial_verdict


def best_json(storage: Path, study: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["best", str(storage), "--study", study]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_names_the_winner_its_time_and_resources(
    storages: Storages, capsys: pytest.CaptureFixture[str]
) -> None:
    winner = best_json(storages.gemm, "quickstart", capsys)
    trial = ranked_ok_trials(open_study(str(storages.gemm)))[0]
    assert winner["trial"] == trial.number and winner["params"] == trial.params
    assert winner["objective"] == {
        "metric": "time", "value": trial.value, "unit": "ms", "direction": "minimize"
    }  # fmt: skip
    assert winner["device"] == "NVIDIA H200" and winner["study"] == "quickstart"
    assert winner["repeats"] == 7 and 0 <= winner["spread_pct"] < 5
    for key in ("registers", "shared_bytes", "threads_per_block", "time_ms"):
        assert winner[key] == trial.user_attrs[key]
    assert winner["remeasure_verdict"] == "held"


def test_header_compiles_and_holds_every_parameter(
    storages: Storages, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    header = tmp_path / "gemm_best.h"
    code = main(["best", str(storages.gemm), "--format", "header", "-o", str(header)])
    assert code == 0 and f"to {header}" in capsys.readouterr().out
    text = header.read_text()
    trial = ranked_ok_trials(open_study(str(storages.gemm)))[0]
    for name, value in trial.params.items():
        assert f"#define {name} {value}\n" in text
    assert "study 'quickstart'" in text and f"trial {trial.number}" in text
    assert f"objective time: {trial.value:.6g} ms (minimize)" in text
    checks = "\n".join(
        f'_Static_assert({name} == {value}, "{name}");' for name, value in trial.params.items()
    )
    source = tmp_path / "use.c"
    source.write_text(f'#include "gemm_best.h"\n#include "gemm_best.h"\n{checks}\n'
                      "int tile[BLOCK_M][BLOCK_N / TN];\n")  # fmt: skip
    done = subprocess.run([cc, "-fsyntax-only", "-Wall", "-Werror", str(source)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.nvcc
def test_header_compiles_into_a_cuda_kernel(
    storages: Storages, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = tmp_path / "conv_best.h"
    code = main(["best", str(storages.conv), "--study", "W7800", "--format", "header",
                 "--prefix", "CONV_", "-o", str(header)])  # fmt: skip
    assert code == 0
    source = tmp_path / "kernel.cu"
    source.write_text(
        '#include "conv_best.h"\n'
        "__global__ void k(float *out) {\n"
        "    __shared__ float tile[CONV_block_size_y * CONV_tile_size_y + 14]"
        "[CONV_block_size_x * CONV_tile_size_x + 14];\n"
        "    tile[threadIdx.y][threadIdx.x] = 1.0f;\n"
        "    out[threadIdx.x] = tile[0][0] * CONV_filter_width;\n"
        "}\n"
    )
    done = subprocess.run(["nvcc", "-c", "-o", str(tmp_path / "kernel.o"), str(source)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_demoted_winner_is_not_the_winner(
    tiny_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = optuna.load_study(study_name="tiny", storage=open_storage(str(tiny_copy)))
    first, second = ranked_ok_trials(study)[:2]
    assert first.params == TINY_BEST
    set_trial_verdict(study, SANITIZER_PREFIX, first.number, {
        "outcome": "finding", "status": "runtime", "tool": "memcheck",
        "summary": "1 error: invalid __global__ read",
    })  # fmt: skip
    assert study.best_trial.number == first.number  # Optuna does not know about it
    winner = best_json(tiny_copy, "tiny", capsys)
    assert winner["trial"] == second.number and winner["params"] == second.params
    assert winner["demoted_trials"] == [first.number]
    # the report and the exports agree: the demoted trial is a runtime failure there
    from surrotune.analysis import read_study_trials

    table = read_study_trials(study)
    assert table.best["number"] == second.number
    row = table.frame.set_index("number").loc[first.number]
    assert row["status"] == "runtime" and row["demoted"] == "runtime"


def test_header_refuses_a_name_that_is_not_a_c_identifier() -> None:
    winner = {
        "study": "s", "trial": 1, "ok_trials": 1, "params": {"block-size": 4},
        "objective": {"metric": "time", "value": 1.0, "unit": "ms", "direction": "minimize"},
    }  # fmt: skip
    with pytest.raises(AnalysisError, match=r"'block-size'.*not a C identifier"):
        format_header(winner)
    winner["params"] = {"DTYPE": "float", "FAST": True, "ALPHA": 0.5}
    text = format_header(winner, prefix="K_")
    assert "#define K_DTYPE float\n#define K_FAST 1\n#define K_ALPHA 0.5\n" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["best", "{root}/none.db"], "none.db: no such storage file"),
        (["best", "{tiny}"], "holds 2 studies; choose one with --study: tiny, allfail"),
        (["best", "{tiny}", "--study", "nope"], "has no study 'nope'; it has: tiny, allfail"),
        (["best", "{tiny}", "--study", "allfail"], "has no ok configuration (resource 6)"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_code_2(
    storages: Storages, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(root=storages.root, tiny=storages.tiny) for a in args]
    assert main(filled) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("surrotune: error: ") and message in captured.err
    assert captured.out == ""


def test_library_call_raises_for_a_study_without_ok_trial(storages: Storages) -> None:
    with pytest.raises(AnalysisError, match="no ok configuration"):
        best_configuration(open_study(str(storages.tiny), "allfail"))
