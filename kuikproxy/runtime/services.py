"""What every host's runtime shares, handed to it by the pacer rather than reached for.

A host's parts (:mod:`~kuikproxy.runtime.host` and what it is made of) see the process through
this one object: the loop, the config and flow control in force, the registries and the way
out to them, the kept answers, the census, the sweeps, the state file, the fleet and the
wait times — nothing of the pacer itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kuikproxy.config import Config
from kuikproxy.core.limits import Census
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.egress import Egress
from kuikproxy.runtime.fleetlink import FleetLink
from kuikproxy.runtime.flights import Flights
from kuikproxy.runtime.flowgate import FlowGate
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.relayroom import RelayRoom
from kuikproxy.runtime.sweeps import Sweeps
from kuikproxy.runtime.waittimes import WaitTimes
from kuikproxy.upstream.registries import Registries

if TYPE_CHECKING:  # it is made with the services it uses (spawn)
    from kuikproxy.runtime.pullthrough import PullThrough


@dataclass(eq=False, slots=True)
class Services:
    loop: asyncio.AbstractEventLoop
    config: Config  # the config in force: a reload swaps it (P12)
    registries: Registries
    egress: Egress  # the one way a request leaves for a registry
    flow: FlowGate  # the flow control in force (§10): a reload may swap it
    kept: KeptAnswers
    census: Census
    sweeps: Sweeps
    durable: Durable | None  # where the pacing state survives restarts (P13), if anywhere
    fleet: FleetLink | None  # the proxies this one shares registries' budgets with, if any
    flights: Flights  # reads in flight, shared (R2)
    relays: RelayRoom  # the memory blob relays hold (R6)
    # how long held reads waited for their windows (kuik_proxy_wait_seconds)
    waits: WaitTimes = field(default_factory=WaitTimes)
    cache: PullThrough | None = None  # the pull-through store (§15), if one is configured
    # every task the runtime started, cancelled and awaited at shutdown
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
