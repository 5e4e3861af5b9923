"""``surrotune analyze``: the report builds from the storage alone, with every section, real plots
and a self-contained HTML page; several studies are compared side by side."""

from __future__ import annotations

import base64
import dataclasses
import io
import re
from pathlib import Path

import pytest
from analysis_studies import A100_TRIALS, Storages

from surrotune.analysis import open_study, read_study_trials
from surrotune.analysis.compare import compare_studies
from surrotune.analysis.noise import measurement_noise
from surrotune.cli import main
from surrotune.verdicts import ranked_ok_trials

pytest.importorskip("matplotlib")

#: the headings every single-study report has, in order
SECTIONS = (
    "Convergence",
    "Failures",
    "What matters",
    "Top configurations",
    "Measurement noise",
)


def assert_real_png(data: bytes, *, what: str) -> None:
    """A decodable PNG of a real size whose pixels vary: a plot with data in it, not a blank."""
    import matplotlib.image as mpimg

    assert data[:8] == b"\x89PNG\r\n\x1a\n", what
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    height, width = pixels.shape[:2]
    assert height >= 200 and width >= 300, (what, pixels.shape)
    rgb = pixels[..., :3]
    assert float(rgb.std()) > 0.05, f"{what}: nearly uniform image"
    # data is drawn in colour (the blues and oranges of the statuses), not only black axes
    saturation = rgb.max(axis=-1) - rgb.min(axis=-1)
    assert int((saturation > 0.2).sum()) > 300, f"{what}: no coloured marks"


@pytest.fixture(scope="module")
def gemm_report(storages: Storages, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gemm_report")
    assert main(["analyze", str(storages.gemm), "-o", str(out)]) == 0
    return out


def test_report_has_every_section_in_order(gemm_report: Path) -> None:
    text = (gemm_report / "report.md").read_text()
    assert text.startswith("# surrotune report: 'quickstart'")
    headings = re.findall(r"^### (.+)$", text, re.M)
    assert headings == list(SECTIONS)
    assert "## Study 'quickstart'" in text
    # the overview names the device, the objective and the winner
    assert "NVIDIA H200" in text and "Objective: time (ms), minimized" in text
    assert re.search(r"\*\*Best: 0\.\d+ ms\*\* \(trial \d+\)", text)


def test_report_names_the_stored_winner(gemm_report: Path, storages: Storages) -> None:
    study = open_study(str(storages.gemm))
    winner = ranked_ok_trials(study)[0]
    text = (gemm_report / "report.md").read_text()
    assert f"(trial {winner.number})" in text
    best = " ".join(f"{k}={v}" for k, v in winner.params.items())
    assert best in text


def test_failures_section_counts_statuses_and_gives_rules(
    gemm_report: Path, storages: Storages
) -> None:
    text = (gemm_report / "report.md").read_text()
    failures = text.split("### Failures", 1)[1].split("### What matters", 1)[0]
    study = read_study_trials(open_study(str(storages.gemm)))
    counts = study.status_counts()
    for status, n in counts.items():
        assert re.search(rf"^\| {status} \| {n} \|", failures, re.M), (status, n)
    assert "ptxas" in failures  # the most frequent compiler message of the resource failures
    assert "failed/measured by value" in failures
    rules = re.findall(r"^\| (.+?) \| resource \| (\d+) \| (\d+) \| (\d+) % \|$", failures, re.M)
    assert rules, failures
    for rule, support, matched, precision in rules:
        assert "BLOCK" in rule or "TM" in rule or "PAD" in rule
        assert int(support) >= 5 and int(matched) >= int(support) and int(precision) >= 90


def test_importance_section_has_both_estimates(gemm_report: Path) -> None:
    text = (gemm_report / "report.md").read_text()
    section = text.split("### What matters", 1)[1].split("### Top configurations", 1)[0]
    assert "fANOVA" in section and "cross-validated R²" in section
    table = re.findall(r"^\| (\w+) \| ([\d.e-]+) \| ([\d.e-]+) \| ([\d.e-]+) \|$", section, re.M)
    names = {row[0] for row in table}
    assert {"BLOCK_M", "BLOCK_N", "TM", "TN"} <= names
    fanova = sum(float(row[1]) for row in table)
    surrogate = sum(float(row[2]) for row in table)
    assert fanova == pytest.approx(1.0, abs=0.02) and surrogate == pytest.approx(1.0, abs=0.02)
    assert "partial dependence" in section.lower()


def test_top_configurations_show_resources_and_spread(gemm_report: Path) -> None:
    text = (gemm_report / "report.md").read_text()
    section = text.split("### Top configurations", 1)[1].split("### Measurement noise", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("| rank"))
    # the H200 recording predates the stored occupancy: computed from the stored resources
    for column in ("time (ms)", "median ms", "CV %", "repeats", "BLOCK_M", "registers",
                   "shared_bytes", "occupancy (computed)", "limiter (computed)"):  # fmt: skip
        assert f" {column} " in header, column
    rows = [line for line in section.splitlines() if re.match(r"^\| \d+ \| \d+ \|", line)]
    assert len(rows) == 10
    values = [float(r.split("|")[3]) for r in rows]
    assert values == sorted(values)  # best first


def test_noise_section_tests_the_ranking(gemm_report: Path, storages: Storages) -> None:
    text = (gemm_report / "report.md").read_text()
    section = text.split("### Measurement noise", 1)[1]
    assert "coefficient of variation" in section
    assert "Mann-Whitney" in section
    assert "verdict on the winner: held" in section  # the quickstart re-measures its top 5
    study = read_study_trials(open_study(str(storages.gemm)))
    noise = measurement_noise(study, top=10)
    assert list(noise.top["rank"]) == list(range(1, 11))
    assert noise.top["p_vs_best"].iloc[1:].between(0, 1).all()
    # the confidence interval of each median holds the median
    assert (noise.top["ci_low_ms"] <= noise.top["median_ms"]).all()
    assert (noise.top["median_ms"] <= noise.top["ci_high_ms"]).all()


def test_figures_are_real_pngs_with_data(gemm_report: Path) -> None:
    names = {p.name for p in gemm_report.glob("*.png")}
    expected = {"convergence", "failures", "importance", "dependence", "resources", "noise"}
    assert names == {f"quickstart_{n}.png" for n in expected}
    text = (gemm_report / "report.md").read_text()
    for name in names:
        assert f"]({name})" in text, name
        assert_real_png((gemm_report / name).read_bytes(), what=name)


def test_html_is_self_contained(gemm_report: Path) -> None:
    page = (gemm_report / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", page), "an external reference"
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    pngs = sorted(gemm_report.glob("*.png"))
    assert len(images) == len(pngs)
    decoded = {base64.b64decode(i) for i in images}
    assert decoded == {p.read_bytes() for p in pngs}
    for section in SECTIONS:
        assert f">{section}</h3>" in page
    assert "<table>" in page and "<nav>" in page and "<strong>Best: " in page


def test_convergence_plot_marks_the_failures(storages: Storages) -> None:
    from surrotune.analysis.plots import convergence_figure

    study = read_study_trials(open_study(str(storages.gemm)))
    figure = convergence_figure(study)
    left = figure.axes[0]
    labels = left.get_legend_handles_labels()[1]
    failures = int((study.measured["status"] != "ok").sum())
    assert "best so far" in labels and f"resource ({failures})" in labels


# ------------------------------------------------------------------- several studies


def test_comparison_section_puts_the_studies_side_by_side(conv_report: Path) -> None:
    text = (conv_report / "report.md").read_text()
    assert text.index("## Study 'W7800'") < text.index("## Study 'A100'")
    section = text.split("## Studies side by side", 1)[1]
    assert "AMD Radeon PRO W7800" in section and "NVIDIA A100-PCIE-40GB" in section
    assert "Each winner on the other studies" in section
    assert "Agreement of the rankings" in section
    assert_real_png((conv_report / "comparison.png").read_bytes(), what="comparison.png")
    for png in conv_report.glob("*.png"):
        assert_real_png(png.read_bytes(), what=png.name)


def test_each_winner_on_the_other_gpu_measured_or_predicted(storages: Storages) -> None:
    studies = [read_study_trials(open_study(str(storages.conv), n)) for n in ("W7800", "A100")]
    comparison = compare_studies(studies)
    cross = comparison.cross.set_index("best of")
    for source, target in ((studies[0], studies[1]), (studies[1], studies[0])):
        row = cross.loc[source.name]
        assert row["on"] == target.name
        measured = target.measured[target.measured["config_key"] == source.best["config_key"]]
        if measured.empty:  # never run there: the target's surrogate predicts it
            assert row["predicted"] and row["status there"] == "not measured"
            assert row["rank there"].startswith("~") and row["value there"] > 0
            continue
        there = measured.iloc[0]
        assert not row["predicted"] and row["status there"] == there["status"]
        if there["status"] == "ok":
            value = float(there["value"])
            assert row["value there"] == pytest.approx(value)
            rank = 1 + int((target.ranked["value"] < value).sum())
            assert row["rank there"] == f"{rank} of {len(target.ranked)}"
            assert row["fraction of best"] == pytest.approx(float(target.best["value"]) / value)
    # the A100 winner is one of the W7800's 127, which holds every configuration
    assert not cross.loc["A100"]["predicted"]
    agreement = comparison.agreement.iloc[0]
    assert agreement["measured by both"] == A100_TRIALS
    assert -1 <= agreement["spearman"] <= 1 and agreement["ok on both"] > 20


def test_a_winner_not_measured_on_the_other_study_is_predicted(storages: Storages) -> None:
    w7800 = read_study_trials(open_study(str(storages.conv), "W7800"))
    a100 = read_study_trials(open_study(str(storages.conv), "A100"))
    # the A100 study without the W7800 winner: its value there can only be predicted
    key = w7800.best["config_key"]
    frame = a100.frame[a100.frame["config_key"] != key]
    trimmed = dataclasses.replace(a100, frame=frame)
    cross = compare_studies([w7800, trimmed]).cross.set_index("best of").loc["W7800"]
    assert cross["predicted"] and cross["status there"] == "not measured"
    assert cross["rank there"].startswith("~") and cross["value there"] > 0


def test_storages_of_any_kind_and_studies_of_other_parameters(
    storages: Storages, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any Optuna storage (the tiny study copied into a journal file) beside a SQLite one; the
    two studies tune other parameters, so they are summarised side by side, not matched."""
    import optuna

    from surrotune.storage import open_storage

    journal = tmp_path / "tiny.log"
    optuna.copy_study(
        from_study_name="tiny",
        from_storage=open_storage(str(storages.tiny)),
        to_storage=open_storage(str(journal)),
    )
    out = tmp_path / "r"
    code = main(["analyze", str(journal), str(storages.conv), "--study", "tiny",
                 "--study", "A100", "-o", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "tiny: 32 measurements" in printed and f"A100: {A100_TRIALS} measurements" in printed
    text = (out / "report.md").read_text()
    assert "## Study 'tiny'" in text and "**Best: 1 ms**" in text
    assert "## Studies side by side" in text
    assert "Only studies of the same parameters can be matched" in text
    assert "Each winner on the other studies" not in text
    for png in out.glob("*.png"):
        assert_real_png(png.read_bytes(), what=png.name)


def test_a_study_with_only_failures_gets_its_failure_analysis(
    storages: Storages, tmp_path: Path
) -> None:
    assert main(["analyze", str(storages.tiny), "--study", "allfail", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "No configuration ran successfully" in text
    assert "| resource | 6 | 100.0 % |" in text


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["analyze", "{root}/missing.db"], "missing.db: no such storage file"),
        (["analyze", "{conv}", "--study", "H100"], "no study 'H100' in"),
        (["analyze", "{conv}", "--top", "0"], "--top must be at least 1"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_code_2(
    storages: Storages, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [a.format(root=storages.root, conv=storages.conv) for a in args]
    assert main(filled) == 2
    err = capsys.readouterr().err
    assert err.startswith("surrotune: error: ") and message in err, err
    if "H100" in message:
        assert "found: W7800, A100" in err
    assert not (storages.root / "missing.db").exists()  # nothing created


def test_a_study_not_written_by_surrotune_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'f.db'}", study_name="plain")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert main(["analyze", str(tmp_path / "f.db"), "-o", str(tmp_path / "r")]) == 2
    assert "'plain' was not written by surrotune run" in capsys.readouterr().err
