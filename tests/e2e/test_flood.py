"""A flood of every client-fillable dimension at once against kuikproxy as a process, before the
distribution registry, with a small memory budget and no other bound written (R6): the process
stays under its budget, a kept answer is still served within 100 ms, and every bound that
refuses was reached and its refusals counted by reason in ``/status``.

The flood is ``bench/flood.py``'s (its docstring says what each dimension sends), at the size of
the smallest budget the config accepts but a little: the bench runs the chart's 512Mi.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from bench.flood import (
    BIG_REPO,
    LIMIT_REASONS,
    TARGET_HEAD_MS,
    Plan,
    bounds_of,
    first_probes,
    flood,
    flood_config,
    proc_status,
    raise_nofile,
    refusals_of,
    sampling,
    seed,
    table,
)
from bench.proxy import push_big_blob
from kuikproxy.core.memorybudget import Bound
from tests.e2e.conftest import StartProxy
from tests.e2e.peers import DistributionRegistry, Kuikproxy

pytestmark = pytest.mark.e2e

MEMORY = "96Mi"  # 80Mi leaves the bounds less than one item each: the config refuses it
MiB = 1024 * 1024
KEPT = (Bound.KEPT_BYTES, Bound.KEPT_ENTRIES, Bound.REFUSALS)
"""The bounds that evict rather than refuse: what they hold never passes them."""


@pytest.fixture
def flooded_proxy(registry: DistributionRegistry, start_proxy: StartProxy) -> Iterator[Kuikproxy]:
    raise_nofile()  # a socket per held request, here and in kuikproxy
    with start_proxy(registry.url, top=flood_config(registry.url, MEMORY, flood_hosts=2)) as proxy:
        yield proxy


def test_a_flood_of_every_bound_at_once_stays_in_the_budget_and_is_counted(
    registry: DistributionRegistry, flooded_proxy: Kuikproxy
) -> None:
    proxy = flooded_proxy
    bounds = bounds_of(proxy.status())
    plan = Plan(bounds, over=1.2, manifest_bytes=4096, flood_hosts=2, slow_readers=10,
                pipelines=4, pipelined=200)  # fmt: skip
    seed(registry, plan.tags, plan.manifest_bytes)
    digest = push_big_blob(registry.url, BIG_REPO, 8)
    assert first_probes(proxy.port)

    with sampling(proxy.workdir, proxy.pid, proxy.port) as sampled:
        done = asyncio.run(flood(proxy.port, plan, digest, hold_for=3.0))
        figures = sampled()
    final = proxy.status()
    report = "\n".join(table(plan, done, figures, final)) + "\n" + json.dumps(figures["peaks"])
    print(report)  # shown with -rP: what the flood saw

    memory = final["budget"]["memory"]
    # the kernel's queues of its sockets are the pod's memory too (its cgroup is charged)
    assert proc_status(proxy.pid)["VmHWM"] * 1024 + figures["queued_bytes"] < memory, report
    assert max(figures["head_ms"]) < TARGET_HEAD_MS, report
    assert set(figures["probe_statuses"]) == {"200"}, report
    refusals = refusals_of(final)
    for bound, reason in LIMIT_REASONS.items():
        assert figures["peaks"][str(bound)] == bounds[str(bound)]["limit"], (bound, report)
        assert refusals[reason] > 0, (reason, report)
    for bound in KEPT:
        assert figures["peaks"][str(bound)] <= bounds[str(bound)]["limit"], (bound, report)
    assert figures["peaks"][str(Bound.REFUSALS)] == bounds[str(Bound.REFUSALS)]["limit"], report
