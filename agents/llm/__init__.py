"""LLM GRPO agent: policy (causal LM), scaffolds (text -> env action), trainer, evaluation.

Modules: :mod:`agents.llm.policy`, :mod:`agents.llm.scaffolds`, :mod:`agents.llm.trainer`,
:mod:`agents.llm.evaluate`. Heavy imports (torch, transformers) load with the submodules.
"""
