"""Rolling a run back to the last policy that wrote its format, when it collapses off it.

A small policy trained at a high learning rate can collapse off the scaffold's format: within
a few steps every reply is malformed, every group's members score the same, and GRPO has no
gradient to pull it back (the full-tier speedup protocol lost three of 25 runs that way,
``docs/results/format-collapse/``). :class:`~agents.grpo.diagnostics.SignalWatch` names such
a collapse; :class:`FormatRollback` acts on it, as a person resuming from an earlier
checkpoint would:

* before each update, when the step's replies were mostly valid (``reward/valid_rate`` >=
  ``healthy_valid_rate``), it saves the policy that wrote them and the optimiser's state;
* when the watch reports a collapse, it restores that policy and optimiser state, at most
  ``max_rollbacks`` times in a run; the loop then lowers the learning rate
  (``GRPOLoopConfig.rollback_lr_factor``: the same rate can take it to the same place).

A snapshot is one save of the trainable weights and the optimiser's state per mostly-valid
step: ~40 MB for the tiny policy, ~60 MB for SmolLM2's LoRA adapter, ~1.6 GB for all of
SmolLM2's weights (``max_rollbacks=0`` saves nothing). Only the policy and the optimiser go
back: the stack's state (anchor pairs, the calibration map), the RNG streams and the step
count do not, so nothing a real execution taught is lost and the steps spent collapsed stay
spent (and charged). Agents that do not report reply
rates (the VLA agent) never save a snapshot, so they are never rolled back.

>>> import torch
>>> class Agent:  # the two methods of agents.grpo.GRPOAgent the rollback uses
...     def __init__(self):
...         self.w = torch.nn.Parameter(torch.ones(2))
...     def save_policy(self, d):
...         torch.save({"w": self.w.detach().clone()}, d / "policy.pt")
...     def load_policy(self, d):
...         self.w.data.copy_(torch.load(d / "policy.pt")["w"])
>>> agent = Agent()
>>> opt = torch.optim.AdamW([agent.w], lr=1e-3)
>>> rollback = FormatRollback(None, max_rollbacks=1)
>>> rollback.observe(3, {"reward/valid_rate": 0.75}, agent, opt)  # a healthy step: saved
True
>>> agent.w.data.fill_(-9.0)  # what a collapse did to it  # doctest: +ELLIPSIS
tensor(...)
>>> print(rollback.restore(7, agent, opt))
step 7: rolled the policy and optimiser back to step 3 (75% valid replies)
>>> agent.w.tolist(), rollback.rollbacks
([1.0, 1.0], 1)
>>> rollback.restore(9, agent, opt) is None  # max_rollbacks spent
True
>>> rollback.close()
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

__all__ = ["FormatRollback", "RollbackAgent"]


class RollbackAgent(Protocol):
    """What :class:`FormatRollback` needs of an agent (a subset of :class:`agents.grpo.GRPOAgent`)."""

    def save_policy(self, directory: Path) -> None: ...

    def load_policy(self, directory: Path) -> None: ...


class FormatRollback:
    """Saves the last policy whose replies were mostly valid and restores it on a collapse.

    Args:
        directory: where the snapshot is kept (``output_dir/last_valid_policy`` in
            :func:`~agents.grpo.train`, so a resumed run can still roll back); ``None`` = a
            temporary directory removed by :meth:`close`.
        max_rollbacks: restores allowed in a run (0 = never restore; nothing is saved).
        healthy_valid_rate: a step whose share of valid replies reaches this is saved (the
            threshold :class:`~agents.grpo.diagnostics.SignalWatch` calls a collapse from).
        rollbacks: restores already made (a resumed run's count).
    """

    def __init__(
        self,
        directory: str | Path | None,
        *,
        max_rollbacks: int = 3,
        healthy_valid_rate: float = 0.5,
        rollbacks: int = 0,
    ) -> None:
        if max_rollbacks < 0 or not 0.0 < healthy_valid_rate <= 1.0:
            raise ValueError(
                f"need max_rollbacks >= 0 and 0 < healthy_valid_rate <= 1; got {max_rollbacks}, {healthy_valid_rate}"
            )
        self.max_rollbacks, self.healthy_valid_rate = max_rollbacks, healthy_valid_rate
        self.rollbacks = rollbacks
        self._temporary = directory is None
        # a temporary directory is made on the first save, so a run that never saves leaves nothing
        self.directory: Path | None = None if directory is None else Path(directory)

    @property
    def saved(self) -> dict[str, Any] | None:
        """``{"step", "valid_rate"}`` of the snapshot on disk, or ``None``."""
        meta = None if self.directory is None else self.directory / "snapshot.json"
        return json.loads(meta.read_text()) if meta is not None and meta.is_file() else None

    def observe(
        self, step: int, agent_metrics: Mapping[str, Any], agent: RollbackAgent, optimizer: torch.optim.Optimizer
    ) -> bool:
        """Before the update of ``step``: save the policy that wrote the step's replies when
        they were mostly valid. Returns whether it saved."""
        valid = agent_metrics.get("reward/valid_rate")
        if self.max_rollbacks == 0 or valid is None or float(valid) < self.healthy_valid_rate:
            return False
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="wmrl-rollback-"))
        # written beside and renamed, so a run killed mid-write keeps the previous snapshot
        tmp = self.directory.with_name(self.directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        agent.save_policy(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "snapshot.json").write_text(json.dumps({"step": step, "valid_rate": float(valid)}))
        shutil.rmtree(self.directory, ignore_errors=True)
        tmp.rename(self.directory)
        return True

    def restore(self, step: int, agent: RollbackAgent, optimizer: torch.optim.Optimizer) -> str | None:
        """Restore the saved policy and optimiser state (the learning rate is the caller's to
        set); what was done, or ``None`` when there is no snapshot or no rollback left."""
        saved = self.saved
        if saved is None or self.directory is None or self.rollbacks >= self.max_rollbacks:
            return None
        agent.load_policy(self.directory)
        optimizer.load_state_dict(torch.load(self.directory / "optimizer.pt", weights_only=True))
        self.rollbacks += 1
        return (
            f"step {step}: rolled the policy and optimiser back to step {saved['step']} "
            f"({100 * saved['valid_rate']:.0f}% valid replies)"
        )

    def close(self) -> None:
        """Remove a temporary snapshot directory (a named one is kept for a resume)."""
        if self._temporary and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
