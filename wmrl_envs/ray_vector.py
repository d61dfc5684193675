"""A Gymnasium vector env whose sub-envs are Ray actors: rollouts spread over a cluster.

:class:`RayVectorEnv` has the API and autoreset semantics of ``gymnasium.vector.SyncVectorEnv``
(``reset`` with ``reset_mask``, next-step / same-step / disabled autoreset, ``call``,
``get_attr``, ``set_attr``), but each sub-env lives in its own Ray actor (``num_cpus``
each), and ``reset`` / ``step`` / ``call`` / ``set_attr`` go to all actors at once and wait
for all of them, so the sub-envs step in parallel on whichever nodes hold them.

The suite's vector wrappers work on it unchanged: ``VectorWorldModelWrapper`` still calls
its world model once per vector step *in the driver* (``call("pending_grading_request")``,
then one batched ``predict``, then ``set_attr("pending_outcome", ...)``), and sub-envs that
grade for real (anchor groups) do so inside their actors, in parallel.

A sub-env is stateful, so a lost actor is not retried: the next call raises
:class:`SubEnvLost` naming the sub-env (rebuild the vector env; the trainer's checkpoint
holds everything worth keeping).

Example (starts a local Ray instance, so not run as a doctest)::

    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack
    from wmrl_envs.world_models import CodeOutcomeModel

    env = make_vector_env("wmrl/AutoResearch-v0", 8, vectorization="ray", split="train", max_turns=1)  # 8 actors
    env = build_stack(env, "wmrl", CodeOutcomeModel.load_default())     # the same wrappers
    # on a cluster: ray_options={"address": "auto"} or RAY_ADDRESS=HEAD:6379

Classes: :class:`RayVectorEnv`, :class:`EnvFactory`, :class:`SubEnvLost`. Build it with the
suite's one factory, :func:`wmrl_envs.vector.make_vector_env` (``vectorization="ray"``).
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

__all__ = ["RayVectorEnv", "EnvFactory", "SubEnvLost"]


class SubEnvLost(RuntimeError):
    """A sub-env's Ray actor died (its node or worker went away); its episode is lost."""


class EnvFactory:
    """A picklable ``gym.make(env_id, **kwargs)`` that first imports the suite (registering
    its ids) in the process where it runs.

    >>> EnvFactory("wmrl/AutoResearch-v0", split="train")().unwrapped.__class__.__name__
    'AutoResearchEnv'
    """

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        self.env_id = env_id
        self.kwargs = kwargs

    def __call__(self) -> gym.Env:
        import wmrl_envs  # noqa: F401  (registers the env ids in this process)

        return gym.make(self.env_id, **self.kwargs)


class _SubEnv:
    """The actor body: one env and the per-env half of SyncVectorEnv's autoreset logic."""

    def __init__(self, env_fn: Callable[[], gym.Env], autoreset_mode: str) -> None:
        self.env = env_fn()
        self.mode = AutoresetMode(autoreset_mode)
        self.needs_reset = False  # next-step mode: the previous step ended the episode

    def spaces(self) -> tuple[Any, Any, dict[str, Any], str | None]:
        return self.env.observation_space, self.env.action_space, dict(self.env.metadata), self.env.render_mode

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        self.needs_reset = False
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any], tuple[Any, Any] | None]:
        """``(obs, reward, terminated, truncated, info, final)``; ``final`` = ``(final_obs,
        final_info)`` when same-step autoreset just restarted the episode."""
        if self.mode == AutoresetMode.NEXT_STEP and self.needs_reset:
            obs, info = self.env.reset()
            self.needs_reset = False
            return obs, 0.0, False, False, info, None
        if self.mode == AutoresetMode.DISABLED and self.needs_reset:
            raise RuntimeError("autoreset is disabled and this sub-env's episode ended: reset it first")
        obs, reward, terminated, truncated, info = self.env.step(action)
        final = None
        if terminated or truncated:
            if self.mode == AutoresetMode.SAME_STEP:
                final = (obs, info)
                obs, info = self.env.reset()
            else:
                self.needs_reset = True
        return obs, float(reward), bool(terminated), bool(truncated), info, final

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        attr = self.env.get_wrapper_attr(name)
        return attr(*args, **kwargs) if callable(attr) else attr

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv):
    """``num_envs`` sub-envs as Ray actors behind the ``SyncVectorEnv`` API.

    Args:
        env_fns: picklable callables that create the sub-envs (run inside the actors;
            :class:`EnvFactory` for registered ids).
        autoreset_mode: as Gymnasium's vector envs (default next-step).
        num_cpus: CPUs each actor reserves in Ray's scheduler.
        address: Ray cluster to join; ``None``: ``$RAY_ADDRESS``, else a local instance
            (:func:`wmrl_envs.ray_cluster.ensure_ray`).
        local_cpus: CPUs of a local instance started here (default: all).
        copy: return copies of the batched observations (as ``SyncVectorEnv``).
        actor_options: more ``ray.remote`` options of the actors (``resources=``,
            ``scheduling_strategy="SPREAD"``, ``memory=``, ...).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        num_cpus: float = 1.0,
        address: str | None = None,
        local_cpus: int | None = None,
        copy: bool = True,
        actor_options: Mapping[str, Any] | None = None,
    ) -> None:
        from wmrl_envs.ray_cluster import ensure_ray

        if not env_fns:
            raise ValueError("RayVectorEnv needs at least one env_fn")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self._ray = ensure_ray(address, num_cpus=local_cpus)
        actor_cls = self._ray.remote(_SubEnv)
        options = {"num_cpus": num_cpus, "max_restarts": 0, **(actor_options or {})}
        self.actors = [actor_cls.options(**options).remote(fn, self.autoreset_mode.value) for fn in env_fns]
        self.num_envs = len(self.actors)
        self.copy = copy
        spaces = self._get([a.spaces.remote() for a in self.actors])
        obs_space, act_space, metadata, render_mode = spaces[0]
        for i, (o, a, _, _) in enumerate(spaces):
            if o != obs_space or a != act_space:
                raise RuntimeError(
                    f"sub-env {i}'s spaces differ from sub-env 0's ({o}, {a} vs {obs_space}, {act_space})"
                )
        self.metadata = {**metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = render_mode
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self._observations: Any = create_empty_array(obs_space, n=self.num_envs, fn=np.zeros)
        self._closed_actors = False

    # -- plumbing ------------------------------------------------------------------------
    def _get(self, refs: list[Any], which: Sequence[int] | None = None) -> list[Any]:
        """``ray.get`` of one ref per sub-env; a dead actor becomes :class:`SubEnvLost`."""
        ray = self._ray
        out = []
        for k, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as e:
                i = k if which is None else which[k]
                raise SubEnvLost(f"sub-env {i}'s Ray actor died ({type(e).__name__}); its episode is lost") from e
            except ray.exceptions.RayTaskError as e:  # the env's own exception: re-raise it as is
                raise e.as_instanceof_cause() from None
        return out

    def _batch(self, obs: list[Any]) -> Any:
        self._observations = concatenate(self.single_observation_space, obs, self._observations)
        return copy_module.deepcopy(self._observations) if self.copy else self._observations

    # -- the VectorEnv API -----------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        seeds: list[int | None]
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed list has {len(seeds)} entries for {self.num_envs} sub-envs")
        options = dict(options) if options is not None else None
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray) or mask.shape != (self.num_envs,) or mask.dtype != np.bool_:
                raise ValueError(f"options['reset_mask'] must be a bool array of shape ({self.num_envs},)")
            if not mask.any():
                raise ValueError("options['reset_mask'] must select at least one sub-env")
        which = np.flatnonzero(mask).tolist()
        results = self._get([self.actors[i].reset.remote(seeds[i], options) for i in which], which)
        obs = (
            list(iterate(self.observation_space, self._observations))
            if len(which) < self.num_envs
            else [None] * self.num_envs
        )
        infos: dict[str, Any] = {}
        for i, (o, info) in zip(which, results):
            obs[i] = o
            infos = self._add_info(infos, info, i)
        return self._batch(obs), infos

    def step(self, actions: Any):
        refs = [actor.step.remote(a) for actor, a in zip(self.actors, iterate(self.action_space, actions))]
        results = self._get(refs)
        obs: list[Any] = []
        infos: dict[str, Any] = {}
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        for i, (o, r, term, trunc, info, final) in enumerate(results):
            obs.append(o)
            rewards[i], terminations[i], truncations[i] = r, term, trunc
            if final is not None:
                infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, i)
            infos = self._add_info(infos, info, i)
        return self._batch(obs), rewards, terminations, truncations, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call (or read) ``name`` on every sub-env, in parallel; one result per sub-env."""
        return tuple(self._get([a.call.remote(name, args, kwargs) for a in self.actors]))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set ``name`` on every sub-env: one value each (a list/tuple), or the same value."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr needs {self.num_envs} values, got {len(values)}")
        self._get([a.set_attr.remote(name, v) for a, v in zip(self.actors, values)])

    def render(self) -> tuple[Any, ...]:
        return tuple(self._get([a.render.remote() for a in self.actors]))

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed_actors:
            return
        self._closed_actors = True
        ray = self._ray
        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
                pass
            ray.kill(actor)
