"""The experiment file: a valid one parses; every kind of mistake names file, key and fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from surrotune.experiment import ExperimentError, load_experiment, parse_duration

TEMPLATE = """
extern "C" __global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * ${BLOCK} + threadIdx.x;
    #pragma unroll ${UNROLL}
    for (int k = 0; k < 1; k++) if (i < n) y[i] = 2.0f * x[i];
}
"""

REFERENCE = """
def reference(x, y, n):
    return {"y": 2.0 * x}
"""

VALID = """
name = "scale"
constraints = ["BLOCK * UNROLL <= 2048"]

[kernel]
template = "scale.cu"
name = "scale"
options = ["-O3"]

[sizes]
N = 4096

[[arguments]]
name = "x"
dtype = "float32"
shape = ["N"]

[[arguments]]
name = "y"
dtype = "float32"
shape = ["N"]
output = true

[[arguments]]
name = "n"
dtype = "int32"
value = "N"

[launch]
grid = ["cdiv(N, BLOCK)"]
block = ["BLOCK"]

[parameters]
BLOCK = {pow2 = [32, 1024]}
UNROLL = {range = [1, 4]}

[objective]
metric = "GB/s"
bytes = "8 * N"

[reference]
function = "ref.py:reference"
rtol = 1e-6

[search]
sampler = "tpe"
trials = 50
timeout = "10m"
seed = 3

[evaluation]
backend = "cuda"
warmup = 2
repeats = 5
"""


def _write(tmp_path: Path, text: str = VALID, template: str = TEMPLATE) -> Path:
    (tmp_path / "scale.cu").write_text(template)
    (tmp_path / "ref.py").write_text(REFERENCE)
    path = tmp_path / "scale.toml"
    path.write_text(text)
    return path


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_valid_experiment_parses(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path))
    assert exp.kernel is not None and exp.kernel.template == tmp_path / "scale.cu"
    assert exp.kernel.options == ("-O3",)
    assert exp.parameters["BLOCK"] == (32, 64, 128, 256, 512, 1024)
    assert exp.parameters["UNROLL"] == (1, 2, 3, 4)
    assert [a.name for a in exp.arguments] == ["x", "y", "n"]
    assert [a.output for a in exp.arguments] == [False, True, False]
    assert exp.launch is not None
    assert exp.launch.grid[0].evaluate_int({"N": 4096, "BLOCK": 96}) == 43
    assert exp.objective.direction == "maximize"
    assert exp.objective.value(1.0, {"N": 1_000_000}) == pytest.approx(8.0)
    assert exp.reference is not None and exp.reference.function == "reference"
    assert exp.search.timeout_s == 600 and exp.search.seed == 3
    assert exp.storage.url == f"sqlite:///{tmp_path / 'scale.db'}"
    assert exp.storage.study == "scale"


def test_every_sampler_name_loads_from_an_experiment_file(tmp_path: Path) -> None:
    from surrotune.sampling import SAMPLER_NAMES

    for name in SAMPLER_NAMES:
        path = _write(tmp_path, _edit(VALID, 'sampler = "tpe"', f'sampler = "{name}"'))
        assert load_experiment(path).search.sampler == name


def test_overrides_replace_settings(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path)).with_overrides(trials=7, sampler="random", study="x")
    assert (exp.search.trials, exp.search.sampler, exp.storage.study) == (7, "random", "x")
    with pytest.raises(TypeError):
        exp.with_overrides(nonsense=1)


def test_sizes_from_the_command_line_replace_the_file_s(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path), sizes={"N": 1 << 20})
    assert exp.sizes == {"N": 1 << 20}
    assert exp.objective.value(1.0, exp.sizes) == pytest.approx(8.0 * (1 << 20) / 1e6)


def test_a_size_the_file_does_not_have_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError) as err:
        load_experiment(_write(tmp_path), sizes={"M": 3})
    assert err.value.key == "sizes.M"
    assert "its sizes: N" in str(err.value)


BAD_CASES = [
    # (description, old text, new text, key in message, words in message)
    (
        "unknown top-level key",
        'name = "scale"',
        'name = "scale"\ncolour = "red"',
        "colour",
        "unknown key",
    ),
    (
        "unknown key in a table",
        "repeats = 5",
        "repeats = 5\nrepeat = 5",
        "evaluation.repeat",
        "unknown key",
    ),
    ("wrong type", "trials = 50", 'trials = "fifty"', "search.trials", "integer"),
    ("negative repeats", "repeats = 5", "repeats = 0", "evaluation.repeats", ">= 1"),
    ("bad sampler", 'sampler = "tpe"', 'sampler = "annealing"', "search.sampler", "one of"),
    ("bad duration", 'timeout = "10m"', 'timeout = "ten minutes"', "search.timeout", "duration"),
    (
        "missing template file",
        'template = "scale.cu"',
        'template = "nope.cu"',
        "kernel.template",
        "file not found",
    ),
    (
        "missing reference file",
        'function = "ref.py:reference"',
        'function = "nope.py:reference"',
        "reference.function",
        "file not found",
    ),
    (
        "reference without function",
        'function = "ref.py:reference"',
        'function = "ref.py"',
        "reference.function",
        "file.py:function",
    ),
    (
        "constraint with unknown name",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        'constraints = ["BLOCK * UNRL <= 2048"]',
        "constraints[0]",
        "UNRL",
    ),
    (
        "constraint with a call",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        "constraints = [\"__import__('os').system('true')\"]",
        "constraints[0]",
        "calls",
    ),
    (
        "constraint with attribute access",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        'constraints = ["BLOCK.real > 1"]',
        "constraints[0]",
        "attribute",
    ),
    (
        "constraint with a string",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        "constraints = [\"BLOCK == 'a'\"]",
        "constraints[0]",
        "literal",
    ),
    (
        "constraint with a lambda",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        'constraints = ["(lambda: 1)()"]',
        "constraints[0]",
        "calls",
    ),
    (
        "constraint not an expression",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        'constraints = ["BLOCK <="]',
        "constraints[0]",
        "not a valid expression",
    ),
    (
        "constraint not a string",
        'constraints = ["BLOCK * UNROLL <= 2048"]',
        "constraints = [3]",
        "constraints[0]",
        "expression string",
    ),
    ("shape with unknown size", 'shape = ["N"]', 'shape = ["M"]', "arguments[0].shape", "M"),
    (
        "shape using a parameter",
        'shape = ["N"]',
        'shape = ["N * BLOCK"]',
        "arguments[0].shape",
        "BLOCK",
    ),
    ("bad dtype", 'dtype = "float32"', 'dtype = "float33"', "arguments[0].dtype", "dtype"),
    ("argument without shape or value", 'shape = ["N"]\n', "", "arguments[0]", "exactly one of"),
    (
        "grid with unknown name",
        'grid = ["cdiv(N, BLOCK)"]',
        'grid = ["cdiv(N, BLOCKX)"]',
        "launch.grid",
        "BLOCKX",
    ),
    ("block not a list", 'block = ["BLOCK"]', 'block = "BLOCK"', "launch.block", "list"),
    (
        "parameter value list empty",
        "UNROLL = {range = [1, 4]}",
        "UNROLL = []",
        "parameters.UNROLL",
        "at least one",
    ),
    (
        "bad range",
        "UNROLL = {range = [1, 4]}",
        "UNROLL = {range = [4, 1]}",
        "parameters.UNROLL",
        "range",
    ),
    (
        "mixed-type values",
        "UNROLL = {range = [1, 4]}",
        'UNROLL = [1, "two"]',
        "parameters.UNROLL",
        "one type",
    ),
    (
        "duplicate values",
        "UNROLL = {range = [1, 4]}",
        "UNROLL = [1, 1]",
        "parameters.UNROLL",
        "distinct",
    ),
    ("rate metric without formula", 'bytes = "8 * N"', "", "objective.bytes", "bytes"),
    (
        "flops formula with a parameter",
        'bytes = "8 * N"',
        'bytes = "8 * N"\nflops = "BLOCK"',
        "objective.flops",
        "BLOCK",
    ),
    (
        "replay without dataset",
        'backend = "cuda"',
        'backend = "replay"',
        "evaluation.dataset",
        "missing",
    ),
    (
        "missing dataset file",
        'backend = "cuda"',
        'backend = "replay"\ndataset = "x.json.gz"',
        "evaluation.dataset",
        "file not found",
    ),
    (
        "parameter named like a size",
        "UNROLL = {range = [1, 4]}",
        "N = [1, 2]",
        "parameters.N",
        "also a problem size",
    ),
    (
        "top-level key inside a table",
        "UNROLL = {range = [1, 4]}",
        'UNROLL = {range = [1, 4]}\nconstraints = ["BLOCK < 64"]',
        "parameters.constraints",
        "top of the file",
    ),
    ("no output argument", "output = true", "output = false", "arguments", "output"),
    (
        "unknown counters policy",
        'backend = "cuda"',
        'backend = "cuda"\ncounters = "some"',
        "evaluation.counters",
        "elite",
    ),
    (
        "counters budget out of range",
        'backend = "cuda"',
        'backend = "cuda"\ncounters = "elite"\ncounters_budget = 1.5',
        "evaluation.counters_budget",
        "share of the run's wall time",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_input_names_file_key_and_expectation(
    tmp_path: Path, old: str, new: str, key: str, words: str
) -> None:
    path = _write(tmp_path, _edit(VALID, old, new))
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    message = str(info.value)
    assert str(path) in message
    assert info.value.key.startswith(key) or key in message
    assert words.lower() in message.lower()
    assert list(tmp_path.glob("*.db")) == []


def test_placeholder_without_parameter(tmp_path: Path) -> None:
    path = _write(tmp_path, template=TEMPLATE.replace("2.0f", "${SCALE}"))
    with pytest.raises(ExperimentError, match=r"kernel\.template: .*\$\{SCALE\}"):
        load_experiment(path)


def test_parameter_the_template_never_uses(tmp_path: Path) -> None:
    path = _write(tmp_path, template=TEMPLATE.replace("${UNROLL}", "4"))
    with pytest.raises(ExperimentError, match=r"parameters\.UNROLL: .*never uses"):
        load_experiment(path)


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="file not found"):
        load_experiment(tmp_path / "absent.toml")
    path = _write(tmp_path, "[kernel\nname=1")
    with pytest.raises(ExperimentError, match="not valid TOML"):
        load_experiment(path)


def test_replay_experiment_needs_no_kernel(tmp_path: Path) -> None:
    (tmp_path / "rec.json").write_text("{}")
    path = tmp_path / "replay.toml"
    path.write_text('[evaluation]\nbackend = "replay"\ndataset = "rec.json"\n')
    exp = load_experiment(path)
    assert exp.kernel is None and exp.launch is None and exp.parameters == {}
    assert exp.evaluation.dataset == tmp_path / "rec.json"


def test_shipped_experiments_parse() -> None:
    root = Path(__file__).resolve().parents[1] / "experiments"
    files = sorted(root.glob("*.toml"))
    assert {"quickstart.toml", "gemm.toml"} <= {p.name for p in files}  # README's two commands
    for path in files:  # the loader itself refuses a live file without parameters or a
        load_experiment(path)  # kernel, and a replay whose recording is missing


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), (5, 5.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-3", "soon", "0", True])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError, match=re.escape("duration")):
        parse_duration(text)  # type: ignore[arg-type]
