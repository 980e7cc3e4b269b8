"""Registering with RocketMQ NameServers (``BrokerOuterAPI``, ``server.namesrv_addr``):
REGISTER_BROKER (103) with the broker's topic configs at start, 10 s later, then every 30 s
and soon after a topic changes (two-way after UPDATE_AND_CREATE_TOPIC, oneway after an
auto-create), and UNREGISTER_BROKER (104) at shutdown (waiting 3 s for each answer, as
4.9.8's broker does; registrations wait 6 s), to every NameServer of the list
(``"host:port;host:port"``; registrations to all at once, unregistrations one after another,
as 4.9.8's broker), as a master (id 0) or a slave (its id), with its HA address. Both
follow the store's role as it is at each registration (``Broker.broker_id``,
``Broker.ha_address``), and a change of either (a promotion, a demotion) registers again within
``ROLE_POLL_S``, as RocketMQ's broker registers at once when its role changes.

A registration's body is ``RegisterBrokerBody`` (``{"filterServerList":[],
"topicConfigSerializeWrapper":{"dataVersion":...,"topicConfigTable":...}}``), its header
brokerAddr, brokerName, brokerId, clusterName, haServerAddr, compressed ``false`` and
``bodyCrc32`` (the body's CRC32, sign bit dropped, which the NameServer checks). A NameServer
forgets a broker 120 s after its last registration, or when the connection that registered
it closes: each NameServer keeps one connection, opened again when it fails.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from mqstore.config import parse_listen
from mqstore.format import remoting_frame as rf
from mqstore.format import remoting_json
from mqstore.hashing import crc32
from mqstore.remoting.codes import Req, Resp

log = logging.getLogger(__name__)
FIRST_REPEAT_S = 10.0
INTERVAL_S = 30.0
ROLE_POLL_S = 1.0  # how soon a registration follows a change of role
TIMEOUT_S = 6.0  # registerBrokerTimeoutMills
UNREGISTER_TIMEOUT_S = 3.0  # BrokerOuterAPI.unregisterBroker's wait
CONNECT_TIMEOUT_S = 3.0  # NettyClientConfig.connectTimeoutMillis
MAX_RESPONSE_BYTES = 16 << 20


def addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(";") if a.strip()]
    for a in out:
        parse_listen(a)
    return out


def register_body(broker) -> bytes:
    doc = {"filterServerList": [], "topicConfigSerializeWrapper": broker.topics.wrapper_doc()}
    return remoting_json.dumps(doc).encode()


class NameServerLink:
    """One NameServer: a connection kept open, requests matched to responses by opaque."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._opaques = itertools.count(1)
        self._reading: asyncio.Task | None = None

    async def _connect(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            return
        host, port = parse_listen(self.address)
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ConnectionError(f"no connection within {CONNECT_TIMEOUT_S} s") from None
        self._reading = asyncio.ensure_future(self._read(self._reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                length = rf.frame_length(await reader.readexactly(4), MAX_RESPONSE_BYTES)
                cmd = rf.decode(await reader.readexactly(length))
                future = self._pending.pop(cmd.opaque, None)
                if cmd.is_response and future is not None and not future.done():
                    future.set_result(cmd)
        except (asyncio.IncompleteReadError, ConnectionError, rf.FrameError) as exc:
            self._fail(ConnectionError(f"NameServer {self.address}: {exc}"))
        except asyncio.CancelledError:
            self._fail(ConnectionError(f"NameServer {self.address}: closed"))
            raise

    def _fail(self, exc: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        self._writer = None

    async def call(self, cmd: rf.Command, oneway: bool = False,
                   timeout_s: float = TIMEOUT_S) -> rf.Command | None:
        await self._connect()
        cmd.opaque = next(self._opaques) & 0x7FFFFFFF
        if oneway:
            cmd.flag |= rf.ONEWAY_FLAG
        else:
            future = asyncio.get_running_loop().create_future()
            self._pending[cmd.opaque] = future
        self._writer.write(rf.encode(cmd))
        await self._writer.drain()
        if oneway:
            return None
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise asyncio.TimeoutError(f"no answer within {timeout_s} s") from None
        finally:
            self._pending.pop(cmd.opaque, None)

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass


class Registration:
    def __init__(self, broker, namesrv_addr: str) -> None:
        self.broker = broker
        self.links = [NameServerLink(a) for a in addresses(namesrv_addr)]
        self._soon: asyncio.Event | None = None
        self._oneway = True
        self._task: asyncio.Task | None = None
        self.registered = 0  # registrations answered SUCCESS, all NameServers
        self._registered_as: tuple | None = None  # (broker id, HA address) last sent

    def _identity(self) -> tuple:
        return self.broker.broker_id, self.broker.ha_address or ""

    def _header(self) -> dict[str, str]:
        b = self.broker
        return {"brokerName": b.name, "brokerAddr": b.address, "clusterName": b.cluster,
                "brokerId": str(b.broker_id)}

    def _register_commands(self) -> list[rf.Command]:
        """A REGISTER_BROKER for each NameServer, all of one snapshot of the topics (each
        command gets its connection's opaque)."""
        body = register_body(self.broker)
        broker_id, ha = self._registered_as = self._identity()
        ext = {"brokerName": self.broker.name, "brokerAddr": self.broker.address,
               "clusterName": self.broker.cluster, "brokerId": str(broker_id),
               "haServerAddr": ha, "compressed": "false", "bodyCrc32": str(crc32(body))}
        return [rf.Command(Req.REGISTER_BROKER, ext=dict(ext), body=body) for _ in self.links]

    async def register_all(self, oneway: bool = False) -> None:
        """Registers with every NameServer at once, as BrokerOuterAPI.registerBrokerAll does
        (a task each): one slow to answer, or unreachable, holds back none of the others."""
        await asyncio.gather(*(self._register(link, cmd, oneway)
                               for link, cmd in zip(self.links, self._register_commands())))

    async def _register(self, link: NameServerLink, cmd: rf.Command, oneway: bool) -> None:
        try:
            response = await link.call(cmd, oneway)
        except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
            log.warning("register broker to name server %s failed: %s", link.address, exc)
            return
        if response is None:
            return
        if response.code != Resp.SUCCESS:
            log.warning("name server %s refused the registration: code %d, %s",
                        link.address, response.code, response.remark)
            return
        self.registered += 1
        master = response.ext.get("masterAddr") if response.ext else None
        if master:
            log.info("name server %s: master of %s is %s", link.address, self.broker.name,
                     master)

    def start(self) -> None:
        self._soon = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def soon(self, oneway: bool) -> None:
        """Register again now (a topic changed)."""
        if self._soon is not None:
            self._oneway = self._oneway and oneway
            self._soon.set()

    async def _run(self) -> None:
        await self.register_all()
        wait = FIRST_REPEAT_S
        while True:
            await self._until_due(wait)
            oneway, self._oneway = self._soon.is_set() and self._oneway, True
            self._soon.clear()
            await self.register_all(oneway)
            wait = INTERVAL_S

    async def _until_due(self, wait: float) -> None:
        """Until ``wait`` seconds passed, a topic changed (``soon``) or the role did."""
        loop = asyncio.get_running_loop()
        due = loop.time() + wait
        while not self._soon.is_set() and self._identity() == self._registered_as:
            left = due - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._soon.wait(), min(left, ROLE_POLL_S))
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        """Unregister from every NameServer and close the connections."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - ending anyway
                pass
        for link in self.links:
            try:
                await link.call(rf.Command(Req.UNREGISTER_BROKER, ext=self._header()),
                                timeout_s=UNREGISTER_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
                log.warning("unregister broker from name server %s failed: %s", link.address,
                            exc)
            await link.close()


__all__ = ["Registration", "NameServerLink", "register_body", "addresses"]
