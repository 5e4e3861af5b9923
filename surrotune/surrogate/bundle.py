"""Model bundles: what a tuning run learned about a kernel on one GPU, in one portable JSON file.

A bundle holds the surrogate models fitted on every measurement of a study (or of a recording),
so that the next GPU, or the next problem size, starts from them (``surrotune run
--warm-start``, :mod:`surrotune.surrogate.transfer`):

- the performance model: the sampler's XGBoost ensemble (:class:`PerformanceModel`) fitted on
  the objective's transform (``log`` of times, ``-log`` of rates), each member in XGBoost's own
  JSON model format, embedded as JSON, which any XGBoost loads without pickle;
- the failure models: one XGBoost classifier per failure kind that can carry over to another GPU
  (``compile``, ``resource``), with the resource limit each resource failure hit (shared memory,
  registers, threads: read from the error text or the recorded resource usage). ``launch``,
  ``runtime``, ``timeout`` and ``correctness`` failures are counted but not modelled: they depend
  on the GPU and driver at hand and are learned again on the new one;
- the resource model: regressors of the compile-time resources every compiled trial reports
  (shared memory, registers and threads per block: :class:`ResourceModel`), XGBoost's JSON and
  the ridge's arrays, with the limit each was judged against and whether the compiler (ptxas's
  static shared-memory limit) or the device set it. A warm start judges their predictions
  against the *target* GPU's limits, so resource failures recur where the new limits say they
  do, not where the old GPU's did. Absent where the source reported no resources (Kernel
  Tuner's recordings); with it, ``resources_explained`` is the share of the source's resource
  failures it predicts (P(fits) < 0.5);
- the parameter encoding, written out value by value (each parameter's values and the number
  each one encodes to, and the columns combined pairwise), so that the models read
  configurations exactly as they were trained, whatever later versions of the encoding do;
- the kernel (name, the template's SHA-256 when the study was tuned from a template; a replayed
  recording has one only when its metadata carries it), the problem sizes, the objective, the
  best measured configurations, and the device descriptor (name, compute capability, SMs,
  shared memory and registers per block and per SM, threads, L2, measured bandwidth where the
  study knows them).

The format is versioned (:data:`BUNDLE_VERSION`): a bundle of an older version is migrated when a
migration exists and refused, with the reason and the fix, when none does; a newer one is refused.
A bundle whose feature columns (:data:`FEATURES_VERSION`) differ from this surrotune's is refused
naming both versions, since its trees would read the wrong columns.

Files are plain JSON (``.json``) or gzipped JSON (``.json.gz``, detected by its magic bytes): the
ensemble of a study of a few thousand trials is a few megabytes of JSON, a fifth of that gzipped.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from surrotune.errors import SurrotuneError
from surrotune.result import ParamValue, Result, Status
from surrotune.space import ENCODING_VERSION, SearchSpace
from surrotune.surrogate.features import (
    FEATURES_VERSION,
    alignment_columns,
    make_features,
    positive_columns,
)
from surrotune.surrogate.geometry import LaunchShape, launch_shape_of_recording
from surrotune.surrogate.performance import (
    PerformanceModel,
    apply_transform,
    dump_booster,
    load_booster,
    objective_transform,
)
from surrotune.surrogate.resources import ResourceModel

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "TRANSFERABLE",
    "BundleError",
    "Encoding",
    "FailureModel",
    "ModelBundle",
    "bundle_from_dataset",
    "bundle_from_study",
    "default_bundle_path",
    "describe_device",
    "fit_bundle",
    "format_bundle",
    "load_bundle",
    "resource_limit",
    "save_study_bundle",
]

#: the ``format`` field of every bundle
BUNDLE_FORMAT = "surrotune-model"
#: the version this surrotune writes; older ones are migrated (see ``_MIGRATIONS``) or refused
BUNDLE_VERSION = 1
#: failure kinds whose models carry over to another GPU (the others are learned again there)
TRANSFERABLE = (Status.COMPILE.value, Status.RESOURCE.value)
#: how many of the best measured configurations a bundle lists
TOP_CONFIGURATIONS = 20


class BundleError(SurrotuneError, ValueError):
    """A model bundle that cannot be read, built or used for this search space."""


# --------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class Encoding:
    """The models' view of a configuration, written out value by value.

    ``codes[k][j]`` is what value ``values[k][j]`` of parameter ``names[k]`` encodes to (the
    :meth:`SearchSpace.encode` scheme of the source study); ``pair_columns`` are the parameters
    whose log2 products and ratios are features. With these, :meth:`features` rebuilds the exact
    matrix the models were trained on, for any configuration whose values the source knew.
    """

    names: tuple[str, ...]
    values: tuple[tuple[ParamValue, ...], ...]
    codes: tuple[tuple[float, ...], ...]
    pair_columns: tuple[int, ...]
    encoding_version: int = ENCODING_VERSION
    features_version: int = FEATURES_VERSION
    #: the launch grid and block at the sizes and SM count the models learned at (None: the
    #: models see the parameters only); a warm start re-evaluates it at the target's
    launch_shape: LaunchShape | None = None
    #: the parameters whose alignment is a feature (:func:`alignment_features`); empty in
    #: bundles saved before it existed, which then load and predict as they did
    alignment_columns: tuple[int, ...] = ()

    @classmethod
    def from_parameters(
        cls,
        parameters: Mapping[str, Sequence[ParamValue]],
        *,
        pairwise: bool = True,
        alignment: bool = True,
    ) -> Encoding:
        """The encoding a :class:`SearchSpace` over these value lists uses (constraints play no
        part in it)."""
        space = SearchSpace({n: list(v) for n, v in parameters.items()})
        longest = max(len(space.values[n]) for n in space.names)
        frame = pd.DataFrame(
            {
                n: [space.values[n][i % len(space.values[n])] for i in range(longest)]
                for n in space.names
            }
        )
        encoded = space.encode(frame)
        codes = tuple(
            tuple(float(c) for c in encoded[: len(space.values[n]), k])
            for k, n in enumerate(space.names)
        )
        values = tuple(tuple(_python(v) for v in space.values[n]) for n in space.names)
        raw = np.full((longest, len(space.names)), np.nan)
        for k, vals in enumerate(values):
            if all(isinstance(v, (bool, int, float)) for v in vals):
                raw[:, k] = [float(vals[i % len(vals)]) for i in range(longest)]
        pairs = tuple(positive_columns(raw)) if pairwise else ()
        aligned = tuple(alignment_columns(raw)) if alignment else ()
        return cls(tuple(space.names), values, codes, pairs, alignment_columns=aligned)

    def index_of(self, frame: pd.DataFrame) -> np.ndarray:
        """``(n, d)`` value positions; raises BundleError naming values the source never saw."""
        index = np.empty((len(frame), len(self.names)), dtype=np.int64)
        for k, name in enumerate(self.names):
            if name not in frame.columns:
                raise BundleError(f"configurations lack parameter {name!r} of the model")
            lookup = {v: j for j, v in enumerate(self.values[k])}
            column = [lookup.get(_python(v), -1) for v in frame[name].tolist()]
            unknown = sorted({repr(v) for v, j in zip(frame[name], column, strict=True) if j < 0})
            if unknown:
                raise BundleError(
                    f"parameter {name!r}: values {', '.join(unknown)} are not among the model's "
                    f"({', '.join(map(repr, self.values[k]))})"
                )
            index[:, k] = column
        return index

    def features(self, frame: pd.DataFrame) -> np.ndarray:
        """The model matrix of the configurations in ``frame`` (:func:`make_features`)."""
        index = self.index_of(frame)
        encoded = np.empty(index.shape, dtype=np.float64)
        raw = np.full(index.shape, np.nan, dtype=np.float64)
        for k in range(len(self.names)):
            encoded[:, k] = np.asarray(self.codes[k], dtype=np.float64)[index[:, k]]
            if all(isinstance(v, (bool, int, float)) for v in self.values[k]):
                raw[:, k] = np.asarray(self.values[k], dtype=np.float64)[index[:, k]]
        extra = self.launch_shape.columns(frame) if self.launch_shape is not None else None
        return make_features(
            encoded, raw, pair_columns=list(self.pair_columns), extra=extra,
            alignment_columns=self.alignment_columns,
        )  # fmt: skip

    def mismatches(self, parameters: Mapping[str, Sequence[ParamValue]]) -> list[str]:
        """What keeps these parameters from being read by this encoding, one line each: names
        missing on either side, and values the source never measured (a model knows nothing of
        them). Empty when every configuration of ``parameters`` can be encoded."""
        problems = []
        missing = [n for n in self.names if n not in parameters]
        extra = [n for n in parameters if n not in self.names]
        if missing:
            problems.append(f"the model's parameters {', '.join(missing)} are not in this space")
        if extra:
            problems.append(f"this space's parameters {', '.join(extra)} are not in the model")
        for k, name in enumerate(self.names):
            if name not in parameters:
                continue
            known = set(self.values[k])
            new = [v for v in parameters[name] if _python(v) not in known]
            if new:
                problems.append(
                    f"{name}: values {', '.join(map(repr, new))} were never measured by the "
                    f"model's study (it knows {', '.join(map(repr, self.values[k]))})"
                )
        return problems

    def to_json(self) -> dict[str, Any]:
        return {
            "encoding_version": self.encoding_version,
            "features_version": self.features_version,
            "parameters": [
                {"name": n, "values": list(v), "codes": list(c)}
                for n, v, c in zip(self.names, self.values, self.codes, strict=True)
            ],
            "pair_columns": list(self.pair_columns),
            "launch_shape": self.launch_shape.to_json() if self.launch_shape else None,
            "alignment_columns": list(self.alignment_columns),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Encoding:
        params = data["parameters"]
        return cls(
            names=tuple(str(p["name"]) for p in params),
            values=tuple(tuple(p["values"]) for p in params),
            codes=tuple(tuple(float(c) for c in p["codes"]) for p in params),
            pair_columns=tuple(int(c) for c in data.get("pair_columns", ())),
            encoding_version=int(data.get("encoding_version", ENCODING_VERSION)),
            features_version=int(data["features_version"]),
            launch_shape=LaunchShape.from_json(data.get("launch_shape")),
            alignment_columns=tuple(int(c) for c in data.get("alignment_columns", ())),
        )


# --------------------------------------------------------------------------- failure models


#: what the error text of a resource failure says ran out (ptxas, NVRTC, the CUDA runtime)
_LIMITS = (
    ("shared", re.compile(r"shared (data|memory)|smem", re.IGNORECASE)),
    ("registers", re.compile(r"register|too many resources", re.IGNORECASE)),
    ("threads", re.compile(r"threads|block size", re.IGNORECASE)),
)


def resource_limit(result: Result, device: Mapping[str, Any] | None = None) -> str:
    """Which device limit a ``resource`` failure ran into: ``shared``, ``registers``,
    ``threads`` or ``unknown``.

    The recorded resource usage decides where it exceeds the device's limit; else the error text
    (``uses too much shared data``: shared; ``too many resources requested for launch``, the CUDA
    runtime's message when registers times threads exceed the block's register file: registers).
    Kernel Tuner caches record no text: ``unknown``.
    """
    device = device or {}
    shared_limit = device.get("shared_per_block_optin") or device.get("shared_per_block")
    if result.shared_bytes is not None and shared_limit and result.shared_bytes > shared_limit:
        return "shared"
    regs = device.get("regs_per_block")
    if (
        result.registers
        and result.threads_per_block
        and regs
        and (result.registers * result.threads_per_block > regs)
    ):
        return "registers"
    threads = device.get("max_threads_per_block")
    if result.threads_per_block and threads and result.threads_per_block > threads:
        return "threads"
    for name, pattern in _LIMITS:
        if result.error and pattern.search(result.error):
            return name
    return "unknown"


@dataclass
class FailureModel:
    """P(a configuration fails with one kind of failure) on the source GPU.

    A boosted classifier on the bundle's features, fitted on every measurement of the source
    (thousands of rows for a recording, a few hundred for a study, so the raw probabilities are
    used: calibration would split them further for little). With one class seen, the model is
    the Laplace-smoothed rate.
    """

    kind: str
    count: int
    total: int
    booster: Any = None
    limits: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return (self.count + 1.0) / (self.total + 2.0)

    def predict(self, X: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return np.full(len(X), self.rate if self.count else 0.0)
        X = np.ascontiguousarray(X, dtype=np.float32)
        return np.asarray(self.booster.inplace_predict(X), dtype=np.float64)

    @classmethod
    def fit(
        cls, kind: str, X: np.ndarray, failed: np.ndarray, *, seed: int, limits: Mapping[str, int]
    ) -> FailureModel:
        import xgboost as xgb

        count = int(failed.sum())
        model = cls(kind=kind, count=count, total=len(failed), limits=dict(limits))
        if 0 < count < len(failed):
            data = xgb.DMatrix(np.asarray(X, dtype=np.float32), label=failed.astype(np.float32))
            params = {
                "objective": "binary:logistic", "max_depth": 4, "eta": 0.15,
                "tree_method": "hist", "nthread": 1, "seed": seed, "verbosity": 0,
            }  # fmt: skip
            model.booster = xgb.train(params, data, num_boost_round=80)
        return model

    def to_json(self) -> dict[str, Any]:
        booster = dump_booster(self.booster) if self.booster else None
        return {
            "count": self.count,
            "total": self.total,
            "limits": dict(self.limits),
            "booster": booster,
        }

    @classmethod
    def from_json(cls, kind: str, data: Mapping[str, Any]) -> FailureModel:
        booster = load_booster(data["booster"]) if data.get("booster") else None
        return cls(
            kind=kind,
            count=int(data["count"]),
            total=int(data["total"]),
            booster=booster,
            limits={str(k): int(v) for k, v in (data.get("limits") or {}).items()},
        )


# --------------------------------------------------------------------------- device


#: descriptor field -> the names it has in a CUDA device's properties and in ``device_limits``
_DEVICE_KEYS: dict[str, tuple[str, ...]] = {
    "sm_count": ("multiProcessorCount", "sm_count"),
    "max_threads_per_block": ("maxThreadsPerBlock", "max_threads_per_block"),
    "max_threads_per_sm": ("maxThreadsPerMultiProcessor", "max_threads_per_sm"),
    "regs_per_block": ("regsPerBlock", "regs_per_block"),
    "regs_per_sm": ("regsPerMultiprocessor", "regs_per_sm"),
    "shared_per_block": ("sharedMemPerBlock", "shared_per_block"),
    "shared_per_block_optin": ("sharedMemPerBlockOptin", "shared_per_block_optin"),
    "shared_per_sm": ("sharedMemPerMultiprocessor", "shared_per_sm"),
    "l2_bytes": ("l2CacheSize", "l2_bytes"),
    "warp_size": ("warpSize", "warp_size"),
    "bandwidth_gbs": ("bandwidth_gbs", "measured_bandwidth_gbs"),
}


def describe_device(*sources: Mapping[str, Any] | None) -> dict[str, Any]:
    """The bundle's device descriptor from a study's ``device`` attribute (CUDA property names)
    and/or a trial's ``device_limits`` (surrotune's names); the first source that has a field
    wins. Fields nobody recorded are None (a Kernel Tuner cache records only the name)."""
    merged: dict[str, Any] = {"name": None, "compute_capability": None}
    for source in sources:
        if not source:
            continue
        if merged["name"] is None and source.get("name"):
            merged["name"] = str(source["name"])
        if merged["compute_capability"] is None:
            major, minor = source.get("major"), source.get("minor")
            if isinstance(major, int) and isinstance(minor, int):
                merged["compute_capability"] = f"{major}.{minor}"
            elif source.get("compute_capability"):
                merged["compute_capability"] = str(source["compute_capability"])
        for key, names in _DEVICE_KEYS.items():
            if merged.get(key) is None:
                merged[key] = next((source[n] for n in names if source.get(n) is not None), None)
    return merged


# --------------------------------------------------------------------------- the bundle


@dataclass
class ModelBundle:
    """A study's models and what they were learned on (see the module docstring)."""

    encoding: Encoding
    direction: str
    transform: str
    objective: str
    performance: PerformanceModel
    failures: dict[str, FailureModel]
    device: dict[str, Any]
    kernel: dict[str, Any] | None
    problem_size: Any
    source: dict[str, Any]
    statuses: dict[str, int]
    top: list[dict[str, Any]]
    created: str = ""
    version: int = BUNDLE_VERSION
    path: str | None = None
    #: the source's learned compile-time resources (None: it reported none)
    resources: ResourceModel | None = None
    #: the share of the source's resource failures that ``resources`` predicts
    resources_explained: float | None = None

    # -- predictions ------------------------------------------------------------------------

    def features(self, frame: pd.DataFrame) -> np.ndarray:
        return self.encoding.features(frame)

    def predict(self, frame: pd.DataFrame, *, members: bool = False) -> np.ndarray:
        """The performance model on the transformed scale (lower is better): the ensemble mean,
        or with ``members`` the ``(K, n)`` predictions of each member."""
        X = self.features(frame)
        preds = self.performance.predict_members(X)
        return preds if members else preds.mean(axis=0)

    def predict_objective(self, frame: pd.DataFrame) -> np.ndarray:
        """The predicted objective in its own unit (ms, GFLOP/s ...)."""
        y = self.predict(frame)
        y = y if self.direction == "minimize" else -y
        return np.exp(y) if self.transform == "log" else y

    def predict_failures(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        """P(fails with this kind on the source GPU) per transferable kind."""
        X = self.features(frame)
        return {kind: model.predict(X) for kind, model in self.failures.items()}

    def predict_resources(self, frame: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The source's predicted ``log2(value + 1)`` of each learned resource, and its σ (empty
        where the bundle has no resource model)."""
        if self.resources is None or not self.resources.informative:
            return {}
        return self.resources.predict_log(self.features(frame))

    def transform_values(self, values: np.ndarray) -> np.ndarray:
        """Objective values on this bundle's model scale."""
        return apply_transform(values, self.direction, self.transform)

    @property
    def label(self) -> str:
        """A short name for messages: the file's name, else the device's."""
        if self.path:
            return Path(self.path).name
        return str(self.device.get("name") or self.source.get("study") or "model")

    # -- (de)serialisation ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": BUNDLE_FORMAT,
            "version": self.version,
            "created": self.created,
            "source": self.source,
            "kernel": self.kernel,
            "problem_size": self.problem_size,
            "device": self.device,
            "objective": {
                "metric": self.objective,
                "direction": self.direction,
                "transform": self.transform,
            },
            "encoding": self.encoding.to_json(),
            "statuses": self.statuses,
            "top": self.top,
            "performance": self.performance.get_state(),
            "failures": {kind: model.to_json() for kind, model in self.failures.items()},
            "resources": None if self.resources is None else {
                **self.resources.to_json(), "explained": self.resources_explained,
            },
        }  # fmt: skip

    def save(self, path: str | Path) -> Path:
        """Write the bundle: gzipped when the name ends in ``.gz``, else plain JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), separators=(",", ":"), default=_json_default)
        data = text.encode()
        if path.name.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, path: str | None = None) -> ModelBundle:
        where = path or "model bundle"
        if doc.get("format") != BUNDLE_FORMAT:
            raise BundleError(
                f"{where}: not a surrotune model bundle (format {doc.get('format')!r}, expected "
                f"{BUNDLE_FORMAT!r}); make one with surrotune model save"
            )
        doc = _migrate(dict(doc), where)
        encoding = Encoding.from_json(doc["encoding"])
        if encoding.features_version != FEATURES_VERSION:
            raise BundleError(
                f"{where}: the model was trained on feature columns of version "
                f"{encoding.features_version}, this surrotune builds version {FEATURES_VERSION}; "
                "its trees would read the wrong columns. Save the bundle again from its study "
                "(surrotune model save STORAGE --study NAME -o FILE)"
            )
        objective = doc["objective"]
        try:
            resources = doc.get("resources")
            return cls(
                encoding=encoding,
                direction=str(objective["direction"]),
                transform=str(objective["transform"]),
                objective=str(objective.get("metric", "")),
                performance=PerformanceModel.from_state(doc["performance"]),
                failures={
                    kind: FailureModel.from_json(kind, data)
                    for kind, data in (doc.get("failures") or {}).items()
                },
                device=dict(doc.get("device") or {}),
                kernel=doc.get("kernel"),
                problem_size=doc.get("problem_size"),
                source=dict(doc.get("source") or {}),
                statuses={str(k): int(v) for k, v in (doc.get("statuses") or {}).items()},
                top=list(doc.get("top") or []),
                created=str(doc.get("created", "")),
                version=int(doc["version"]),
                path=path,
                resources=ResourceModel.from_json(resources) if resources else None,
                resources_explained=(
                    None if not resources or resources.get("explained") is None
                    else float(resources["explained"])
                ),
            )  # fmt: skip
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"{where}: a damaged model bundle ({type(exc).__name__}: {exc})"
            ) from None


#: version -> a function that turns a bundle of that version into one of the next version
_MIGRATIONS: dict[int, Any] = {}


def _migrate(doc: dict[str, Any], where: str) -> dict[str, Any]:
    version = doc.get("version")
    if not isinstance(version, int):
        raise BundleError(f"{where}: the bundle has no format version; surrotune did not make it")
    if version > BUNDLE_VERSION:
        raise BundleError(
            f"{where}: bundle format version {version} was written by a newer surrotune; this "
            f"one reads versions up to {BUNDLE_VERSION}. Upgrade surrotune to use it"
        )
    while version < BUNDLE_VERSION:
        step = _MIGRATIONS.get(version)
        if step is None:
            raise BundleError(
                f"{where}: bundle format version {version} is no longer read (this surrotune "
                f"reads version {BUNDLE_VERSION}; the models of version {version} cannot be "
                "converted). Save it again from its study: surrotune model save STORAGE "
                "--study NAME -o FILE"
            )
        doc = step(doc)
        version = int(doc["version"])
    return doc


def load_bundle(path: str | Path) -> ModelBundle:
    """Read a bundle (plain or gzipped JSON); BundleError says what is wrong with a bad one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"{path}: no such model bundle") from None
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the model bundle ({exc.strerror})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise BundleError(f"{path}: a damaged gzip file ({exc})") from None
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BundleError(f"{path}: not a surrotune model bundle (a JSON {type(doc).__name__})")
    return ModelBundle.from_json(doc, path=str(path))


# --------------------------------------------------------------------------- fitting


def fit_bundle(
    results: Sequence[Result],
    *,
    parameters: Mapping[str, Sequence[ParamValue]],
    direction: str,
    objective: str,
    device: Mapping[str, Any],
    kernel: Mapping[str, Any] | None,
    problem_size: Any,
    source: Mapping[str, Any],
    seed: int = 0,
    launch_shape: LaunchShape | None = None,
) -> ModelBundle:
    """Fit the models of a bundle on measured ``results`` of one search space (with
    ``launch_shape``, on the launch-geometry features too).

    The performance model is the sampler's own (:class:`PerformanceModel` with its defaults) on
    the transformed objective of the ``ok`` results; one :class:`FailureModel` per transferable
    failure kind. Results outside the parameter lists, and ``constraint`` ones, are left out.
    """
    encoding = replace(Encoding.from_parameters(parameters), launch_shape=launch_shape)
    measured = [r for r in results if r.status.counts_as_evaluation]
    if not measured:
        raise BundleError("nothing was measured: a model needs measurements to learn from")
    frame = pd.DataFrame([{n: r.config.get(n) for n in encoding.names} for r in measured])
    try:
        X = encoding.features(frame)
    except BundleError as exc:
        raise BundleError(f"a measurement lies outside the study's parameters: {exc}") from None
    ok = np.array([r.ok and r.objective is not None and math.isfinite(r.objective)
                   for r in measured])  # fmt: skip
    if ok.sum() < 2:
        raise BundleError(
            f"only {int(ok.sum())} configuration(s) ran successfully; a performance model needs "
            "at least two"
        )
    values = np.array([r.objective for r, good in zip(measured, ok, strict=True) if good])
    transform = objective_transform(values)
    y = apply_transform(values, direction, transform)
    performance = PerformanceModel(seed=seed).fit(X[ok], y)
    statuses = Counter(r.status.value for r in measured)
    limits = describe_device(device)
    failures = {}
    for kind in TRANSFERABLE:
        failed = np.array([r.status.value == kind for r in measured])
        hit: Counter[str] = Counter()
        if kind == Status.RESOURCE.value:
            hit = Counter(resource_limit(r, limits) for r in measured if r.status.value == kind)
        failures[kind] = FailureModel.fit(kind, X, failed, seed=seed, limits=hit)
    resources, explained = _fit_resources(measured, X, ok, limits, seed)
    order = np.argsort(y)[:TOP_CONFIGURATIONS]
    ok_results = [r for r, good in zip(measured, ok, strict=True) if good]
    top = [
        {
            "config": {n: _python(ok_results[i].config.get(n)) for n in encoding.names},
            "value": float(ok_results[i].objective),
        }
        for i in order
    ]
    return ModelBundle(
        encoding=encoding,
        direction=direction,
        transform=transform,
        objective=objective,
        performance=performance,
        failures=failures,
        device=limits,
        kernel=dict(kernel) if kernel else None,
        problem_size=problem_size,
        source={**dict(source), "measurements": len(measured), "ok": int(ok.sum())},
        statuses=dict(sorted(statuses.items())),
        top=top,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        resources=resources,
        resources_explained=explained,
    )


def _fit_resources(
    measured: Sequence[Result],
    X: np.ndarray,
    ok: np.ndarray,
    device: Mapping[str, Any],
    seed: int,
) -> tuple[ResourceModel | None, float | None]:
    """The source's resource model (the sampler's :class:`ResourceModel` on every measurement)
    and the share of its resource failures it predicts; ``(None, None)`` where the results
    report no resources."""
    attrs = [
        {"shared_bytes": r.shared_bytes, "registers": r.registers,
         "threads_per_block": r.threads_per_block, "error": r.error}
        for r in measured
    ]  # fmt: skip
    model = ResourceModel(seed=seed).fit(X, attrs, device, list(ok))
    if not model.informative:
        return None, None
    failed = np.array([r.status is Status.RESOURCE for r in measured])
    if not failed.any():
        return model, None
    return model, float(np.mean(model.predict_fits(X[failed]) < 0.5))


def bundle_from_study(study: Any, *, seed: int = 0) -> ModelBundle:
    """The bundle of a stored surrotune study: its measurements, search space, kernel, sizes and
    device (the study's ``device`` attribute, else the limits its trials recorded)."""
    from surrotune.analysis.export import STUDY_ATTR, study_results

    described = study.user_attrs.get(STUDY_ATTR)
    if not described:
        raise BundleError(
            f"study {study.study_name!r} was not written by surrotune run: its search space is "
            "unknown"
        )
    results = study_results(study)
    limits = next(
        (t.user_attrs["device_limits"] for t in study.get_trials(deepcopy=False)
         if t.user_attrs.get("device_limits")),
        None,
    )  # fmt: skip
    device = describe_device(study.user_attrs.get("device"), limits)
    kernel = described.get("kernel")
    sizes: Any = described.get("sizes") or {}
    dataset = described.get("dataset")
    source: dict[str, Any] = {"study": study.study_name}
    if dataset:
        source["dataset"] = str(dataset)
        recorded = _recording_metadata(dataset)
        if kernel is None and recorded.get("kernel"):
            kernel = {**recorded["kernel"], "from": "the replayed recording's metadata"}
        if not sizes and recorded.get("problem_size") is not None:
            sizes = recorded["problem_size"]
        if device.get("name") is None and recorded.get("device"):
            device = describe_device(recorded["device"])
    if kernel is None and dataset:
        kernel = {"template_sha256": None, "note": "replayed recording without a template"}
    parameters = described["parameters"]
    if isinstance(parameters, list):
        parameters = {str(n): v for n, v in parameters}
    return fit_bundle(
        results,
        parameters=parameters,
        direction=str(described["direction"]),
        objective=str(described.get("objective") or "time"),
        device=device,
        kernel=kernel,
        problem_size=sizes,
        source=source,
        seed=seed,
    )


def bundle_from_dataset(
    path: str | Path, *, seed: int = 0, launch_features: bool = False
) -> ModelBundle:
    """The bundle of a whole brute-force recording: every configuration it measured (with
    ``launch_features``, its models learn the launch geometry too)."""
    from surrotune.backends.replay import load_dataset

    dataset = load_dataset(path)
    meta = dict(dataset.metadata)
    kernel = meta.get("kernel") or {
        "name": dataset.kernel_name,
        "template_sha256": None,
        "note": "replayed recording without a template",
    }
    return fit_bundle(
        list(dataset.results.values()),
        parameters=dataset.parameters,
        direction=dataset.direction,
        objective=dataset.objective,
        device=describe_device(meta.get("device"), {"name": dataset.device_name}),
        kernel=kernel,
        problem_size=dataset.problem_size,
        source={"dataset": str(path)},
        seed=seed,
        launch_shape=launch_shape_of_recording(dataset) if launch_features else None,
    )


def _recording_metadata(path: str) -> dict[str, Any]:
    """A replayed recording's kernel, device and problem size, when the file is still there."""
    from surrotune.backends.replay import DatasetError, load_dataset

    try:
        dataset = load_dataset(path)
    except (DatasetError, OSError):
        return {}
    meta = dict(dataset.metadata)
    return {
        "kernel": meta.get("kernel"),
        "device": meta.get("device"),
        "problem_size": dataset.problem_size,
    }


def default_bundle_path(storage: str, study_name: str) -> Path:
    """Where ``surrotune run`` saves a study's bundle: beside a file storage (``runs.db`` ->
    ``runs.model.json.gz``; ``runs-NAME.model.json.gz`` for a study named otherwise), else
    ``NAME.model.json.gz`` in the working directory."""
    from surrotune.storage import storage_url

    url = storage_url(storage)
    for scheme in ("sqlite:///", "journal:///"):
        path = Path(url.removeprefix(scheme))
        if url.startswith(scheme) and not path.name.startswith(":"):
            stem = path.stem if study_name == path.stem else f"{path.stem}-{_slug(study_name)}"
            return path.parent / f"{stem}.model.json.gz"
    return Path.cwd() / f"{_slug(study_name)}.model.json.gz"


def save_study_bundle(study: Any, path: str | Path) -> str:
    """Fit and save a study's bundle at the end of a run; the line the summary prints (why it
    was not saved, when it could not be: too few successful measurements, say)."""
    try:
        saved = bundle_from_study(study).save(path)
    except BundleError as exc:
        return f"Model not saved: {exc}"
    except OSError as exc:
        return f"Model not saved: {path}: {exc.strerror}"
    return (
        f"Model saved to {saved}; warm-start another GPU with --warm-start {saved} "
        f"(surrotune model show {saved})"
    )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


# --------------------------------------------------------------------------- printing


def format_bundle(bundle: ModelBundle) -> str:
    """The bundle for a person: what it was learned on, on which GPU, and what it believes."""
    lines = [f"model bundle {bundle.path or ''} (format version {bundle.version}, made "
             f"{bundle.created or 'at an unknown time'})".replace("  ", " ")]  # fmt: skip
    src = bundle.source
    where = ", ".join(f"{k} {v}" for k, v in src.items() if k in ("study", "dataset"))
    lines.append(
        f"  learned from: {where or 'unknown'}; {src.get('measurements', '?')} measurements, "
        f"{src.get('ok', '?')} ok"
    )
    lines.append("  statuses: " + ", ".join(f"{k} {v}" for k, v in bundle.statuses.items()))
    kernel = bundle.kernel or {}
    sha = kernel.get("template_sha256")
    template = f"template SHA-256 {sha}" if sha else (kernel.get("note") or "no template hash")
    lines.append(f"  kernel: {kernel.get('name', '?')}, {template}")
    lines.append(f"  problem size: {_size_text(bundle.problem_size)}")
    lines.append(
        f"  objective: {bundle.objective or '?'} ({bundle.direction}), modelled as "
        f"{'log' if bundle.transform == 'log' else 'the value itself'}"
        + (" of its negative" if bundle.direction == "maximize" else "")
    )
    lines.append("  device:")
    for key, value in bundle.device.items():
        if key == "bandwidth_gbs" and value is None:
            lines.append("    measured bandwidth: not measured")
        elif value is not None:
            lines.append(f"    {key.replace('_', ' ')}: {_number(value)}")
    unknown = [k for k, v in bundle.device.items() if v is None and k != "bandwidth_gbs"]
    if unknown:
        lines.append(f"    not recorded: {', '.join(unknown)}")
    enc = bundle.encoding
    lines.append(
        f"  parameters ({len(enc.names)}; encoding version {enc.encoding_version}, feature "
        f"columns version {enc.features_version}, {len(enc.pair_columns)} combined pairwise):"
    )
    for name, values in zip(enc.names, enc.values, strict=True):
        lines.append(f"    {name}: {', '.join(map(str, values))}")
    if enc.alignment_columns:
        aligned = ", ".join(enc.names[k] for k in enc.alignment_columns)
        lines.append(f"  alignment features (the power of two dividing it, is it one): {aligned}")
    shape = enc.launch_shape
    if shape is not None:
        sms = f", {shape.sm_count} SMs (waves)" if shape.sm_count else ", no SM count (no waves)"
        lines.append(
            f"  launch geometry features: grid {' x '.join(shape.grid)}, block "
            f"{' x '.join(shape.block)}, at {_size_text(dict(shape.sizes))}{sms}; read at the "
            "target's sizes by a warm start"
        )
    perf = bundle.performance
    lines.append(
        f"  performance model: {len(perf.boosters_)} XGBoost members x "
        f"{perf.n_estimators} trees, depth {perf.max_depth}, on {perf.n_features_in_} features"
    )
    for kind, model in bundle.failures.items():
        what = "no failures of this kind" if not model.count else f"{model.count} failures"
        if model.limits:
            what += " (" + ", ".join(f"{k} {v}" for k, v in sorted(model.limits.items())) + ")"
        lines.append(f"  {kind} failure model: {what} in {model.total} measurements")
    if bundle.resources is not None:
        explained = bundle.resources_explained
        share = "" if explained is None else (
            f"; predicts {100 * explained:.0f} % of its resource failures"
        )  # fmt: skip
        lines.append(
            f"  resource model (a warm start judges it against the target's limits{share}):"
        )
        for name, m in bundle.resources.models_.items():
            regressor = "ridge + trees" if m.use_linear else "trees"
            lines.append(
                f"    {name.replace('_', ' ')}: limit {2**m.log_limit - 1:,.0f} (set by the "
                f"{m.limit_origin}), {regressor}, σ {m.sigma:.2f} log2"
            )
    if bundle.top:
        unit = "ms" if bundle.objective == "time" else bundle.objective
        lines.append(f"  best measured configurations ({min(5, len(bundle.top))} of "
                     f"{len(bundle.top)} kept):")  # fmt: skip
        for entry in bundle.top[:5]:
            config = " ".join(f"{k}={v}" for k, v in entry["config"].items())
            lines.append(f"    {entry['value']:.6g} {unit}: {config}")
    return "\n".join(lines)


def _size_text(size: Any) -> str:
    if isinstance(size, Mapping):
        return ", ".join(f"{k}={v}" for k, v in size.items()) or "none recorded"
    if isinstance(size, (list, tuple)):
        return " x ".join(map(str, size))
    return "none recorded" if size is None else str(size)


def _number(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:,}"
    return str(value)


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
