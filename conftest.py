"""Collection settings for ``pytest --doctest-modules wmrl_envs wrappers agents benchmarks``
(the doctests run in CI next to ``tests/``).

Excluded from doctest collection, because importing them has side effects:

- ``wmrl_envs/sandbox/_launcher.py``: the script the sandbox runs as ``python _launcher.py
  '<json options>'``; it calls ``main()`` at import (no ``__main__`` guard, by design: it is
  never imported), which would parse pytest's argv and exec a child process.
"""

collect_ignore = ["wmrl_envs/sandbox/_launcher.py"]
