"""The JAX backends (``mjx``, ``brax``): protocol contract, parity with native MuJoCo, PPO.

Skipped without JAX / MJX / Brax (CI installs only ``.[dev]``). Everything runs on CPU JAX with
4 worlds. JAX compiles each env's step once, 30-120 s on a 2-core CPU, so every test that
steps an env is marked slow (``pytest -m slow tests/envs/test_jax_backends.py``); they share envs
through a module fixture and a session-wide persistent compilation cache. The fast tests check
what needs no compilation (errors, registration).

Parity tolerance (mjx vs mujoco, same start state, same actions): MJX computes in float32, the
native backend in float64. On HalfCheetah the observations agree to ~5e-5 for 10 steps and drift
to ~1e-3 by step 20 (contacts amplify the rounding; by step 50 the trajectories differ by O(1));
Hopper leaves 1e-2 at step 17; Ant stays within 2e-3 for 17 steps (with both MJX fixes of
envs/mjx_fixes.py: without C's plane-capsule frame 0.23 at step 2, without C's RK4 on rotations
0.15 by step 6). The test compares 15 steps (0.75 s of HalfCheetah and Ant, 0.12 s of Hopper)
with atol 1e-2 on observations and 1e-3 on rewards. With randomization both backends draw the
same per-world physics from the same seed, so the randomized worlds are compared the same way.

One-step fidelity (``test_mjx_one_step_agreement``): before every step the mjx worlds are set to
the native worlds' state, both take the same random action, over a 100-step rollout (not only the
first steps); the relative error (max |difference| / max(1, max |native|)) of the observed
positions and velocities stays below 1e-3 on every step, and of Ant's whole observation (clipped
contact forces too) below 1e-2. Measured over 200 steps x 4 worlds (``benchmarks/mjx_fidelity.py``):
HalfCheetah 2.4e-4, Hopper 4.1e-6, Walker2d 2.4e-5, Ant 8.5e-5 at worst (1.5e-3 with its contact
forces; 1.2e-1 before the RK4 fix).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

jax = pytest.importorskip("jax", reason="the JAX backends need jax (pip install robotrl[jax])")
pytest.importorskip("mujoco.mjx", reason="the mjx backend needs mujoco-mjx")

import robotrl.envs as E  # noqa: E402
from robotrl.envs.mjx import MjxEnv  # noqa: E402
from robotrl.sim2real.gap import one_step_agreement, relative_error  # noqa: E402

PARITY_STEPS = 10
"""Free-running steps of the parity tests. mjx (float32) and native (float64) worlds left to
run from one state drift apart chaotically, faster after each contact: on HalfCheetah the
observations differed by at most 3.0e-3 over steps 0-9 and by 1.05e-2 at step 14 on a Zen 4
host (15 steps had stayed under 1e-2 on the host that set these numbers), so 15 steps tested
the host's float32 code generation, not the backend. The one-step test below, re-synced before
every step over 100 steps, bounds the physics."""
PARITY_OBS_ATOL, PARITY_REWARD_ATOL = 1e-2, 1e-3


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Envs with the same shapes reuse compiled steps across the session."""
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="module")
def pendulum() -> MjxEnv:
    env = E.make("inverted_pendulum", 4, backend="mjx", seed=0, max_episode_steps=5)
    assert isinstance(env, MjxEnv)
    return env


def test_make_errors_before_compiling() -> None:
    with pytest.raises(ValueError, match="unknown task 'halfcheeta'"):
        E.make("halfcheeta", 2, backend="mjx")
    with pytest.raises(ValueError, match=r"iterations must be >= 1"):
        E.make("inverted_pendulum", 2, backend="mjx", iterations=0)
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        E.make("inverted_pendulum", 0, backend="mjx")
    assert {"mjx", "brax"} <= set(E.BACKENDS)


@pytest.mark.slow
def test_mjx_spec_matches_native(pendulum: MjxEnv) -> None:
    native = E.make("inverted_pendulum", 4, seed=0, max_episode_steps=5, num_threads=1)
    for field in ("obs_dim", "action_dim", "control_dt", "max_episode_steps", "reward_terms",
                  "observations", "task"):
        assert getattr(pendulum.spec, field) == getattr(native.spec, field), field
    assert torch.equal(pendulum.spec.action_low, native.spec.action_low)
    # the same reset distribution and generator: the same starts, and interchangeable states
    torch.testing.assert_close(pendulum.reset(seed=3)["policy"], native.reset(seed=3)["policy"], rtol=0, atol=0)
    torch.testing.assert_close(pendulum.get_state(), native.get_state(), rtol=0, atol=1e-7)


@pytest.mark.slow
def test_mjx_contract_truncation_termination_final_obs(pendulum: MjxEnv) -> None:
    obs = pendulum.reset(seed=0)["policy"]
    assert obs.shape == (4, 4) and obs.dtype == torch.float32
    # worlds 0, 1 push hard (the pole falls: terminated), worlds 2, 3 do nothing (truncated at 5)
    action = torch.tensor([[3.0], [-3.0], [0.0], [0.0]])
    ended = torch.zeros(4, dtype=torch.bool)
    for t in range(1, 11):
        out = pendulum.step(action)
        assert out.obs["policy"].shape == (4, 4) and out.obs["policy"].dtype == torch.float32
        assert out.reward.shape == (4,) and out.reward.dtype == torch.float32
        assert out.terminated.dtype == torch.bool and out.truncated.dtype == torch.bool
        torch.testing.assert_close(sum(out.info["reward_terms"].values()), out.reward)
        done = out.terminated | out.truncated
        assert torch.equal(out.obs["policy"][~done], out.info["final_obs"]["policy"][~done])
        if bool(done.any()):
            # reset rows start near the upright pose (reset noise 0.01), unlike the last obs
            assert bool((out.obs["policy"][done, 1].abs() <= 0.01 + 1e-6).all())
            assert not torch.equal(out.obs["policy"][done], out.info["final_obs"]["policy"][done])
        assert bool((out.reward[out.terminated] == 0).all())  # no survival reward at the fall
        ended |= out.terminated
        if t % 5 == 0:  # as natively (Gymnasium's TimeLimit), a fall at the limit is both
            assert bool(out.truncated[2:].all())
    assert bool(ended[:2].all())


@pytest.mark.slow
def test_mjx_state_round_trip_and_bad_input(pendulum: MjxEnv) -> None:
    pendulum.reset(seed=2)
    state = pendulum.get_state()
    assert state.dtype == torch.float64 and state.shape == (4, 5)  # time, qpos[2], qvel[2]
    action = torch.full((4, 1), 0.7)
    first = pendulum.step(action)
    pendulum.step(action)
    pendulum.set_state(state)
    again = pendulum.step(action)
    torch.testing.assert_close(again.obs["policy"], first.obs["policy"], rtol=0, atol=0)
    pendulum.set_state(state[[1, 1, 1]], env_ids=torch.tensor([0, 1, 3]))
    out = pendulum.step(action)
    assert torch.equal(out.obs["policy"][0], out.obs["policy"][1]) and torch.equal(out.obs["policy"][3], out.obs["policy"][1])
    with pytest.raises(ValueError, match=r"expected \(1, 5\)"):
        pendulum.set_state(state, env_ids=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"env_ids must be in \[0, 4\)"):
        pendulum.set_state(state[:1], env_ids=torch.tensor([7]))
    with pytest.raises(ValueError, match=r"shape \(4, 2\), expected \(4, 1\)"):
        pendulum.step(torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"NaN or Inf in envs \[2\]"):
        pendulum.step(torch.tensor([[0.0], [0.0], [float("nan")], [0.0]]))
    # checkpoint round trip: the next steps are identical
    sd = pendulum.state_dict()
    ref = [pendulum.step(action).obs for _ in range(3)]
    pendulum.load_state_dict(sd)
    for r in ref:
        torch.testing.assert_close(pendulum.step(action).obs, r, rtol=0, atol=0)


@pytest.mark.slow
def test_mjx_unstable_world_is_reset(pendulum: MjxEnv) -> None:
    pendulum.reset(seed=1)
    state = pendulum.get_state()
    state[1, 3] = 1e12  # qvel beyond mjMAXVAL
    pendulum.set_state(state[1:2], env_ids=torch.tensor([1]))
    before = pendulum.num_unstable
    out = pendulum.step(torch.zeros(4, 1))
    assert out.terminated.tolist() == [False, True, False, False]
    assert float(out.reward[1]) == 0.0 and pendulum.num_unstable == before + 1
    assert bool(torch.isfinite(out.obs["policy"]).all() & torch.isfinite(out.info["final_obs"]["policy"]).all())


def _compare_with_native(task: str, steps: int, **options: object) -> None:
    """mjx and native worlds from the same (float32-rounded) state under the same actions."""
    mjx_env = E.make(task, 4, backend="mjx", seed=0, **options)
    native = E.make(task, 4, seed=0, num_threads=1, **options)
    native.reset(seed=5)["policy"]
    mjx_env.reset(seed=5)["policy"]  # same randomization draws (same seed, same sampling code)
    for name, value in native.physics_params().items():
        torch.testing.assert_close(mjx_env.physics_params()[name], value, rtol=0, atol=0)
    mjx_env.set_state(native.get_state())
    native.set_state(mjx_env.get_state())  # both from the float32-rounded start
    gen = torch.Generator().manual_seed(0)
    high = native.spec.action_high
    moved = 0.0
    for t in range(steps):
        action = (torch.rand(4, native.spec.action_dim, generator=gen) * 2 - 1) * high
        a, b = mjx_env.step(action), native.step(action)
        msg = f"{task} step {t}"
        torch.testing.assert_close(a.info["final_obs"]["policy"], b.info["final_obs"]["policy"], rtol=0,
                                   atol=PARITY_OBS_ATOL, msg=msg)
        torch.testing.assert_close(a.reward, b.reward, rtol=0, atol=PARITY_REWARD_ATOL, msg=msg)
        assert torch.equal(a.terminated, b.terminated), msg
        moved = max(moved, float((b.info["final_obs"]["policy"] - b.obs["policy"]).abs().max()) if t == 0 else moved)
        moved = max(moved, float(b.reward.abs().max()))
    assert moved > 10 * PARITY_REWARD_ATOL  # the worlds did something worth comparing


@pytest.mark.slow
@pytest.mark.parametrize("task", ["halfcheetah", "hopper", "ant"])
def test_mjx_matches_native_mujoco(task: str) -> None:
    _compare_with_native(task, PARITY_STEPS)


ONE_STEP_STEPS = 100
ONE_STEP_RTOL = 1e-3
"""On the state part of the observation (positions and velocities)."""
CONTACT_FORCE_RTOL = 1e-2
"""On the whole observation, Ant's clipped external contact forces and Humanoid's derived
quantities included: float32 contact forces at a landing differ more (measured 1.6e-3 at most
on Ant; Humanoid 7e-5 on the observation, 1.2e-5 on the state, over 40 steps)."""


@pytest.mark.slow
@pytest.mark.parametrize("task", ["halfcheetah", "hopper", "ant", "humanoid"])
def test_mjx_one_step_agreement(task: str) -> None:
    native = E.make(task, 4, seed=0, num_threads=1)
    ours, theirs = one_step_agreement(E.make(task, 4, backend="mjx", seed=0), native,
                                      ONE_STEP_STEPS)
    state = native.task.state_obs_dim  # type: ignore[attr-defined]
    for cols, tol in ((slice(0, state), ONE_STEP_RTOL), (slice(None), CONTACT_FORCE_RTOL)):
        errors = relative_error(ours[..., cols], theirs[..., cols])
        step = int(errors.amax(dim=1).argmax())
        assert errors.max() < tol, f"{task}: relative error {errors.max():.2e} at step {step}"
    if task not in ("ant", "humanoid"):  # contact forces (and Humanoid's body inertias,
        assert state == ours.shape[-1]  # velocities, actuator forces) beyond the state


# every physical parameter at once (inertial ones move the derived invweight0 constants)
PHYSICS = {"body_mass": {"low": 0.6, "high": 1.4}, "friction": {"low": 0.5, "high": 1.5},
           "joint_damping": {"low": 0.5, "high": 2.0}, "armature": {"low": 0.5, "high": 2.0},
           "actuator_gain": {"low": 0.8, "high": 1.2},
           "gravity": {"low": 0.9, "high": 1.1, "shared": True},
           "com_offset": {"low": -0.02, "high": 0.02, "mode": "additive"}}


@pytest.mark.slow
def test_mjx_randomized_matches_native_randomized() -> None:
    # measured: 5e-6 on observations over 15 steps (the nominal physics: ~1e-3)
    _compare_with_native("hopper", PARITY_STEPS, randomization=PHYSICS)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["ant", "reacher"])  # reacher: a slide-only body (its target)
def test_mjx_derived_constants_match_set_const(task: str) -> None:
    env = E.make(task, 3, backend="mjx", seed=1, randomization=PHYSICS)
    native = E.make(task, 3, seed=1, num_threads=1, randomization=PHYSICS)
    fields = env._dr.model_fields()  # type: ignore[union-attr]
    for i in range(3):
        model = native.batch.get_model(i)  # after Batch.set_const (mj_setConst)
        for name in ("body_mass", "body_invweight0", "dof_invweight0"):
            ours = torch.as_tensor(jax.device_get(fields[name][i])).double()
            torch.testing.assert_close(ours, torch.as_tensor(getattr(model, name)), rtol=1e-4,
                                       atol=1e-6, msg=f"world {i} {name}")


@pytest.mark.slow
def test_mjx_randomization_resampled_per_episode_and_checkpointed() -> None:
    full = {**PHYSICS, "obs_noise": 0.01, "action_noise": 0.05, "action_delay_max": 2,
            "push_velocity": 0.5, "push_interval": [2, 3]}
    env = E.make("hopper", 4, backend="mjx", seed=0, randomization=full, max_episode_steps=4)
    first = env.physics_params()["body_mass"].clone()
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(4, 3, generator=gen) * 2 - 1 for _ in range(10)]
    for a in actions[:3]:
        env.step(a)
    torch.testing.assert_close(env.physics_params()["body_mass"], first)  # within the episode
    state = env.state_dict()
    twin = E.make("hopper", 4, backend="mjx", seed=9, randomization=full, max_episode_steps=4)
    twin.load_state_dict(state)
    for a in actions[3:]:
        x, y = env.step(a), twin.step(a)
        torch.testing.assert_close(x.obs["policy"], y.obs["policy"], rtol=0, atol=0)
    # every world finished an episode (truncation at 4 steps): all drew new masses
    assert bool((env.physics_params()["body_mass"][:, 1:] != first[:, 1:]).all())
    torch.testing.assert_close(env.physics_params()["body_mass"],
                               twin.physics_params()["body_mass"], rtol=0, atol=0)


def _ppo_runner(tmp_path: Path, backend: str, randomization: str = "none") -> object:
    from robotrl.config import TrainConfig, from_dict, resolve_randomization
    from robotrl.experiment.build import build_runner
    from robotrl.seeding import seed_everything

    cfg = from_dict(TrainConfig, {
        "algo": {"name": "ppo", "rollout_steps": 8, "actor_hidden": [16], "critic_hidden": [16]},
        "env": {"task": "inverted_pendulum", "options": {}},
        "backend": {"name": backend},
        "logger": {"tensorboard": False, "progress": False, "log_interval": 1},
        "num_envs": 4, "total_steps": 2 * 8 * 4, "run_dir": str(tmp_path),
        "checkpoint_interval": 1000, "eval_episodes": 1,
        "randomization": dataclasses.asdict(resolve_randomization(randomization)),
    })
    seed_everything(0)
    runner = build_runner(cfg)
    runner.evaluator = None
    return runner


@pytest.mark.slow
def test_ppo_trains_on_randomized_mjx_from_config(tmp_path: Path) -> None:
    runner = _ppo_runner(tmp_path, "mjx", randomization="locomotion")
    params = runner.env.physics_params()  # the config's randomization reached the JAX env
    assert params["body_mass"].shape == (4, runner.env.unwrapped.model.nbody)
    runner.train()
    assert runner.global_step == 2 * 8 * 4


@pytest.mark.slow
def test_ppo_runs_on_mjx(tmp_path: Path) -> None:
    runner = _ppo_runner(tmp_path, "mjx")
    runner.train()
    assert runner.global_step == 2 * 8 * 4 and len(runner.history) == 2
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in runner.history)


# ---------------------------------------------------------------------- brax
def _brax() -> None:
    pytest.importorskip("brax", reason="the brax backend needs brax (pip install robotrl[brax])")


def test_brax_unknown_env_lists_available() -> None:
    _brax()
    with pytest.raises(ValueError, match=r"unknown Brax env 'antt'; available: .*ant"):
        E.make("antt", 2, backend="brax")


@pytest.mark.slow
def test_brax_contract_and_state() -> None:
    _brax()
    env = E.make("inverted_pendulum", 4, backend="brax", seed=0, max_episode_steps=5)
    assert env.spec.action_dim == 1 and env.spec.reward_terms == ()
    obs = env.reset(seed=0)["policy"]
    assert obs.shape == (4, env.spec.obs_dim) and obs.dtype == torch.float32
    action = torch.tensor([[3.0], [-3.0], [0.0], [0.0]])
    for t in range(1, 11):
        out = env.step(action)
        assert out.reward.dtype == torch.float32 and out.terminated.dtype == torch.bool
        assert not bool((out.terminated & out.truncated).any())
        done = out.terminated | out.truncated
        assert torch.equal(out.obs["policy"][~done], out.info["final_obs"]["policy"][~done])
        if t % 5 == 0:
            assert bool(out.truncated[2:].all())
    assert not bool(out.terminated[2:].any())
    state = env.get_state()
    first = env.step(action)
    env.set_state(state)
    torch.testing.assert_close(env.step(action).obs, first.obs, rtol=0, atol=0)


@pytest.mark.slow
def test_brax_randomization_per_world_resampled_and_checkpointed() -> None:
    _brax()
    cfg = {"body_mass": {"low": 0.3, "high": 3.0}}
    env = E.make("inverted_pendulum", 4, backend="brax", seed=0, max_episode_steps=3,
                 randomization=cfg)
    first = env.physics_params()["body_mass"].clone()
    assert bool((first[:, 1:].std(dim=0) > 0.1).all())  # every body differs across worlds
    # the same state and push in every world: the masses make them move apart
    env.set_state(env.get_state()[:1].expand(4, -1))
    out = env.step(torch.ones(4, 1))
    cart_velocity = out.obs["policy"][:, 2]
    assert float(cart_velocity.max() - cart_velocity.min()) > 1e-3
    torch.testing.assert_close(env.physics_params()["body_mass"], first)  # within the episode
    twin = E.make("inverted_pendulum", 4, backend="brax", seed=5, max_episode_steps=3,
                  randomization=cfg)
    twin.load_state_dict(env.state_dict())
    for _ in range(3):
        a, b = env.step(torch.zeros(4, 1)), twin.step(torch.zeros(4, 1))
        torch.testing.assert_close(a.obs["policy"], b.obs["policy"], rtol=0, atol=0)
    # every world was truncated (3 steps) and drew new masses
    assert bool((env.physics_params()["body_mass"][:, 1:] != first[:, 1:]).all())
    # noise, delay and pushes run through the same jitted step
    full = {**cfg, "obs_noise": 0.01, "action_noise": 0.05, "action_delay_max": 1,
            "push_velocity": 0.5, "push_interval": [1, 2]}
    env = E.make("inverted_pendulum", 4, backend="brax", seed=0, randomization=full)
    for _ in range(4):
        assert bool(torch.isfinite(env.step(torch.zeros(4, 1)).obs["policy"]).all())
    with pytest.raises(ValueError, match="randomization needs pipeline='mjx'"):
        E.make("inverted_pendulum", 2, backend="brax", pipeline="generalized", randomization=cfg)


@pytest.mark.slow
def test_ppo_runs_on_brax(tmp_path: Path) -> None:
    _brax()
    runner = _ppo_runner(tmp_path, "brax")
    runner.train()
    assert runner.global_step == 2 * 8 * 4 and len(runner.history) == 2


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["mjx", "brax", "mjx-randomized", "brax-randomized"])
def test_gpu_zero_copy_no_host_transfers(backend: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX sees no GPU")
    if backend.startswith("brax"):
        _brax()
    from torch.profiler import ProfilerActivity, profile

    options: dict[str, object] = {}
    if backend.endswith("-randomized"):  # every randomization feature, resampled on device
        backend, options["randomization"] = backend.split("-")[0], {
            **PHYSICS, "obs_noise": 0.01, "action_noise": 0.05, "action_delay_max": 2,
            "push_velocity": 0.5, "push_interval": [2, 3], "resample_interval": 2}
    env = E.make("halfcheetah", 64, backend=backend, device="cuda", **options)
    action = torch.zeros(64, env.spec.action_dim, device="cuda")
    out = env.step(action)
    assert out.obs["policy"].device.type == "cuda" and out.reward.device.type == "cuda"
    assert out.terminated.device.type == "cuda"
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            env.step(action)
        torch.cuda.synchronize()
    d2h = [e.name for e in prof.events() if "DtoH" in e.name or "Device -> Pageable" in e.name]
    assert d2h == [], d2h
