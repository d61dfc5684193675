"""Docker sandbox backend (work in progress: lands in the next commit)."""

from wmrl_envs.sandbox.base import SandboxUnavailable

__all__ = ["DockerExecutor"]


class DockerExecutor:
    """Not usable yet: the next commit implements it."""

    def __init__(self, *args, **kwargs):
        raise SandboxUnavailable("DockerExecutor is not implemented yet in this revision; use LocalExecutor")
