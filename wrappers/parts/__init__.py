"""The plain pieces the wrappers are built from: no ``gymnasium`` wrapper here.

* :mod:`~wrappers.parts.scheduling` -- :class:`~wrappers.parts.scheduling.AnchorScheduler`,
  which groups are anchors (the :class:`~wrappers.AnchorWrapper`'s state machine);
* :mod:`~wrappers.parts.debiasing` -- :class:`~wrappers.parts.debiasing.OnlineDebiaser`, the
  isotonic map of Online Debiasing;
* :mod:`~wrappers.parts.denoising` -- :class:`~wrappers.parts.denoising.InverseVarianceWeighter`,
  the anchor weight of Inverse-Variance Denoising (both driven by the
  :class:`~wrappers.Calibrator`);
* :mod:`~wrappers.parts.monitor` -- the exploitation monitor's statistics over anchor groups.

Each is serialisable (``state_dict`` / ``load_state_dict`` where it has state) and usable
without an env.
"""
