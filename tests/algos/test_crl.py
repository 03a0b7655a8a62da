"""Contrastive RL: energies and losses on hand-worked numbers, hindsight sampling, the deep
residual network, the goal-conditioned reacher, and the learner's contract."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from robotrl.algos.crl import (
    CONTRASTIVE_LOSSES,
    CRL,
    ENERGIES,
    CRLConfig,
    actor_loss,
    critic_loss,
    logsumexp_penalty,
    paired_energy,
)
from robotrl.envs import make
from robotrl.nn.residual import DeepResNet
from robotrl.storage.trajectory import TrajectoryReplay, truncated_geometric

E = math.exp


# ---------------------------------------------------------------------------- energies
def test_energies_on_hand_worked_pairs() -> None:
    phi = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    psi = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    # distances: (0,0)-(0,0) 0, (0,0)-(0,1) 1, (1,0)-(0,0) 1, (1,0)-(0,1) sqrt 2
    torch.testing.assert_close(ENERGIES["l2"](phi, psi),
                               torch.tensor([[0.0, -1.0], [-1.0, -math.sqrt(2)]]))
    torch.testing.assert_close(ENERGIES["l2_squared"](phi, psi),
                               torch.tensor([[0.0, -1.0], [-1.0, -2.0]]))
    phi = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    psi = torch.eye(2)
    torch.testing.assert_close(ENERGIES["dot"](phi, psi), phi)
    torch.testing.assert_close(ENERGIES["cosine"](phi, psi),
                               torch.tensor([[1 / math.sqrt(5), 2 / math.sqrt(5)],
                                             [3 / 5, 4 / 5]]))
    # the paired energy is the diagonal of the pairwise one, for every energy
    a, b = torch.randn(5, 3), torch.randn(5, 3)
    for name, fn in ENERGIES.items():
        torch.testing.assert_close(paired_energy(name, a, b), fn(a, b).diagonal(), msg=name)


def test_l2_energy_gradient_is_finite_at_zero_distance() -> None:
    phi = torch.zeros(2, 3, requires_grad=True)
    ENERGIES["l2"](phi, torch.zeros(2, 3)).sum().backward()
    assert torch.isfinite(phi.grad).all()


def test_contrastive_losses_on_hand_worked_logits() -> None:
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    row = [math.log(E(1) + E(2)), math.log(E(3) + E(4))]   # logsumexp over goals
    col = [math.log(E(1) + E(3)), math.log(E(2) + E(4))]   # logsumexp over state-actions
    forward = -((1 - row[0]) + (4 - row[1])) / 2
    backward = -((1 - col[0]) + (4 - col[1])) / 2
    expect = {"forward": forward, "backward": backward, "symmetric": forward + backward}
    for name, fn in CONTRASTIVE_LOSSES.items():
        assert fn(logits).item() == pytest.approx(expect[name], rel=1e-6), name
    penalty = (row[0] ** 2 + row[1] ** 2) / 2
    assert logsumexp_penalty(logits).item() == pytest.approx(penalty, rel=1e-6)
    loss, metrics = critic_loss(logits, "forward", 0.1)
    assert loss.item() == pytest.approx(forward + 0.1 * penalty, rel=1e-6)
    # row 0's largest logit is column 1 (wrong), row 1's is column 1 (right)
    assert metrics["train/accuracy"].item() == 0.5
    assert metrics["train/logits_pos"].item() == pytest.approx(2.5)
    assert metrics["train/logits_neg"].item() == pytest.approx(2.5)


def test_actor_loss_on_hand_worked_numbers() -> None:
    loss, metrics = actor_loss(torch.tensor([-1.0, -3.0]), torch.tensor([0.5, -0.5]),
                               torch.tensor(0.2))
    # mean(0.2 * 0.5 + 1, 0.2 * -0.5 + 3) = mean(1.1, 2.9)
    assert loss.item() == pytest.approx(2.0)
    assert metrics["train/entropy"].item() == pytest.approx(0.0)


def test_unknown_variants_name_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown energy 'l1'; known: l2, l2_squared, dot"):
        CRLConfig(energy="l1")
    with pytest.raises(ValueError, match="unknown contrastive_loss 'nce'; known: forward"):
        CRLConfig(contrastive_loss="nce")
    with pytest.raises(ValueError, match="critic_depth must be a positive multiple of 4"):
        CRLConfig(critic_depth=6)


# ---------------------------------------------------------------------------- hindsight sampling
def test_truncated_geometric_inverts_its_cdf() -> None:
    gamma, length = 0.5, torch.full((4,), 3)
    # F(1) = 0.5 / 0.875, F(2) = 0.75 / 0.875: u just below each edge lands on it
    u = torch.tensor([0.0, 0.5 / 0.875 - 1e-6, 0.75 / 0.875 - 1e-6, 1 - 1e-9])
    assert truncated_geometric(u, length, gamma).tolist() == [1, 1, 2, 3]
    assert truncated_geometric(torch.tensor([0.999]), torch.tensor([1]), 0.9).item() == 1
    assert truncated_geometric(torch.tensor([0.0, 0.99]), torch.tensor([4, 4]), 1.0).tolist() \
        == [1, 4]


def _filled_replay(episode_lengths: list[list[int]], steps: int, horizon: int
                   ) -> TrajectoryReplay:
    """A replay of len(episode_lengths) worlds whose obs row is (time, world, episode id)."""
    n = len(episode_lengths)
    buf = TrajectoryReplay(steps, n, 3, 1, horizon)
    ids = [[e for e, length in enumerate(lengths) for _ in range(length)]
           for lengths in episode_lengths]
    total = min(len(r) for r in ids)
    for t in range(total):
        episode = torch.tensor([100 * w + ids[w][t] for w in range(n)])
        obs = torch.stack([torch.full((n,), float(t)), torch.arange(n).float(),
                           episode.float()], 1)
        buf.add(obs, torch.zeros(n, 1), episode)
    return buf


def test_hindsight_samples_only_future_states_of_the_same_episode() -> None:
    buf = _filled_replay([[3, 5, 2, 7, 4, 9], [1, 4, 6, 3, 8, 6]], steps=16, horizon=10)
    batch = buf.sample(4000, 0.9, torch.Generator().manual_seed(0))
    obs, fut = batch["obs"], batch["future_obs"]
    assert (fut[:, 1] == obs[:, 1]).all()                    # same world
    assert (fut[:, 2] == obs[:, 2]).all()                    # same episode
    assert (fut[:, 0] > obs[:, 0]).all()                     # strictly later
    assert (fut[:, 0] - obs[:, 0] == batch["offset"]).all()
    # the buffer wrapped (28 steps into 16 rows): the oldest rows are gone
    assert obs[:, 0].min() >= 28 - 16
    # world 1's episode of length 1 (and every episode's last step) is never a start state
    last = {(w, t) for w, lengths in enumerate([[3, 5, 2, 7, 4, 9], [1, 4, 6, 3, 8, 6]])
            for t in torch.tensor(lengths).cumsum(0).sub(1).tolist()}
    assert not any((int(w), int(t)) in last for t, w in obs[:, :2].tolist())


def test_hindsight_offsets_follow_the_truncated_geometric() -> None:
    gamma, horizon = 0.8, 12
    buf = _filled_replay([[40]], steps=64, horizon=horizon)   # one long episode
    gen = torch.Generator().manual_seed(1)
    t = torch.full((20000,), 30)                             # 9 stored steps after row 30
    length = buf.future_steps(t, torch.zeros_like(t))
    assert length[0].item() == 9
    k = truncated_geometric(torch.rand(20000, generator=gen), length, gamma)
    freq = torch.bincount(k, minlength=10)[1:].double() / len(k)
    expect = torch.tensor([gamma ** (i - 1) for i in range(1, 10)], dtype=torch.float64)
    torch.testing.assert_close(freq, expect / expect.sum(), atol=0.01, rtol=0)
    # the horizon caps the look-ahead: row 0 sees at most `horizon` future steps
    assert buf.future_steps(torch.tensor([0]), torch.tensor([0])).item() == horizon


def test_replay_state_dict_round_trip_keeps_samples() -> None:
    buf = _filled_replay([[5, 9, 7, 4], [8, 8, 9]], steps=12, horizon=10)
    copy = TrajectoryReplay(12, 2, 3, 1, 10)
    copy.load_state_dict(buf.state_dict())
    a = buf.sample(64, 0.9, torch.Generator().manual_seed(3))
    b = copy.sample(64, 0.9, torch.Generator().manual_seed(3))
    # same stored rows in time order: same (time, world, episode) triples from the same draws
    assert torch.equal(a["obs"][:, 0].sort().values, b["obs"][:, 0].sort().values)
    with pytest.raises(ValueError, match="does not fit"):
        TrajectoryReplay(8, 2, 3, 1, 10).load_state_dict(buf.state_dict())


# ---------------------------------------------------------------------------- deep networks
def test_deep_resnet_of_1024_layers_is_finite_and_trains_every_block() -> None:
    torch.manual_seed(0)
    net = DeepResNet(10, 32, 1024, 8)
    assert len(net.blocks) == 256
    y = net(torch.randn(64, 10))
    y.square().mean().backward()
    assert torch.isfinite(y).all()
    norms = torch.stack([b.body[0].weight.grad.norm() for b in net.blocks])
    assert torch.isfinite(norms).all() and (norms > 0).all()
    # the identity skips carry the gradient down: the first block's gradient norm is within
    # a factor 4 of the last block's (measured 0.6-0.8 at widths 32-256)
    ratio = (norms[0] / norms[-1]).item()
    assert 0.25 < ratio < 4, ratio


def test_deep_resnet_checkpointing_gives_the_same_gradients_and_depth_is_checked() -> None:
    torch.manual_seed(0)
    net = DeepResNet(5, 16, 16, 3)
    x = torch.randn(8, 5)
    net(x).sum().backward()
    plain = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net.checkpoint = True
    net(x).sum().backward()
    for a, b in zip(plain, [p.grad for p in net.parameters()], strict=True):
        torch.testing.assert_close(a, b)
    cost = net.cost(8)
    assert cost["params"] == sum(p.numel() for p in net.parameters())
    assert cost["activation_bytes"] < DeepResNet(5, 16, 16, 3).cost(8)["activation_bytes"]
    with pytest.raises(ValueError, match="positive multiple of 4"):
        DeepResNet(5, 16, 10, 3)


# ---------------------------------------------------------------------------- the goal task
def test_reacher_goal_reports_goal_columns_distance_and_success() -> None:
    env = make("reacher_goal", 8, seed=0)
    goal = env.spec.goal
    assert goal is not None and goal.columns == (8, 9) and goal.achieved == (6, 7)
    obs = env.reset(seed=0)["policy"]
    assert obs.shape == (8, 10)
    assert (obs[:, 8:10].norm(dim=1) < 0.2).all()            # Reacher-v5's goal disc
    out = env.step(torch.zeros(8, 2))
    final = out.info["final_obs"]["policy"]
    dist = (final[:, 6:8] - final[:, 8:10]).norm(dim=1)
    torch.testing.assert_close(out.info["goal_distance"], dist.float(), atol=1e-5, rtol=0)
    assert torch.equal(out.info["success"], dist < goal.success_distance)
    assert torch.equal(out.reward, out.info["success"].float())
    # a goal placed on the fingertip is reached: write it into the target joints' state
    state = env.get_state()
    env.set_state(state)
    tip = env.observe()["policy"][:, 6:8]
    qpos_cols = slice(1 + 2, 1 + 4)                          # time, then qpos: arm 0-1, target 2-3
    state[:, qpos_cols] = tip.double()
    env.set_state(state)
    out = env.step(torch.zeros(8, 2))
    assert out.info["success"].all()


def test_crl_refuses_tasks_without_a_goal() -> None:
    env = make("reacher", 2)
    with pytest.raises(ValueError, match=r"has no goal \(the goal tasks: robotrl.envs.list_tasks\(goal=True\)\)"):
        CRL(env.spec, CRLConfig(), 2)


def test_crl_acts_learns_and_round_trips_its_state() -> None:
    torch.manual_seed(0)
    env = make("reacher_goal", 8, seed=0)
    cfg = CRLConfig(learning_starts=64, batch_size=16, critic_width=16, actor_width=16,
                    repr_dim=8, buffer_steps=64, utd_ratio=0.25)
    alg = CRL(env.spec, cfg, 8, seed=0)
    obs = env.reset(seed=0)
    metrics: dict[str, float] = {}
    for _ in range(20):
        out = env.step(alg.act(obs))
        alg.process_env_step(out.reward, out.terminated, out.truncated, out.info["final_obs"])
        obs = out.obs
        metrics = alg.update() or metrics
    # steps 8..20 (13 of them, from the one that reaches 64 transitions) earn 8 x 0.25 each
    assert alg.num_updates == 26 and math.isfinite(metrics["loss/critic"])
    assert metrics["train/goal_offset"] >= 1
    # relabelling writes the future's achieved coordinates over the goal columns
    o = torch.arange(20.0).reshape(2, 10)
    state, goal, actor_obs = alg.relabel(o, o + 100)
    assert goal.tolist() == [[106.0, 107.0], [116.0, 117.0]]
    assert actor_obs[:, 8:].tolist() == goal.tolist() and state.shape == (2, 8)
    clone = CRL(env.spec, cfg, 8, seed=1)
    clone.load_state_dict(alg.state_dict())
    x = obs["policy"]
    torch.testing.assert_close(clone.act_deterministic(x), alg.act_deterministic(x))
    torch.testing.assert_close(alg.export_actor()(x), alg.act_deterministic(x))


def test_goal_evaluation_reports_success_final_distance_and_time_to_goal() -> None:
    from robotrl.runners.evaluation import evaluate, run_episodes

    env = make("reacher_goal", 16, seed=0)
    gen = torch.Generator().manual_seed(0)

    def policy(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.rand(16, 2, generator=gen) * 2 - 1

    episodes = run_episodes(env, env.reset(seed=0), policy)
    reached, success = episodes["time_to_goal"], episodes["success"]
    assert ((reached == -1) | ((reached >= 1) & (reached <= 50))).all()
    assert not (success & (reached < 0)).any()               # success at the end was reached
    # the final distance decides success at the last step
    assert torch.equal(success, episodes["final_distance"] < env.spec.goal.success_distance)
    result = evaluate(policy, env, seed=0)
    for key in ("success", "final_distance", "reached", "time_to_goal"):
        assert key in result
    assert 0.0 <= result["success"] <= result["reached"] <= 1.0


@pytest.mark.slow  # a learning run: it must reach a threshold
def test_crl_learns_reacher_goal(tmp_path: Path) -> None:
    """Reward-free CRL reaches >= 80% success on reacher_goal in 30,720 steps (~1 min on one
    core; seeds 0-2 measured 98-99% with these settings, 4-layer networks of width 128)."""
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment.build import build_runner
    from robotrl.seeding import seed_everything

    torch.set_num_threads(1)
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "crl", "critic_width": 128, "actor_width": 128},
        "env": {"task": "reacher_goal", "options": {}}, "num_envs": 64, "total_steps": 30720,
        "logger": {"tensorboard": False, "progress": False}, "run_dir": str(tmp_path),
        "checkpoint_interval": 1000, "eval_episodes": 128, "eval_interval": 0})
    seed_everything(0)
    result = build_runner(cfg).train()
    assert result is not None and result["success"] >= 0.8, result
    assert result["final_distance"] < 0.05 and result["time_to_goal"] < 25, result


def test_crl_trains_on_the_ant_maze_and_prints_its_network_cost(tmp_path: Path) -> None:
    """`robotrl train algo=crl env=ant_umaze` plugs in: at start the run prints each network's
    parameters, FLOPs and activation memory per update; evaluation reports goal metrics."""
    from robotrl.config import TrainConfig, from_dict
    from robotrl.experiment import run_training
    from robotrl.logging import console

    torch.set_num_threads(1)
    cfg = from_dict(TrainConfig, {
        "algo": {"name": "crl", "critic_width": 32, "actor_width": 32, "critic_depth": 8,
                 "learning_starts": 256, "batch_size": 32, "buffer_steps": 512},
        "env": {"task": "ant_umaze", "options": {"max_episode_steps": 40}}, "num_envs": 8,
        "total_steps": 512, "logger": {"tensorboard": False, "progress": False},
        "run_dir": str(tmp_path), "eval_episodes": 4, "eval_interval": 0})
    with console.capture() as captured:
        result = run_training(cfg)
    out = captured.get()
    for net in ("sa_encoder", "g_encoder", "actor"):
        assert f"{net}: " in out and "GFLOP" in out and "MiB activations" in out
    assert result is not None and {"success", "final_distance", "reached"} <= result.keys()
    assert result["final_distance"] > 0
