"""Privileged access to a LIBERO task's goal: progress labels and goal placement.

Everything here reads or writes the *simulator state* of a live LIBERO env, which a policy
or a world model never sees. Two uses:

* :func:`privileged_progress` — the label a learned progress model is trained on: the
  fraction of the task's BDDL goal predicates that hold, softened by how close each task
  object is to its goal region.
* :func:`achieve_goal` — drive the scene into a state that satisfies the goal through the
  simulator (objects carried into their goal regions, articulated joints moved), used to
  test success detection and to log successful trajectories without a trained policy.

All functions take the library's ``ControlEnv`` (``LiberoLongEnv.sim_env``).

Classes: :class:`PrivilegedProgress`. Functions: :func:`goal_predicates`,
:func:`privileged_progress`, :func:`achieve_goal`, :func:`settle`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "PrivilegedProgress",
    "goal_predicates",
    "privileged_progress",
    "achieve_goal",
    "settle",
    "DISTANCE_SCALE",
    "PARTIAL_WEIGHT",
]

#: Distance (m) at which a spatial predicate's partial credit reaches zero.
DISTANCE_SCALE = 0.5
#: Largest partial credit an unsatisfied spatial predicate gets (object on top of its region).
PARTIAL_WEIGHT = 0.5
_SPATIAL = ("in", "on")
# Penetration (m) tolerated when searching for a collision-free drop height.
_PENETRATION_TOL = 2e-3


@dataclass(frozen=True)
class PrivilegedProgress:
    """Goal progress of one simulator state.

    Attributes:
        predicates: the goal predicates, e.g. ``("in", "alphabet_soup_1", "basket_1_contain_region")``.
        holds: whether each predicate holds.
        distances: distance (m) of the predicate's object to its target for spatial
            predicates (``in`` / ``on``), ``None`` for joint predicates (``turnon``, ``close``...).
        progress: mean over predicates of 1 when it holds, else
            ``PARTIAL_WEIGHT * clip(1 - distance / DISTANCE_SCALE, 0, 1)`` (0 for joint
            predicates); exactly 1.0 iff every predicate holds.
        success: the simulator's own success check.
    """

    predicates: tuple[tuple[str, ...], ...]
    holds: tuple[bool, ...]
    distances: tuple[float | None, ...]
    progress: float
    success: bool


def _domain(control_env: Any) -> Any:
    return control_env.env


def goal_predicates(control_env: Any) -> list[tuple[str, ...]]:
    """The task's goal as a list of BDDL predicates (lower-case names)."""
    return [tuple(str(x).lower() for x in p) for p in _domain(control_env).parsed_problem["goal_state"]]


def _position(domain: Any, name: str) -> np.ndarray:
    if name in domain.object_sites_dict:
        return np.array(domain.sim.data.get_site_xpos(name))
    return np.array(domain.sim.data.body_xpos[domain.obj_body_id[name]])


def privileged_progress(control_env: Any) -> PrivilegedProgress:
    """Progress label of the current simulator state (reads state only)."""
    domain = _domain(control_env)
    preds = goal_predicates(control_env)
    holds, distances, credit = [], [], []
    for p in preds:
        ok = bool(domain._eval_predicate(list(p)))
        d = float(np.linalg.norm(_position(domain, p[1]) - _position(domain, p[2]))) if p[0] in _SPATIAL else None
        holds.append(ok)
        distances.append(d)
        if ok:
            credit.append(1.0)
        elif d is not None:
            credit.append(PARTIAL_WEIGHT * float(np.clip(1.0 - d / DISTANCE_SCALE, 0.0, 1.0)))
        else:
            credit.append(0.0)
    return PrivilegedProgress(
        predicates=tuple(preds),
        holds=tuple(holds),
        distances=tuple(distances),
        progress=float(np.mean(credit)) if credit else 0.0,
        success=bool(domain._check_success()),
    )


def _joint_names(domain: Any, name: str) -> list[str]:
    if name in domain.object_sites_dict:
        return list(domain.object_sites_dict[name].joints)
    return list(domain.get_object(name).joints)


def _subtree_geoms(model: Any, root_body: int) -> np.ndarray:
    bodies = {root_body}
    for b in range(model.nbody):  # parents precede children in MuJoCo's body order
        if int(model.body_parentid[b]) in bodies:
            bodies.add(b)
    return np.flatnonzero(np.isin(model.geom_bodyid, list(bodies)))


def _penetration(domain: Any, geoms: np.ndarray) -> float:
    """Deepest penetration (m, >= 0) of any contact involving ``geoms``."""
    data = domain.sim.data
    deepest = 0.0
    for i in range(data.ncon):
        c = data.contact[i]
        if c.geom1 in geoms or c.geom2 in geoms:
            deepest = max(deepest, -float(c.dist))
    return deepest


def _joint_goal(domain: Any, predicate: tuple[str, ...]) -> dict[str, float]:
    """Joint values satisfying a unary joint predicate, found by scanning the joint range."""
    name = predicate[1]
    joints = _joint_names(domain, name)
    model, data = domain.sim.model, domain.sim.data
    saved = {j: float(data.get_joint_qpos(j)) for j in joints}
    ranges = [model.jnt_range[model.joint_name2id(j)] for j in joints]
    candidates = np.linspace(0.0, 1.0, 41)
    try:
        for c in candidates:
            values = {j: float(lo + c * (hi - lo)) for j, (lo, hi) in zip(joints, ranges)}
            for j, v in values.items():
                data.set_joint_qpos(j, v)
            domain.sim.forward()
            if domain._eval_predicate(list(predicate)):
                return values
    finally:
        for j, v in saved.items():
            data.set_joint_qpos(j, v)
        domain.sim.forward()
    raise RuntimeError(f"no value in the joint range of {name!r} satisfies {predicate}")


def _open_goal(domain: Any, name: str) -> dict[str, float] | None:
    """Joint values that open ``name`` (a drawer or door hosting a goal region), if it opens."""
    try:
        return _joint_goal(domain, ("open", name))
    except (RuntimeError, AssertionError, NotImplementedError):
        return None


def _step_joints(control_env: Any, values: dict[str, float], frames: int) -> Iterator[None]:
    """Move joints to ``values`` in ``frames`` increments, one control step of physics each."""
    data = _domain(control_env).sim.data
    start = {j: float(data.get_joint_qpos(j)) for j in values}
    for f in range(1, frames + 1):
        for j, v in values.items():
            data.set_joint_qpos(j, start[j] + (v - start[j]) * f / frames)
            data.set_joint_qvel(j, 0.0)
        settle(control_env, 1)
        yield


def _drop_height(domain: Any, joint: str, geoms: np.ndarray, qpos: np.ndarray, floor: float) -> float:
    """Lowest collision-free height for the object at ``qpos``'s x-y, searching up from ``floor``."""
    sim = domain.sim
    for z in floor + np.arange(0.0, 0.4, 0.005):
        qpos[2] = z
        sim.data.set_joint_qpos(joint, qpos)
        sim.forward()
        if _penetration(domain, geoms) <= _PENETRATION_TOL:
            return float(z)
    return float(floor + 0.4)


def achieve_goal(
    control_env: Any,
    *,
    move_frames: int = 12,
    settle_steps: int = 8,
    num_predicates: int | None = None,
    offsets: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.03, 0.0), (-0.03, 0.0), (0.0, 0.03), (0.0, -0.03)),
) -> Iterator[None]:
    """Drive the scene into a goal-satisfying state through the simulator, frame by frame.

    A generator: it yields after every simulated frame so a caller can log the trajectory.
    For each goal predicate in BDDL order (the first ``num_predicates`` of them, all by
    default): a spatial one (``in`` / ``on``) carries its object along a lifted straight path
    to above its target, lowers it to the lowest collision-free height and lets physics
    settle it, retrying at small x-y ``offsets`` until the predicate holds; a joint one
    (``close``, ``turnon``...) moves the joint into the satisfying range. A drawer or door
    whose region receives an object is opened first and closed by its own predicate.

    Not every task is solvable this way (objects that must be re-oriented, e.g. a book
    stood up in a caddy); check :func:`privileged_progress` afterwards.

    Usage, on a :class:`~wmrl_envs.libero.env.LiberoLongEnv` (a MuJoCo simulation, so not
    run as a doctest)::

        for _ in achieve_goal(env.unwrapped.sim_env):
            pass
    """
    domain = _domain(control_env)
    sim = domain.sim
    preds = goal_predicates(control_env)[: num_predicates if num_predicates is not None else None]
    hosts = {p[2] for p in preds if p[0] in _SPATIAL} & {p[1] for p in preds if p[0] not in _SPATIAL}
    for host in sorted(hosts):
        opened = _open_goal(domain, host)
        if opened:
            yield from _step_joints(control_env, opened, move_frames)
    for p in preds:
        if p[0] not in _SPATIAL:
            yield from _step_joints(control_env, _joint_goal(domain, p), move_frames)
            continue
        joint = domain.get_object(p[1]).joints[-1]
        geoms = _subtree_geoms(sim.model, domain.obj_body_id[p[1]])
        for dx, dy in offsets:
            start = np.array(sim.data.get_joint_qpos(joint), dtype=float)
            target = _position(domain, p[2]) + np.array([dx, dy, 0.0])
            lifted = max(start[2], target[2]) + 0.15
            goal = start.copy()
            goal[:2] = target[:2]
            drop = _drop_height(domain, joint, geoms, goal.copy(), target[2]) + 0.005
            sim.data.set_joint_qpos(joint, start)
            waypoints = [
                (start[:3], np.r_[start[:2], lifted]),
                (np.r_[start[:2], lifted], np.r_[target[:2], lifted]),
                (np.r_[target[:2], lifted], np.r_[target[:2], drop]),
            ]
            for a, b in waypoints:
                for f in range(1, move_frames + 1):
                    pose = start.copy()
                    pose[:3] = a + (b - a) * f / move_frames
                    sim.data.set_joint_qpos(joint, pose)
                    sim.data.set_joint_qvel(joint, np.zeros(6))
                    sim.forward()
                    yield
            for _ in range(settle_steps):
                settle(control_env, 1)
                yield
            if domain._eval_predicate(list(p)):
                break


def settle(control_env: Any, steps: int = 10) -> None:
    """Advance the physics ``steps`` control steps with the arm holding still."""
    hold = np.zeros(7)
    hold[-1] = -1.0  # gripper open
    for _ in range(steps):
        control_env.step(hold)
