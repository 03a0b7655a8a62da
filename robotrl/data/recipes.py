"""How ``robotrl dataset collect`` records: the recipes, and the published reference scores.

``mean-noise`` (the default, the v0 suite's recipe): the behaviour checkpoint's deterministic
mean action plus Gaussian noise of ``noise`` (0.1) of the action half-range; ``random`` is
uniform in the bounds; ``medium-expert`` is half medium, half expert (``steps`` in all);
reference scores are measured here (a uniform-random policy, the expert's mean).

``d4rl`` (the field's recipe, that of D4RL's MuJoCo datasets and Minari's ``mujoco/``):
the behaviour policy is a SAC agent, and every recorded action is drawn from its stochastic
policy (no noise added); ``random`` is the untrained agent (the expert's configuration, freshly
initialized), ``medium`` an agent stopped early at about a third of the expert's return,
``medium-replay`` everything that agent's run saw until then (its replay), ``expert`` the fully
trained agent, and ``medium-expert`` the medium and the expert data, ``steps`` of each (2M for
D4RL's 1M + 1M). Reference scores are D4RL's published ones where D4RL has the task (so that a
normalized score reads beside the literature's; the card's ``reference`` says so), else
measured as in ``mean-noise``.
"""

from __future__ import annotations

RECIPES: tuple[str, ...] = ("mean-noise", "d4rl")
"""Recording recipes, the default first."""

D4RL_REFERENCE: dict[str, tuple[float, float]] = {
    "hopper": (-20.272305, 3234.3),
    "halfcheetah": (-280.178953, 12135.0),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}
"""(REF_MIN_SCORE, REF_MAX_SCORE) of D4RL's MuJoCo locomotion tasks (``d4rl/infos.py``: a
random policy's and a SAC expert's returns on the -v2 tasks), the normalization every published
D4RL table (CORL's included) uses; keyed by robotrl's task name."""

D4RL_REFERENCE_SOURCE = "D4RL's published REF_MIN_SCORE/REF_MAX_SCORE (d4rl/infos.py)"


def published_reference(task: str) -> tuple[float, float] | None:
    """D4RL's (min, max) reference returns for ``task``, or None where D4RL has no such task."""
    return D4RL_REFERENCE.get(task)
