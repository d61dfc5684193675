"""The MiniVLA agent: a vision-language-action policy trained by SFT on scripted demonstrations,
then by GRPO through the wrapped LIBERO-Long env (``real`` | ``wm`` | ``wmrl`` stacks).

Modules: :mod:`~agents.vla.tokenizer` (OpenVLA action bins, q01/q99 normalisation, gripper,
residual VQ chunks), :mod:`~agents.vla.model` (:class:`MiniVLAConfig`, :class:`MiniVLA`),
:mod:`~agents.vla.prismatic` (load a full-size Prismatic / MiniVLA run directory),
:mod:`~agents.vla.expert` (scripted privileged expert), :mod:`~agents.vla.demos`
(demonstrations), :mod:`~agents.vla.rollout` (closed-loop groups), :mod:`~agents.vla.sft`,
:mod:`~agents.vla.trainer` (GRPO), :mod:`~agents.vla.evaluate` (Avg / Best@8 / All@8), and the
CLI ``python -m agents.vla sft|train|evaluate|expert|demos``.

Submodules import torch / transformers / MuJoCo lazily; ``import agents.vla`` alone imports numpy only.
"""

__all__: list[str] = []
