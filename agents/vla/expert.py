"""A scripted LIBERO expert that reads privileged object poses and acts through the OSC controller.

The expert sees the simulator (object and region positions), never the images: it is a
demonstrator, not a policy to evaluate against the VLA on equal terms. For every spatial goal
predicate (``in`` / ``on``) in BDDL order it runs a top-down pick-and-place: move above the
object, descend, close the gripper, lift, carry above the target region, lower, open, rise.
Position control is proportional on the end-effector position (``a = clip(gain * error)``,
the OSC controller maps 1.0 to 5 cm); orientation is held at the start pose by a
proportional term on the rotation error. Joint predicates (``turnon``, ``close``, ``open``)
and objects that must be re-oriented are not handled: tasks with them fail (see
:data:`PICK_AND_PLACE_TASKS` and ``docs/vla.md`` for the measured table).

DART-style noise: with ``noise_std > 0`` the *executed* action is the expert's plus Gaussian
noise, while the *recorded* label is the expert's clean action at the state actually reached,
so demonstrations cover recoveries from small deviations.

Classes: :class:`ScriptedExpert`, :class:`ExpertConfig`. Functions: :func:`run_expert`.
Constants: :data:`PICK_AND_PLACE_TASKS`.

Usage (a MuJoCo simulation, so not run as a doctest)::

    from wmrl_envs.libero.env import LiberoLongEnv
    env = LiberoLongEnv(task_id=7, cameras=False, max_episode_steps=600)
    result = run_expert(env, init_state=0)
    result.success, len(result.actions)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "ExpertConfig",
    "ScriptedExpert",
    "ExpertResult",
    "run_expert",
    "per_decision",
    "PICK_AND_PLACE_TASKS",
    "EXPERT_STYLES",
    "near_label_jumps",
]

#: LIBERO-Long tasks whose goal is spatial predicates only (pick-and-place with no joint to move).
PICK_AND_PLACE_TASKS = (0, 1, 4, 5, 6, 7, 8)
#: The expert's ways of moving (:attr:`ExpertConfig.style`).
EXPERT_STYLES = ("phases", "funnel")


@dataclass
class ExpertConfig:
    """Settings of :class:`ScriptedExpert`.

    Attributes:
        gain: proportional gain on the position error (1/m; the action is clipped to [-1, 1]).
        rot_gain: proportional gain on the rotation error (1/rad).
        approach_height: height above the grasp point to approach from (m).
        lift_height: carrying height above the target region's top (m).
        release_height: height of the grasp point above the target when opening (m).
        tolerance: position error that ends a move phase (m).
        grip_steps: env steps spent closing (and opening) the gripper.
        phase_timeout: most env steps per move phase before the expert moves on.
        timeout_radius: when set, a move phase's timeout counts only the steps spent within
            this distance of its goal (m): a goal the gripper cannot quite reach (an object's
            top) still ends in a grasp, while a gripper that is far off -- a policy driving,
            :mod:`agents.vla.dagger` -- is told to come back rather than to grasp where it is.
        noise_std: DART noise on the executed action (action units); 0 = none.
        attempts: passes over the goal predicates that do not hold yet (a failed grasp is retried).
        style: ``"phases"`` (a sequence of straight moves: clear, approach, align, descend,
            lift, carry, lower; the demonstrations shipped so far) or ``"funnel"`` (each
            reach is one move along a funnel, so the label is a continuous function of where
            the gripper is: see :meth:`ScriptedExpert._funnel`).
        funnel_gain: the funnel style's proportional gain on the position error (1/m): half the
            phase machine's, so that at the policy's decision rate (4 env steps) a label moves
            by less per decision (on 6 episodes of tasks 0, 1 and 5: with 12 the label of a
            continuous funnel still changes by > 0.5 between consecutive decisions on 45% of
            frames, with 6 on 20%; 4 is too slow to finish within the phase timeouts, 2/6). The
            DAgger labeller (:mod:`agents.vla.dagger`) still uses the phase machine.
        funnel_radius: x-y distance from the goal within which the funnel descends (m).
        climb: how far below the funnel the gripper may be and still move in x-y (m).
    """

    gain: float = 12.0
    rot_gain: float = 1.0
    approach_height: float = 0.10
    lift_height: float = 0.12
    release_height: float = 0.07
    tolerance: float = 0.01
    grip_steps: int = 12
    phase_timeout: int = 80
    timeout_radius: float | None = None
    noise_std: float = 0.0
    attempts: int = 2
    style: str = "phases"
    funnel_gain: float = 6.0
    funnel_radius: float = 0.08
    climb: float = 0.08

    def __post_init__(self) -> None:
        if self.style not in EXPERT_STYLES:
            raise ValueError(f"style must be one of {EXPERT_STYLES}, got {self.style!r}")


def _quat_to_rotvec(q: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> rotation vector."""
    x, y, z, w = q
    if w < 0:
        x, y, z, w = -x, -y, -z, -w
    s = np.sqrt(max(1.0 - w * w, 0.0))
    angle = 2.0 * np.arctan2(s, w)
    return np.zeros(3) if s < 1e-8 else np.array([x, y, z]) / s * angle


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )


def _quat_conj(q: np.ndarray) -> np.ndarray:
    return np.array([-q[0], -q[1], -q[2], q[3]])


class ScriptedExpert:
    """Pick-and-place by privileged poses; call :meth:`act` once per env step.

    Args:
        control_env: the library's ``ControlEnv`` (``LiberoLongEnv.sim_env``), reset to the
            episode's initial state.
        config: :class:`ExpertConfig`.
    """

    def __init__(self, control_env: Any, config: ExpertConfig | None = None):
        from wmrl_envs.libero.goals import goal_predicates

        self.env = control_env
        self.domain = control_env.env
        self.config = config or ExpertConfig()
        self.predicates = [p for p in goal_predicates(control_env) if p[0] in ("in", "on")]
        self.unsupported = [p for p in goal_predicates(control_env) if p[0] not in ("in", "on")]
        self._quat0 = self._eef_quat()
        self._target_quat = self._quat0
        self._plan: Iterator[tuple[np.ndarray, float]] = self._script()
        self.done = False
        self.phase = "start"
        self._travel_z: float | None = None  # funnel style: the height the next reach travels at

    # -- privileged reads ---------------------------------------------------------------
    def _eef_pos(self) -> np.ndarray:
        return np.array(self.domain.sim.data.site_xpos[self.domain.robots[0].eef_site_id])

    def _eef_quat(self) -> np.ndarray:
        from robosuite.utils.transform_utils import convert_quat

        mat = np.array(self.domain.sim.data.site_xmat[self.domain.robots[0].eef_site_id]).reshape(3, 3)
        import mujoco

        q = np.zeros(4)
        mujoco.mju_mat2Quat(q, mat.flatten())
        return convert_quat(q, to="xyzw")

    def _extent(self, name: str) -> tuple[np.ndarray, float, float]:
        """(x-y-z body position, bottom z, top z) of a movable object from its geoms' boxes."""
        from wmrl_envs.libero.goals import _subtree_geoms

        model, data = self.domain.sim.model, self.domain.sim.data
        body = self.domain.obj_body_id[name]
        geoms = _subtree_geoms(model, body)
        aabb = np.asarray(model.geom_aabb)
        lo, hi = np.inf, -np.inf
        for g in geoms:
            if model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0:
                continue  # visual-only geom
            rot = np.array(data.geom_xmat[g]).reshape(3, 3)
            centre = np.array(data.geom_xpos[g]) + rot @ aabb[g, :3]
            half = np.abs(rot[2]) @ aabb[g, 3:]
            lo, hi = min(lo, centre[2] - half), max(hi, centre[2] + half)
        pos = np.array(data.body_xpos[body])
        if not np.isfinite(lo):
            lo, hi = pos[2], pos[2] + 0.05
        return pos, float(lo), float(hi)

    def _yaw_of_closing_axis(self) -> float:
        data = self.domain.sim.data
        model = self.domain.sim.model
        left = np.array(data.body_xpos[model.body_name2id("gripper0_leftfinger")])
        right = np.array(data.body_xpos[model.body_name2id("gripper0_rightfinger")])
        d = left - right
        return float(np.arctan2(d[1], d[0]))

    def _grasp_quat(self, name: str) -> np.ndarray:
        """The start orientation turned about z so the fingers close across the object's
        narrow horizontal side (unchanged for round objects)."""
        model, data = self.domain.sim.model, self.domain.sim.data
        body = self.domain.obj_body_id[name]
        from wmrl_envs.libero.goals import _subtree_geoms

        aabb = np.asarray(model.geom_aabb)
        best, size = None, -1.0
        for g in _subtree_geoms(model, body):
            if model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0:
                continue
            vol = float(np.prod(aabb[g, 3:]))
            if vol > size:
                best, size = g, vol
        if best is None:
            return self._quat0
        half = aabb[best, 3:]
        rot = np.array(data.geom_xmat[best]).reshape(3, 3)
        horizontal = [(abs(rot[2, i]), i) for i in range(3)]
        axes = [i for _, i in sorted(horizontal)[:2]]  # the two most horizontal local axes
        if abs(half[axes[0]] - half[axes[1]]) < 0.005:
            return self._quat0
        short = axes[0] if half[axes[0]] < half[axes[1]] else axes[1]
        want = float(np.arctan2(rot[1, short], rot[0, short]))
        dyaw = (want - self._yaw_of_closing_axis() + np.pi / 2) % np.pi - np.pi / 2
        turn = np.array([0.0, 0.0, np.sin(dyaw / 2), np.cos(dyaw / 2)])
        return _quat_mul(turn, self._eef_quat())

    def _target(self, name: str) -> np.ndarray:
        from wmrl_envs.libero.goals import _position

        return _position(self.domain, name)

    # -- the plan -------------------------------------------------------------------------
    def _move(self, target: Callable[[], np.ndarray], gripper: float, phase: str) -> Iterator[tuple[np.ndarray, float]]:
        self.phase = phase
        radius = self.config.timeout_radius
        spent = 0
        while spent < self.config.phase_timeout:
            goal = target()
            distance = np.linalg.norm(goal - self._eef_pos())
            if distance < self.config.tolerance:
                return
            if radius is None or distance <= radius:
                spent += 1
            yield goal, gripper

    def _funnel(
        self, target: Callable[[], np.ndarray], high_z: float, gripper: float, phase: str
    ) -> Iterator[tuple[np.ndarray, float]]:
        """Reach ``target()`` along a funnel: at ``high_z`` while farther than
        :attr:`~ExpertConfig.funnel_radius` from it in x-y, descending linearly to its height
        within that radius; while the gripper is below the funnel, its x-y motion is scaled
        down linearly to nothing at :attr:`~ExpertConfig.climb` below (up first: never sweep
        low). The phase machine's goal jumps when a move ends (0 to full speed in one step,
        which a policy sees no cause for in its frames); this goal is a continuous function
        of the gripper's and the objects' positions, so the label is too."""
        self.phase = phase
        c = self.config
        spent = 0
        while spent < c.phase_timeout:
            goal, here = target(), self._eef_pos()
            distance = np.linalg.norm(goal - here)
            if distance < c.tolerance:
                return
            xy = goal[:2] - here[:2]
            # the timeout counts inside the funnel only (the travel there is as long as it is),
            # and, for a labelling expert, only near the goal
            if np.linalg.norm(xy) <= c.funnel_radius and (c.timeout_radius is None or distance <= c.timeout_radius):
                spent += 1
            funnel_z = goal[2] + min(1.0, np.linalg.norm(xy) / c.funnel_radius) * max(0.0, high_z - goal[2])
            go = float(np.clip(1.0 - (funnel_z - here[2]) / c.climb, 0.0, 1.0))
            yield np.r_[here[:2] + go * xy, funnel_z], gripper

    def _hold(self, gripper: float, steps: int, phase: str) -> Iterator[tuple[np.ndarray, float]]:
        self.phase = phase
        here = self._eef_pos()
        for _ in range(steps):
            yield here, gripper

    def _script(self) -> Iterator[tuple[np.ndarray, float]]:
        c = self.config
        for _ in range(c.attempts):
            todo = [p for p in self.predicates if not self.domain._eval_predicate(list(p))]
            if not todo:
                break
            for p in todo:
                yield from self._pick_place(p[1], p[2])
        self.phase = "done"

    def _pick_place(self, obj: str, region: str) -> Iterator[tuple[np.ndarray, float]]:
        c = self.config
        pos, bottom, top = self._extent(obj)
        grasp_dz = max(top - 0.03, bottom + 0.5 * (top - bottom)) - pos[2]  # grasp below the top
        grasp = lambda: self._extent(obj)[0] + np.array([0.0, 0.0, grasp_dz])  # noqa: E731
        if c.style == "funnel":
            yield from self._funnel_pick_place(obj, region, grasp, grasp_dz - (bottom - pos[2]))
            return
        safe_z = max(self._eef_pos()[2], grasp()[2] + c.approach_height)
        yield from self._move(lambda: np.r_[self._eef_pos()[:2], safe_z], -1.0, "clear")  # up first: never sweep
        yield from self._move(lambda: np.r_[grasp()[:2], safe_z], -1.0, "approach")
        self._target_quat = self._grasp_quat(obj)
        yield from self._move(lambda: grasp() + [0.0, 0.0, c.approach_height], -1.0, "align")
        yield from self._move(grasp, -1.0, "descend")
        yield from self._hold(1.0, c.grip_steps, "grasp")
        carry_z = max(
            self._target(region)[2] + c.lift_height + (grasp_dz - (bottom - pos[2])), self._eef_pos()[2] + 0.05
        )
        yield from self._move(lambda: np.r_[self._eef_pos()[:2], carry_z], 1.0, "lift")
        yield from self._move(lambda: np.r_[self._target(region)[:2], carry_z], 1.0, "carry")
        release_z = self._target(region)[2] + c.release_height + (grasp_dz - (bottom - pos[2])) * 0.5
        yield from self._move(lambda: np.r_[self._target(region)[:2], release_z], 1.0, "lower")
        yield from self._hold(-1.0, c.grip_steps, "release")
        yield from self._move(lambda: self._eef_pos() * [1, 1, 0] + [0, 0, carry_z], -1.0, "rise")

    def _funnel_pick_place(
        self, obj: str, region: str, grasp: Callable[[], np.ndarray], held_below: float
    ) -> Iterator[tuple[np.ndarray, float]]:
        """The ``funnel`` style: reach the grasp point, close, reach the release point, open --
        the phase machine's heights, two moves instead of seven (no rise: the next reach climbs
        out first)."""
        c = self.config
        self._target_quat = self._grasp_quat(obj)  # turns on the way instead of above the object
        # travel no lower than the last carry (which cleared the container just left) or the start
        travel_z = max(grasp()[2] + c.approach_height, self._travel_z or self._eef_pos()[2])
        yield from self._funnel(grasp, travel_z, -1.0, "reach")
        yield from self._hold(1.0, c.grip_steps, "grasp")
        carry_z = self._target(region)[2] + c.lift_height + held_below
        release = lambda: np.r_[self._target(region)[:2], self._target(region)[2] + c.release_height + held_below * 0.5]  # noqa: E731
        yield from self._funnel(release, carry_z, 1.0, "place")
        yield from self._hold(-1.0, c.grip_steps, "release")
        self._travel_z = carry_z  # no separate rise: the next reach climbs out first (its funnel starts there)

    def act(self) -> np.ndarray:
        """The expert's (clean) action for the current simulator state."""
        try:
            goal, gripper = next(self._plan)
        except StopIteration:
            self.done = True
            goal, gripper = self._eef_pos(), -1.0
        pos_err = goal - self._eef_pos()
        rot_err = _quat_to_rotvec(_quat_mul(self._target_quat, _quat_conj(self._eef_quat())))
        a = np.zeros(7, dtype=np.float32)
        gain = self.config.funnel_gain if self.config.style == "funnel" else self.config.gain
        a[:3] = np.clip(gain * pos_err, -1.0, 1.0)
        a[3:6] = np.clip(self.config.rot_gain * rot_err / 0.5, -1.0, 1.0) if self.config.rot_gain else 0.0
        a[6] = gripper
        return a


@dataclass
class ExpertResult:
    """One expert episode: the observations it acted on, its clean action labels, the outcome."""

    task_index: int
    init_state: int
    success: bool
    steps: int
    observations: list[dict[str, Any]] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    phase: str = ""


def near_label_jumps(
    actions: np.ndarray, positions: np.ndarray | None = None, threshold: float = 0.5, still: float = 0.01
) -> np.ndarray:
    """Which frames of an episode's labels ``(T, 7)`` sit within one decision of a jump: an arm
    dimension changing by more than ``threshold`` between consecutive decisions, or the
    gripper flipping. With the end-effector ``positions`` ``(T, 3)``, only jumps between two
    decisions less than ``still`` apart count: two nearly identical frames with very different
    labels, which a policy reading 64 px views cannot separate (a fast move changes the label
    quickly too, but its frames differ).

    >>> a = np.zeros((5, 7)); a[:, 6] = -1; a[3:, 2] = -1.0
    >>> near_label_jumps(a).tolist()
    [False, False, True, True, False]
    >>> moving = np.c_[np.arange(5) * 0.05, np.zeros((5, 2))]
    >>> near_label_jumps(a, moving).tolist()
    [False, False, False, False, False]
    """
    a = np.asarray(actions, dtype=float)
    jump = (np.abs(np.diff(a[:, :6], axis=0)) > threshold).any(axis=1) | (np.diff(np.sign(a[:, 6])) != 0)
    if positions is not None:
        jump &= np.linalg.norm(np.diff(np.asarray(positions, dtype=float), axis=0), axis=1) < still
    near = np.zeros(len(a), dtype=bool)
    near[1:] |= jump
    near[:-1] |= jump
    return near


def per_decision(config: ExpertConfig, action_repeat: int) -> ExpertConfig:
    """``config`` for an expert that acts once per decision of ``action_repeat`` env steps: its
    plan advances once per :meth:`ScriptedExpert.act` call, while its step counts (grip hold,
    phase timeout) are env steps.

    >>> per_decision(ExpertConfig(), 4).grip_steps, ExpertConfig().grip_steps
    (3, 12)
    """
    if action_repeat <= 1:
        return config
    return dataclasses.replace(
        config,
        grip_steps=max(1, math.ceil(config.grip_steps / action_repeat)),
        phase_timeout=max(1, math.ceil(config.phase_timeout / action_repeat)),
    )


def run_expert(
    env: Any,
    init_state: int,
    config: ExpertConfig | None = None,
    *,
    seed: int = 0,
    record: bool = False,
    max_steps: int | None = None,
    action_repeat: int = 1,
    image_size: int | None = None,
) -> ExpertResult:
    """Run the expert for one episode of ``env`` (a :class:`~wmrl_envs.libero.env.LiberoLongEnv`).

    The episode ends when the env ends it (goal reached, or its step limit), when the plan
    is done and the goal holds for 10 steps, or after ``max_steps``. Success is the env's own
    verdict (``info["success"]`` of the graded final step), never the expert's.
    ``record=True`` keeps each observation and the clean action taken on it.
    ``action_repeat`` holds each expert decision for that many env steps (the policy's
    decision rate); with ``image_size`` and an env without cameras, the recorded
    observations get the two camera views rendered at decision steps only
    (:func:`agents.vla.rollout.add_views`).
    """
    config = per_decision(config or ExpertConfig(), action_repeat)
    base = env.unwrapped
    obs, _ = env.reset(seed=seed, options={"init_state": int(init_state)})
    expert = ScriptedExpert(base.sim_env, config)
    rng = np.random.default_rng([seed, int(init_state)])
    result = ExpertResult(base.task.index, int(init_state), False, 0)
    limit = max_steps or base.config.max_episode_steps
    after_plan = 0
    ended = False
    while not ended and result.steps < limit:
        action = expert.act()
        if record:
            if image_size is not None:
                from agents.vla.rollout import add_views

                obs = add_views(env, obs, image_size)
            result.observations.append(obs)
            result.actions.append(action)
        executed = action.copy()
        if config.noise_std > 0:
            executed[:6] = np.clip(executed[:6] + rng.normal(0.0, config.noise_std, 6), -1.0, 1.0)
        for _ in range(action_repeat):
            obs, _, terminated, truncated, info = env.step(executed)
            result.steps += 1
            if terminated or truncated:
                result.success = bool(info.get("success"))
                ended = True
                break
        after_plan += expert.done * action_repeat
        if after_plan > 10:
            break
    result.phase = expert.phase
    return result
