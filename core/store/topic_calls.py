"""The store's topic calls (docs/topics.md): ``MessageStore`` inherits them.

They delegate, as the facade's every call does: lookups and changes to the store's
``view.topics.Topics`` (``config/topics.json``), deletion to ``store.topic_removal``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqstore.store.topic_removal import TopicRemoval, remove_topic

if TYPE_CHECKING:
    from mqstore.consumer.service import ConsumerService
    from mqstore.format.topic_config import TopicConfig
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.view.directory_view import DirectoryView


class TopicCalls:
    # What the calls use of the store that inherits them.
    view: DirectoryView
    _parts: StoreParts
    _consumers: ConsumerService

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

        def _writable(self) -> object: ...

    def topic_config(self, name: str, create: bool = False) -> TopicConfig | None:
        """Topic ``name``'s config (``config/topics.json``, RocketMQ's ``TopicConfig``:
        ``read_queue_nums``, ``write_queue_nums``, ``perm`` ...), or None when it has none.
        ``create``: when it has none, create it as a first send would, if
        ``topics.auto_create`` allows (None when it does not). ``CorruptStateError`` when the
        file is damaged."""
        if create:
            self._writable()
        else:
            self._check_open()
        return self.view.topics.lookup(name, create)

    def topic_configs(self) -> dict[str, TopicConfig]:
        """Every topic config, by name (empty: the store has no ``config/topics.json``)."""
        self._check_open()
        return self.view.topics.all()

    def create_topic(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int = 6) -> TopicConfig:
        """Create topic ``name``: ``queues`` read and write queues (default
        ``queue_select.queues_per_topic``; ``read_queues`` / ``write_queues`` set one count)
        and ``perm`` 2 (write), 4 (read) or 6 (both). ValueError when it exists already or an
        argument breaks its rule."""
        self._writable()
        return self.view.topics.create(name, queues=queues, read_queues=read_queues,
                                       write_queues=write_queues, perm=perm)

    def update_topic(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int | None = None) -> TopicConfig:
        """Change topic ``name``'s queue counts or perm (what is not given stays); puts
        follow at once. ``TopicNotFoundError`` when it has no config."""
        self._writable()
        return self.view.topics.update(name, queues=queues, read_queues=read_queues,
                                       write_queues=write_queues, perm=perm)

    def delete_topic(self, name: str) -> TopicRemoval:
        """Delete topic ``name`` as RocketMQ's broker does: its config, consume queues and
        every group's offsets and pop state for it go; its records stay in the commit log
        until cleanup, and are never dispatched to it again. Needs the consume queues written
        in this process (``dispatch.worker: thread``); refused while live consumer instances
        read the topic (``InUseError``)."""
        self._check_open()
        return remove_topic(self._parts, self._consumers, name)
