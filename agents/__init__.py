"""Agents that train through the wmrl env stacks: they read what envs and wrappers put in ``info``, and talk to a stack only through :class:`wrappers.StackHandle`.

* :mod:`agents.grpo` — GRPO shared by every agent: group advantages over graded members
  (anchor-weighted, optional Dr.GRPO centring), the clipped token-level loss with optional
  KL and entropy terms, and the one training loop (:func:`agents.grpo.train`) an agent plugs
  into with select / collect / update. No LLM-specific code.
* :mod:`agents.llm` — the LLM agent: :mod:`~agents.llm.policy` (any HF causal LM; offline
  default SmolLM2-135M-Instruct), :mod:`~agents.llm.scaffolds` (raw-code and compact plan
  scaffolds), :mod:`~agents.llm.rollout` (multi-turn group rollouts), :mod:`~agents.llm.trainer`
  (``GRPOConfig`` + ``LLMAgent``), :mod:`~agents.llm.evaluate` (avg@k), and a CLI:
  ``python -m agents.llm train|evaluate``.
* :mod:`agents.vla` — the MiniVLA agent on LIBERO-Long: OpenVLA action tokens, SigLIP (+DINOv2)
  / projector / Qwen2 from ``transformers`` configs, Prismatic checkpoint loading, scripted
  expert demonstrations, SFT, GRPO through the same stacks, and a CLI:
  ``python -m agents.vla expert|demos|sft|train|evaluate`` (see ``docs/vla.md``).

Submodules import torch / transformers; ``import agents`` alone does not.
"""
