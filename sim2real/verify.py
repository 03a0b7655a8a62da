"""Parity of an exported actor with its torch original, on observations the policy really sees.

``record_observations`` rolls the torch actor out in the task's simulator (the states a deployed
controller meets); ``sample_observations`` is the fallback without an env (Gaussian around the
normalizer's statistics). ``compare`` runs the serialized model (onnxruntime for ONNX, torch for
pt2 and TorchScript) on them, in one batch and row by row (a controller calls it with batch 1), and reports the
largest absolute difference from the torch actor per backend.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import warnings
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from robotrl.nn.actor import DeterministicActor
from robotrl.types import BatchedEnv

SINGLE_ROW_CHECKS = 256
"""Observations also run one at a time (batch 1, the deploy loop's shape)."""


@torch.no_grad()
def record_observations(
    actor: DeterministicActor, env: BatchedEnv, num_obs: int = 10_000, seed: int = 0
) -> torch.Tensor:
    """[num_obs, obs_dim] float32 ``policy`` observations of ``actor`` acting in ``env`` (all
    its worlds): the group an exported controller takes.

    Worlds that end an episode reset automatically, so the record spans several episodes.
    """
    if env.spec.obs_dim != actor.obs_dim:
        raise ValueError(f"env observations have {env.spec.obs_dim} entries, the actor takes "
                         f"{actor.obs_dim}")
    steps = -(-num_obs // env.num_envs)
    obs = env.reset(seed=seed)["policy"].to("cpu", torch.float32)
    rows = []
    for _ in range(steps):
        rows.append(obs.clone())
        obs = env.step(actor(obs)).obs["policy"].to("cpu", torch.float32)
    return torch.cat(rows)[:num_obs]


def sample_observations(actor: DeterministicActor, num_obs: int = 10_000,
                        seed: int = 0) -> torch.Tensor:
    """[num_obs, obs_dim] float32 draws from N(mean, (2 std)^2) of the baked-in normalizer.

    Twice the std reaches into the normalizer's clip region as well as its center.
    """
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(num_obs, actor.obs_dim, generator=gen)
    return actor.mean + 2.0 * actor.std * noise


def onnx_runner(data: bytes, threads: int = 1) -> Callable[[np.ndarray], np.ndarray]:
    """obs [B, obs_dim] float32 -> action [B, act_dim] through onnxruntime on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda obs: session.run(None, {name: obs})[0]


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's deprecation warnings and its exporters' log lines (torch.jit is deprecated
    in 2.14, the ONNX exporter logs the torchvision ops it skips); robotrl says what matters in
    its own words."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def weights_only_unpickling() -> Iterator[None]:
    """Inside: every ``torch.load`` is ``weights_only=True`` and ``pickle.loads`` refuses.

    ``torch.export.load`` unpickles the tensors of a pt2 archive with ``torch.load`` and falls
    back to ``weights_only=False`` (and plain ``pickle.loads`` for some constants) when that
    fails, so a crafted pt2 file could run code on loading. robotrl's exports hold tensors
    only; this closes the fallback for the duration of one load (single-threaded callers).
    """
    import pickle

    real_load, real_loads = torch.load, pickle.loads

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    def loads(*args: Any, **kwargs: Any) -> Any:
        raise pickle.UnpicklingError("a robotrl export holds no pickled objects")

    torch.load, pickle.loads = load, loads
    try:
        yield
    finally:
        torch.load, pickle.loads = real_load, real_loads


SYMPY_CALLS = frozenset({
    "Symbol", "Integer", "Rational", "Max", "Min", "Abs", "Mod", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "And", "Or", "Not", "Piecewise", "FloorDiv", "ModularIndexing", "Where", "PythonMod",
    "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift", "PowByNatural",
    "FloatPow", "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator", "TruncToFloat",
    "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity"})
"""Functions a pt2 archive's symbolic shapes may call (sympy's and torch's own)."""
_SYMPY_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.keyword, ast.Name,
                ast.Constant, ast.Load, ast.operator, ast.unaryop)


def check_sym_expr(text: str) -> None:
    """Raise ``ValueError`` unless ``text`` is arithmetic over symbols, numbers and
    ``SYMPY_CALLS``: ``torch.export.load`` hands each shape expression of an archive to
    ``sympy.sympify``, which ``eval``s it (``__import__('os').system(...)`` would run)."""
    if len(text) > 4096:
        raise ValueError("a symbolic shape expression over 4096 characters")
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        bad = not isinstance(node, _SYMPY_NODES)
        if isinstance(node, ast.Call):
            bad = not (isinstance(node.func, ast.Name) and node.func.id in SYMPY_CALLS)
        elif isinstance(node, ast.Name):
            bad = node.id.startswith("_") or not node.id.isidentifier()
        elif isinstance(node, ast.keyword):
            bad = node.arg is None or node.arg.startswith("_")
        elif isinstance(node, ast.Constant):
            bad = not isinstance(node.value, (int, float, bool, str)) or (
                isinstance(node.value, str) and not node.value.isidentifier())
        if bad:
            raise ValueError(f"symbolic shape {text[:80]!r} is not plain arithmetic")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)}
    if names - called - {"oo", "True", "False"} - {n for n in names if n[:1] in "su"
                                                       and n[1:].isdigit()}:
        raise ValueError(f"symbolic shape {text[:80]!r} names something other than symbols")


def check_pt2_archive(source: str | io.BytesIO) -> None:
    """Check every symbolic shape expression in a pt2 archive's JSON (``check_sym_expr``)
    before ``torch.export.load`` reads it; a bad one raises ``ValueError``."""
    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "expr_str":
                    if not isinstance(item, str):
                        raise ValueError("a symbolic shape that is not a string")
                    check_sym_expr(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            if info.filename.endswith(".json"):
                if info.file_size > 64 << 20:
                    raise ValueError(f"{info.filename}: over 64 MiB of JSON")
                walk(json.loads(archive.read(info)))
    if isinstance(source, io.BytesIO):
        source.seek(0)


def load_torch_module(data: bytes | str, fmt: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A pt2 (``torch.export.load``, tensors read with ``weights_only``: see
    ``weights_only_unpickling``) or TorchScript (``torch.jit.load``: TorchScript's own
    restricted unpickler, no Python) model, on the CPU."""
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    with quiet_torch():
        if fmt == "pt2":
            check_pt2_archive(source)
            with weights_only_unpickling():
                return torch.export.load(source).module()
        if fmt == "torchscript":
            return torch.jit.load(source, map_location="cpu")
    raise ValueError(f"unknown torch format {fmt!r}; known: pt2, torchscript")


def torch_runner(fmt: str) -> Callable[[bytes], Callable[[np.ndarray], np.ndarray]]:
    """Loader of ``fmt`` bytes into obs [B, obs_dim] float32 -> action [B, act_dim] in torch."""

    def load(data: bytes) -> Callable[[np.ndarray], np.ndarray]:
        module = load_torch_module(data, fmt)

        def run(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return module(torch.from_numpy(obs)).numpy()

        return run

    return load


RUNNERS: dict[str, Callable[[bytes], Callable[[np.ndarray], np.ndarray]]] = {
    "onnx": onnx_runner,
    "pt2": torch_runner("pt2"),
    "torchscript": torch_runner("torchscript"),
}
"""Format -> loader of serialized bytes into a numpy function."""


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    # a NaN where torch has a number (or the reverse) is a mismatch, not a 0 difference
    mismatch = np.isnan(a) != np.isnan(b)
    return float("inf") if mismatch.any() else float(np.nanmax(diff, initial=0.0))


@torch.no_grad()
def compare(
    actor: DeterministicActor,
    observations: torch.Tensor,
    data: dict[str, bytes],
    tol: float = 1e-5,
) -> dict[str, Any]:
    """Max abs difference between ``actor`` and each serialized model in ``data``.

    Args:
        actor: the torch reference.
        observations: [M, obs_dim] raw observations.
        data: format (a key of ``RUNNERS``) -> serialized model.
        tol: pass threshold on every backend's max abs difference.

    Returns:
        ``num_obs``, ``tol``, ``max_abs_diff`` {format: float} (over the batched and the
        single-row calls), ``passed`` (every difference finite and <= tol).
    """
    obs = observations.detach().to("cpu", torch.float32).contiguous()
    if obs.ndim != 2 or obs.shape[1] != actor.obs_dim:
        raise ValueError(f"observations must be [M, {actor.obs_dim}], got {tuple(obs.shape)}")
    reference = actor(obs).numpy()
    obs_np = obs.numpy()
    diffs: dict[str, float] = {}
    for fmt, blob in data.items():
        if fmt not in RUNNERS:
            raise ValueError(f"unknown format {fmt!r}; known: {', '.join(RUNNERS)}")
        run = RUNNERS[fmt](blob)
        diff = _max_abs_diff(run(obs_np), reference)
        for i in range(min(SINGLE_ROW_CHECKS, len(obs_np))):
            diff = max(diff, _max_abs_diff(run(obs_np[i : i + 1]), reference[i : i + 1]))
        diffs[fmt] = diff
    passed = all(np.isfinite(d) and d <= tol for d in diffs.values())
    return {"num_obs": int(obs.shape[0]), "tol": tol, "max_abs_diff": diffs, "passed": passed}
