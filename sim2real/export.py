"""Export a ``DeterministicActor`` to ONNX, pt2 or TorchScript, verified before anything is written.

    actor = alg.export_actor()                                  # robotrl.nn.actor
    meta = build_metadata(actor, env.spec, config, algo="ppo")
    obs = record_observations(actor, env, 10_000)               # robotrl.sim2real.verify
    report = export_policy(actor, "onnx", "policy.onnx", meta, obs)

The file has one input ``obs`` [batch, obs_dim] float32 and one output ``action``
[batch, act_dim] float32 (dynamic batch), and carries its metadata: ONNX ``metadata_props``
(one key per field, JSON values) or, in the zip archives of pt2 (``torch.export.save``) and
TorchScript, an extra file ``robotrl_metadata.json``. ``read_metadata`` reads any of them.
ONNX and pt2 go through ``torch.export``; TorchScript through ``torch.jit.trace`` (deprecated by
torch 2.14, kept while torch ships it). The serialized bytes are run (onnxruntime or torch)
against the torch actor on the given observations; a mismatch over ``tol`` raises
``VerificationError`` and leaves no file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from robotrl import __version__
from robotrl.checkpoint import atomic_open
from robotrl.nn.actor import DeterministicActor
from robotrl.sim2real.verify import compare, quiet_torch
from robotrl.types import EnvSpec

INPUT_NAME = "obs"
"""Name of the exported model's input, [batch, obs_dim] float32."""
OUTPUT_NAME = "action"
"""Name of the exported model's output, [batch, act_dim] float32."""
METADATA_FILE = "robotrl_metadata.json"
"""TorchScript extra file holding the metadata."""
METADATA_VERSION = 1
"""Version of the metadata layout."""
ONNX_OPSET = 18
"""The lowest opset torch's ``torch.export``-based ONNX exporter emits natively (LayerNormalization
is one op since 17; the residual networks use it)."""


class ExportError(RuntimeError):
    """The actor cannot be exported (untraceable, unsupported op, missing dependency)."""


class VerificationError(ExportError):
    """The exported model disagrees with the torch actor; ``report`` holds the numbers."""

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


def config_sha256(config: dict[str, Any]) -> str:
    """sha256 of the training config as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def delay_steps_range(config: dict[str, Any]) -> tuple[int, int]:
    """(min, max) action delay in control steps the policy was trained with; (0, 0) if none.

    Read from the config's ``randomization`` (top level or ``env.options``): a preset name or a
    mapping of ``robotrl.config.RandomizationConfig`` fields.
    """
    spec = config.get("randomization")
    if spec is None:
        spec = (config.get("env") or {}).get("options", {}).get("randomization")
    if spec is None or spec == "none":
        return 0, 0
    from robotrl.config import resolve_randomization

    cfg = resolve_randomization(spec)
    return int(cfg.action_delay_min), int(cfg.action_delay_max)


def _mujoco_names(task: str) -> tuple[list[str], list[str]]:
    """(actuator names, joint names) from the task's MJCF; empty for unknown tasks."""
    import mujoco

    from robotrl.envs.registry import list_tasks, task_class

    if task not in list_tasks():
        return [], []
    model = task_class(task).load_model()
    joints = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, i) or f"joint{i}"
              for i in range(model.njnt)]
    actuators = []
    for i in range(model.nu):
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_ACTUATOR, i)
        if not name and model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT:
            name = joints[model.actuator_trnid[i, 0]]  # unnamed motor: the joint it drives
        actuators.append(name or f"actuator{i}")
    return actuators, joints


def build_metadata(
    actor: DeterministicActor, spec: EnvSpec, config: dict[str, Any], algo: str = ""
) -> dict[str, Any]:
    """Everything a controller needs to run the exported actor, as JSON-ready values.

    Args:
        actor: the actor to export (its dims and output transform are recorded).
        spec: the spec of the env it was trained on (task, layout, bounds, control dt).
        config: the training config (``to_dict`` form); hashed, and its delay range read.
        algo: algorithm name, for the record.
    """
    if spec.obs_dim != actor.obs_dim or spec.action_dim != actor.act_dim:
        raise ExportError(f"actor maps {actor.obs_dim} -> {actor.act_dim}, but the env spec has "
                          f"obs_dim {spec.obs_dim} and action_dim {spec.action_dim}")
    actuators, joints = _mujoco_names(spec.task)
    delay_min, delay_max = delay_steps_range(config)
    reference, controller = "", {}
    from robotrl.envs.registry import list_tasks, task_class

    if spec.task in list_tasks():
        reference = f"{task_class(spec.task).gym_id} observation"
        options = (config.get("env") or {}).get("options") or {}
        controller = task_class(spec.task).controller_metadata(dict(options))
    return {
        "metadata_version": METADATA_VERSION,
        "task": spec.task,
        "algo": algo,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "obs_dim": actor.obs_dim,
        # the controller takes the policy group only (an asymmetric critic's privileged
        # groups stay in training); its input is these groups concatenated in this order
        "observation_groups": ["policy"],
        "observation_layout": [{"group": "policy", "offset": 0, "size": actor.obs_dim}],
        "observation_reference": reference,
        # goal-conditioned tasks: the goal is part of the input, at these columns, and is
        # reached when the achieved columns come within success_distance of it
        "goal": None if spec.goal is None else {
            "columns": list(spec.goal.columns), "achieved_columns": list(spec.goal.achieved),
            "success_distance": spec.goal.success_distance},
        "action_dim": actor.act_dim,
        "action_low": [float(v) for v in actor.low.tolist()],
        "action_high": [float(v) for v in actor.high.tolist()],
        "output_transform": actor.output,
        "normalizer": {"baked_in": actor.normalize, "clip": actor.clip, "eps": actor.eps},
        "control_dt": float(spec.control_dt),
        "control_hz": 1.0 / float(spec.control_dt),
        "delay_steps_range": [delay_min, delay_max],
        "expected_delay_steps": (delay_min + delay_max) / 2,
        "expected_delay_s": (delay_min + delay_max) / 2 * float(spec.control_dt),
        "task_options": {k: v for k, v in (config.get("env") or {}).get("options", {}).items()
                         if k != "randomization"},
        "actuator_names": actuators,
        "joint_names": joints,
        # robots: how an action becomes servo targets (target = default_pose + action_scale *
        # action, per joint in this order, at gains kp/kd) and the observation's parts
        "controller": controller,
        "robotrl_version": __version__,
        "torch_version": torch.__version__,
        "config_sha256": config_sha256(config),
    }


def _json(value: Any) -> str:
    # inf (an unclipped normalizer) is written as JSON's common extension "Infinity"
    return json.dumps(value, sort_keys=True)


def _check_forward(actor: DeterministicActor) -> torch.Tensor:
    """A [2, obs_dim] example input after checking that ``actor`` maps it to [2, act_dim]."""
    example = actor.example_input(2)
    try:
        with torch.no_grad():
            out = actor(example)
    except Exception as err:
        raise ExportError(f"the actor fails on a [2, {actor.obs_dim}] input: "
                          f"{type(err).__name__}: {err}") from err
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, actor.act_dim):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ExportError(f"the actor must map [B, {actor.obs_dim}] to [B, {actor.act_dim}], "
                          f"got {shape}")
    return example


_UNFAITHFUL = ("the actor cannot be traced faithfully: its forward depends on tensor values "
               "through Python ({}). Export needs a pure tensor function of obs; remove "
               "data-dependent `if`/`.item()`/`.tolist()` from the network.")


def capture(actor: DeterministicActor) -> torch.export.ExportedProgram:
    """``torch.export`` graph of ``actor`` with a dynamic batch dimension (pt2 and ONNX).

    torch.export refuses Python control flow on tensor values instead of freezing one branch;
    that refusal becomes an ``ExportError`` saying why.
    """
    example = _check_forward(actor)
    batch = torch.export.Dim("batch")
    try:
        with quiet_torch():
            return torch.export.export(actor, (example,), dynamic_shapes=({0: batch},))
    except Exception as err:
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if "data-dependent" in str(err) or "data dependent" in str(err):
            raise ExportError(_UNFAITHFUL.format(reason)) from err
        raise ExportError(f"torch.export of the actor failed: {reason}") from err


def serialize_pt2(actor: DeterministicActor, metadata: dict[str, Any]) -> tuple[bytes, list[str]]:
    """``torch.export.save`` bytes (an ExportedProgram archive) with ``metadata`` as an extra
    file; loads with ``torch.export.load`` and nothing of robotrl."""
    buf = io.BytesIO()
    program = capture(actor)
    with quiet_torch():
        torch.export.save(program, buf, extra_files={METADATA_FILE: _json(metadata)})
    return buf.getvalue(), []


def serialize_torchscript(actor: DeterministicActor,
                          metadata: dict[str, Any]) -> tuple[bytes, list[str]]:
    """TorchScript bytes of a traced actor, with ``metadata`` as an extra JSON file.

    A trace with Python control flow on tensor values would freeze one branch; torch flags it
    with a ``TracerWarning``, which is an error here. Torch's own deprecation warnings for
    ``torch.jit`` (2.14 deprecates it) are replaced by one note in the report.
    """
    example = _check_forward(actor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # check_trace off: export_policy compares the result on 10k observations instead
            traced = torch.jit.trace(actor, example, check_trace=False)
        except Exception as err:
            raise ExportError(f"tracing the actor failed: {type(err).__name__}: {err}") from err
        tracer = [str(w.message) for w in caught
                  if issubclass(w.category, torch.jit.TracerWarning)]
        if tracer:
            raise ExportError(_UNFAITHFUL.format(tracer[0]))
        buf = io.BytesIO()
        torch.jit.save(traced, buf, _extra_files={METADATA_FILE: _json(metadata)})
    deprecated = any(issubclass(w.category, (DeprecationWarning, FutureWarning))
                     and "deprecated" in str(w.message) for w in caught)
    notes = [f"torch {torch.__version__} deprecates TorchScript; this file still loads with "
             "torch.jit.load, but prefer format=pt2 (torch.export: PyTorch, AOTInductor) or "
             "format=onnx (onnxruntime, TensorRT)"] if deprecated else []
    return buf.getvalue(), notes


def serialize_onnx(actor: DeterministicActor, metadata: dict[str, Any]) -> tuple[bytes, list[str]]:
    """ONNX bytes (dynamic batch) with ``metadata`` in ``metadata_props``.

    Uses torch's ``torch.export``-based ONNX exporter (the TorchScript-based one is deprecated
    since torch 2.9); it needs ``onnx`` and ``onnxscript``.
    """
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ExportError("ONNX export needs onnx and onnxscript: "
                          "pip install 'robotrl[onnx]'") from None
    program = capture(actor)
    try:
        with quiet_torch():
            onnx_program = torch.onnx.export(
                program, (actor.example_input(2),), dynamo=True, opset_version=ONNX_OPSET,
                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], verbose=False,
            )
    except Exception as err:
        raise ExportError(f"ONNX export of the actor failed (opset {ONNX_OPSET}): "
                          f"{type(err).__name__}: {err}") from err
    model = onnx_program.model_proto
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    for key, value in metadata.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, _json(value)
    model.producer_name = "robotrl"
    model.producer_version = __version__
    return model.SerializeToString(), []


FORMATS: dict[str, tuple[str, Callable[[DeterministicActor, dict[str, Any]],
                                       tuple[bytes, list[str]]]]] = {
    "onnx": (".onnx", serialize_onnx),
    "pt2": (".pt2", serialize_pt2),
    "torchscript": (".pt", serialize_torchscript),
}
"""Export format -> (file suffix, serializer: (actor, metadata) -> (bytes, notes)).

Pick ONNX for hardware runtimes (onnxruntime, TensorRT, robot computers without torch), pt2 for
PyTorch deployments (``torch.export.load``, AOTInductor), TorchScript for existing libtorch C++
code."""


def export_policy(
    actor: DeterministicActor,
    fmt: str,
    out: str | os.PathLike[str],
    metadata: dict[str, Any],
    observations: torch.Tensor,
    tol: float = 1e-5,
    obs_source: str = "given",
) -> dict[str, Any]:
    """Serialize ``actor`` as ``fmt``, verify the bytes, then write ``out`` atomically.

    The serialized model is run (onnxruntime for ONNX, torch for pt2 and TorchScript) on
    ``observations``, batched and row by row, and compared with the torch actor.

    Args:
        actor: the actor to export.
        fmt: a key of ``FORMATS``.
        out: destination file.
        metadata: from ``build_metadata``; stored in the file, with ``format`` added.
        observations: [M, obs_dim] raw observations to verify on (10k recorded ones).
        tol: largest allowed max abs difference between torch and the exported model.
        obs_source: where ``observations`` came from, for the report.

    Returns:
        The verification report (``compare``) plus ``format``, ``path``, ``bytes`` and
        ``notes`` (e.g. a deprecation of the format by this torch).

    Raises:
        ExportError: unknown format, untraceable actor, failed export, missing package.
        VerificationError: the model differs by more than ``tol``; nothing is written.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; available: {', '.join(FORMATS)}")
    if fmt == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise ExportError("verifying an ONNX export needs onnxruntime: "
                              "pip install 'robotrl[onnx]'") from None
    data, notes = FORMATS[fmt][1](actor, {**metadata, "format": fmt})
    report = compare(actor, observations, {fmt: data}, tol)
    report.update(format=fmt, obs_source=obs_source, notes=notes)
    if not report["passed"]:
        diffs = ", ".join(f"{k} {v:.3g}" for k, v in report["max_abs_diff"].items())
        raise VerificationError(
            f"export refused: the exported model differs from the torch actor by more than "
            f"{tol:g} on {report['num_obs']} observations (max abs diff: {diffs}); no file "
            f"was written", report)
    path = Path(out)
    with atomic_open(path, "wb") as f:
        f.write(data)
    report.update(path=str(path), bytes=len(data))
    return report


def decode_onnx_metadata(props: dict[str, str], path: str = "") -> dict[str, Any]:
    """The robotrl metadata from an ONNX model's ``metadata_props`` (one JSON value per key)."""
    if "metadata_version" not in props:
        raise ValueError(f"{path!r} has no robotrl metadata: not a robotrl export")
    return {key: json.loads(value) for key, value in props.items()}


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata dict stored in an exported ``.onnx`` or TorchScript file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"exported model {str(path)!r} does not exist")
    if zipfile.is_zipfile(path):  # pt2 and TorchScript: zip archives, extra files in */extra/
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(f"/extra/{METADATA_FILE}")]
            if not names:
                raise ValueError(f"{str(path)!r} has no {METADATA_FILE}: not a robotrl export")
            return json.loads(archive.read(names[0]))
    try:
        import onnxruntime as ort
    except ImportError:
        raise ExportError("reading ONNX metadata needs onnxruntime: "
                          "pip install 'robotrl[onnx]'") from None
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:
        raise ValueError(f"{str(path)!r} is neither a pt2/TorchScript archive nor an ONNX file "
                         f"({type(err).__name__}: {err})") from None
    return decode_onnx_metadata(session.get_modelmeta().custom_metadata_map, path)
