"""A plugin whose dispatcher ``failing`` raises "index backend unreachable" on every batch
(but as a follower): a dispatch that keeps failing. Loaded by name (``plugins.modules:
[failing_dispatcher_plugin]``): tests/support is on the path of the test process and of the
worker processes it spawns."""

from mqstore import hookimpl


class Failing:
    def __init__(self, view, role):
        self.role = role

    def dispatch(self, batch):
        if self.role != "follower":
            raise RuntimeError("index backend unreachable")

    def close(self):
        pass


@hookimpl
def register_dispatchers(registry):
    registry.add("failing", Failing)
