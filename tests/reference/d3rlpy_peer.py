"""d3rlpy side of the reference-equivalence test (``tests/reference/test_d3rlpy.py``).

Standalone: runs in its own virtual environment (d3rlpy 2.8.1 pins gymnasium 1.0.0) and never
imports robotrl. The test writes a job directory and runs

    $ROBOTRL_D3RLPY_PYTHON tests/reference/d3rlpy_peer.py JOB_DIR

``JOB_DIR/job.json`` names the algorithm (bc, td3bc, iql, cql, awac), the widths, the number of
updates, the d3rlpy config's keyword arguments, the ``grad_step`` of the first update and, per
update, the kinds and shapes of the noise d3rlpy is expected to draw in order. ``JOB_DIR/
inputs.npz`` holds ``init/<module>.<parameter>`` (the initial weights, d3rlpy's names and
shapes: every parameter of every module of the implementation), ``batch/<k>/<field>`` and
``noise/<k>/<i>``. Everything is float64: d3rlpy's modules are cast with ``.double()``.

The peer builds d3rlpy's algorithm with ``create_impl``, copies the weights in, and for each
update k calls ``impl.update(batch, grad_step)`` with its random draws (``torch.randn``,
``Normal.rsample``'s standard normal, ``Tensor.uniform_``) replaced by the injected noise, in
order; a draw of another kind or shape, or noise left over, fails. It writes
``JOB_DIR/outputs.npz``: per update k, ``<k>/param/<name>`` (every parameter, target networks
and temperatures included), ``<k>/grad/<name>`` (the gradient each optimizer step used, read
just before the step), ``<k>/exp_avg/<name>``, ``<k>/exp_avg_sq/<name>``, ``<k>/step/<name>``
(Adam's state), ``<k>/loss/<key>`` (the update's returned metrics) and ``<k>/extra/<key>``
(values read inside the update: CQL's per-critic conservative term). Files hold data only
(JSON and .npz, loaded without pickle).

Besides the noise, two float32 constants on the compared paths would round float64 values:
``compute_ensemble_q_function_error`` sums the critics' losses into a float32 zero, and IQL's
``compute_value_loss`` builds |tau - 1(u < 0)| from a float32 indicator. The peer re-executes
d3rlpy's own source of those two functions with only the dtype changed (``patch_source``).

``--serve`` reads job directories from stdin, one a line, so that the test module imports
d3rlpy once (seconds) for all its tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dataclasses  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import structlog  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))

import d3rlpy  # noqa: E402
import d3rlpy.algos.qlearning.torch.iql_impl as iql_impl  # noqa: E402
import d3rlpy.models.torch.q_functions.ensemble_q_function as ensemble_q  # noqa: E402
import torch.distributions.normal as torch_normal  # noqa: E402
from d3rlpy.models.encoders import VectorEncoderFactory  # noqa: E402
from d3rlpy.optimizers.optimizers import OptimizerWrapper  # noqa: E402
from d3rlpy.torch_utility import TorchMiniBatch  # noqa: E402

CONFIGS = {
    "bc": d3rlpy.algos.BCConfig,
    "td3bc": d3rlpy.algos.TD3PlusBCConfig,
    "iql": d3rlpy.algos.IQLConfig,
    "cql": d3rlpy.algos.CQLConfig,
    "awac": d3rlpy.algos.AWACConfig,
}
ENCODER_FIELDS = {
    "bc": ("encoder_factory",),
    "td3bc": ("actor_encoder_factory", "critic_encoder_factory"),
    "iql": ("actor_encoder_factory", "critic_encoder_factory", "value_encoder_factory"),
    "cql": ("actor_encoder_factory", "critic_encoder_factory"),
    "awac": ("actor_encoder_factory", "critic_encoder_factory"),
}


def patch_source(owner: Any, name: str, module: Any, old: str, new: str) -> None:
    """Re-execute d3rlpy's own source of ``owner.name`` (a function or method of ``module``)
    with ``old`` replaced by ``new`` once, and install it in its place."""
    source = textwrap.dedent(inspect.getsource(getattr(owner, name)))
    if source.count(old) != 1:
        raise RuntimeError(f"d3rlpy's {name} changed (expected {old!r} once); update the peer")
    namespace: dict[str, Any] = {}
    exec(compile(source.replace(old, new), module.__file__, "exec"),  # noqa: S102
         module.__dict__, namespace)
    setattr(owner, name, namespace[name])


def float64_everywhere() -> None:
    """d3rlpy's two float32 constants on the compared paths, made to follow the data's dtype:
    the critics' summed TD loss starts from a float32 zero, and IQL's expectile weight
    |tau - 1(u < 0)| is built from a float32 indicator (tau rounded to float32)."""
    patch_source(ensemble_q, "compute_ensemble_q_function_error", ensemble_q,
                 "dtype=torch.float32", "dtype=torch.float64")
    patch_source(iql_impl.IQLImpl, "compute_value_loss", iql_impl,
                 "(diff < 0.0).float()", "(diff < 0.0).to(diff.dtype)")


class Noise:
    """The injected draws of one update, handed out in order by the patched samplers."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, np.ndarray]] = []

    def take(self, kind: str, shape: Any, dtype: torch.dtype) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        if not self.queue:
            raise AssertionError(f"d3rlpy drew {kind} noise {shape} beyond the injected noise")
        want, value = self.queue.pop(0)
        if want != kind or tuple(value.shape) != shape:
            raise AssertionError(f"d3rlpy drew {kind} noise {shape}; the next injected is {want} "
                                 f"{tuple(value.shape)}")
        return torch.from_numpy(value).to(dtype)

    def install(self) -> dict[str, Any]:
        saved = {"randn": torch.randn, "standard_normal": torch_normal._standard_normal,
                 "uniform_": torch.Tensor.uniform_}

        def randn(*size: Any, **kw: Any) -> torch.Tensor:
            shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
            return self.take("normal", shape, kw.get("dtype") or torch.get_default_dtype())

        def standard_normal(shape: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
            return self.take("normal", shape, dtype)

        def uniform_(tensor: torch.Tensor, low: float = 0.0, high: float = 1.0,
                     **kw: Any) -> torch.Tensor:
            if (low, high) != (-1.0, 1.0):
                raise AssertionError(f"d3rlpy drew uniform noise in [{low}, {high}); the "
                                     "injected noise is in [-1, 1)")
            with torch.no_grad():
                return tensor.copy_(self.take("uniform", tensor.shape, tensor.dtype))

        torch.randn = randn
        torch_normal._standard_normal = standard_normal
        torch.Tensor.uniform_ = uniform_
        return saved

    @staticmethod
    def uninstall(saved: dict[str, Any]) -> None:
        torch.randn = saved["randn"]
        torch_normal._standard_normal = saved["standard_normal"]
        torch.Tensor.uniform_ = saved["uniform_"]


def build(job: dict[str, Any]) -> Any:
    """d3rlpy's implementation object for the job, float64, on the CPU."""
    enc = VectorEncoderFactory(hidden_units=list(job["hidden"]))
    kwargs = {field: enc for field in ENCODER_FIELDS[job["algo"]]}
    cfg = CONFIGS[job["algo"]](**kwargs, **job["config"])
    algo = cfg.create(device="cpu:0")
    algo.create_impl((job["obs_dim"],), job["act_dim"])
    return algo.impl


def run(job_dir: Path) -> None:
    """Run the job in ``job_dir`` (see the module docstring)."""
    job = json.loads((job_dir / "job.json").read_text())
    inputs = dict(np.load(job_dir / "inputs.npz", allow_pickle=False))
    impl = build(job)
    modules = impl._modules
    named: dict[str, nn.Parameter] = {}
    wrappers: dict[str, OptimizerWrapper] = {}
    for field in dataclasses.fields(modules):
        value = getattr(modules, field.name)
        if isinstance(value, nn.Module):
            value.double()
            named.update({f"{field.name}.{n}": p for n, p in value.named_parameters()})
        elif isinstance(value, OptimizerWrapper):
            wrappers[field.name] = value
    init = {k[len("init/"):]: v for k, v in inputs.items() if k.startswith("init/")}
    if set(init) != set(named):
        raise AssertionError(f"initial weights {sorted(init)} != d3rlpy's parameters "
                             f"{sorted(named)}")
    with torch.no_grad():
        for name, p in named.items():
            if tuple(p.shape) != init[name].shape:
                raise AssertionError(f"{name}: d3rlpy {tuple(p.shape)} != given "
                                     f"{init[name].shape}")
            p.copy_(torch.from_numpy(init[name]))
    names = {p: n for n, p in named.items()}

    grads: dict[str, torch.Tensor] = {}
    for wrapper in wrappers.values():
        def step(wrapper: OptimizerWrapper = wrapper, inner: Any = wrapper.step) -> None:
            for p in wrapper._params:
                grads[names[p]] = p.grad.detach().clone()
            inner()
        wrapper.step = step  # type: ignore[method-assign]

    extra: dict[str, torch.Tensor] = {}
    if job["algo"] == "cql":
        conservative = impl._compute_conservative_loss

        def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = conservative(*args, **kwargs)
            extra["conservative"] = out.detach().clone()
            return out
        impl._compute_conservative_loss = spy

    out: dict[str, np.ndarray] = {}
    noise = Noise()
    for k in range(job["updates"]):
        b = {f: torch.from_numpy(inputs[f"batch/{k}/{f}"])
             for f in ("obs", "action", "reward", "next_obs", "terminated")}
        batch = TorchMiniBatch(
            observations=b["obs"], actions=b["action"], rewards=b["reward"][:, None],
            next_observations=b["next_obs"], next_actions=torch.zeros_like(b["action"]),
            returns_to_go=torch.zeros_like(b["reward"])[:, None],
            terminals=b["terminated"][:, None], intervals=torch.ones_like(b["reward"])[:, None],
            device="cpu:0")
        noise.queue = [(kind, inputs[f"noise/{k}/{i}"])
                       for i, kind in enumerate(job["noise"][k])]
        grads.clear()
        extra.clear()
        saved = noise.install()
        try:
            metrics = impl.update(batch, job["grad_step"] + k)
        finally:
            Noise.uninstall(saved)
        if noise.queue:
            raise AssertionError(f"update {k}: d3rlpy left {len(noise.queue)} injected draws")
        for key, value in metrics.items():
            out[f"{k}/loss/{key}"] = np.asarray(value, dtype=np.float64)
        for key, value in extra.items():
            out[f"{k}/extra/{key}"] = value.numpy()
        for name, g in grads.items():
            out[f"{k}/grad/{name}"] = g.numpy()
        for name, p in named.items():
            out[f"{k}/param/{name}"] = p.detach().numpy().copy()
        for wrapper in wrappers.values():
            for p in wrapper._params:
                for key, value in wrapper.optim.state.get(p, {}).items():
                    out[f"{k}/{key}/{names[p]}"] = torch.as_tensor(value).double().numpy().copy()
    np.savez(job_dir / "outputs.npz", **out)


REPLY = "d3rlpy-peer:"
"""Prefix of the serve loop's answer lines on stdout."""


def main(argv: list[str]) -> None:
    """``JOB_DIR``: run one job. ``--serve``: read job directories from stdin, one a line, and
    answer each with ``d3rlpy-peer: ok`` or ``d3rlpy-peer: error`` (the traceback in
    ``JOB_DIR/error.txt``), so one process (one import of d3rlpy) serves a whole test module."""
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    float64_everywhere()
    if argv != ["--serve"]:
        run(Path(argv[0]))
        return
    for line in sys.stdin:
        job_dir = Path(line.strip())
        try:
            run(job_dir)
            print(f"{REPLY} ok", flush=True)
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            (job_dir / "error.txt").write_text(traceback.format_exc())
            print(f"{REPLY} error", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
