"""The shipped client configurations under every refusal: strict never bypasses kuikproxy
(SPEC §14).

Four clients pull with the files the project ships, rendered with the test's addresses:
containerd through ``ctr images pull --hosts-dir`` and through its CRI plugin's ``PullImage``
(the kubelet's call), both with ``examples/containerd/hosts.toml``; skopeo and podman with
``examples/podman/registries.conf``. Those are the **strict** files: kuikproxy is the only path
to the registry. Their **available** siblings (``hosts-available.toml``,
``registries-available.conf``: kuikproxy a mirror, the registry itself the fallback) run
beside them. The only edit besides addresses is in the available files, whose fallback is the
registry: it speaks plain HTTP here (``PLAIN_HTTP``).

Each client of each variant names its image by a registry of its own,
``127.0.0.1:<direct port>/<scenario>/<client>-<variant>:v1``. The direct port is a
:class:`RecordingForwarder` in front of the distribution registry that records every connection
and request: it is where a client that bypassed kuikproxy — falling back, or ignoring its
configuration — would read. kuikproxy reads the registry's own port (or, when the registry says
stop, a front that answers ``429``), never the direct port. So in strict mode the direct port
must see **nothing** in any scenario; in available mode what it sees is the cost the examples'
comments state.

Every client of a scenario runs at once against one kuikproxy (each registry name is a host of
its own there, so their windows do not interfere); a scenario runs once and its tests read the
result. Each client is given the scenario's ``budget``: ``ctr --timeout``, skopeo's
``--command-timeout``, the CRI call's deadline; podman, which has no such flag, is stopped
then. A client still waiting at the end of its budget "waits". Retries are the clients' own:
containerd retries a ``429`` six times per host at once; skopeo and podman try five times
``Retry-After`` apart (skopeo's ``--retry-times 0`` turns off only its retries of a whole copy);
podman 4.3 then retries a pull that failed on a ``429`` or a connection error three times, 1 s
apart, which no flag turns off.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REGISTRY, StartProxy, require, workdir
from tests.e2e.peers import (
    EXAMPLES,
    Contact,
    CriContainerd,
    DistributionRegistry,
    Kuikproxy,
    RecordingForwarder,
    RegistryClient,
    Run,
    free_port,
    registry_block,
    render_example,
    run_at_most,
    seed,
)
from tests.e2e.test_clients import isolated_env

pytestmark = pytest.mark.e2e

CLIENTS = ("ctr", "cri", "skopeo", "podman")
VARIANTS = ("strict", "available")
SHIPPED = {
    ("containerd", "strict"): "containerd/hosts.toml",
    ("containerd", "available"): "containerd/hosts-available.toml",
    ("containers", "strict"): "podman/registries.conf",
    ("containers", "available"): "podman/registries-available.conf",
}
PLAIN_HTTP = {
    "containerd/hosts-available.toml": {
        'server = "https://registry.example:5000"': 'server = "http://registry.example:5000"'
    },
    "podman/registries-available.conf": {
        'location = "registry.example:5000"': 'location = "registry.example:5000"\ninsecure = true'
    },
}
"""The one edit made to a shipped file besides addresses: the available variants' fallback, the
registry, speaks plain HTTP here. The strict files name no registry and are used as shipped."""

THROTTLE = (429, {"Retry-After": "1"})
"""What a registry that says stop answers: to kuikproxy, and to a client that reads it directly."""

JAIL = {
    "priorityLevels": [
        {
            "name": "jail",
            "type": "Limited",
            "limited": {"nominalConcurrencyShares": 0, "limitResponse": {"type": "Reject"}},
        }
    ],
    "flowSchemas": [
        {
            "name": "everyone",
            "matchingPrecedence": 100,
            "priorityLevelConfiguration": {"name": "jail"},
            "rules": [{"operations": ["check", "copy"]}],
        }
    ],
}
"""A flow-control level with no seat that rejects: every paced read is refused ``429``."""


@dataclass(frozen=True)
class Scenario:
    budget: float
    """Seconds each client is given."""
    block: Mapping[str, Any] = field(default_factory=dict)
    """Merged into each registry's block (200 ms windows otherwise)."""
    top: Mapping[str, Any] = field(default_factory=dict)
    """Merged into kuikproxy's config."""
    allowed: bool = True
    """Whether kuikproxy's config has the clients' registries."""
    running: bool = True
    """Whether kuikproxy runs at all (else its address is a closed port)."""
    throttled: bool = False
    """Whether the registry answers ``THROTTLE`` (kuikproxy and the direct port alike)."""
    sigterm: bool = False
    """Whether kuikproxy gets SIGTERM once every client's first read is held."""


SCENARIOS = {
    "served": Scenario(budget=30),
    "maxhold": Scenario(
        budget=8,
        block={"check": {"interval": "1h", "maxHold": "300ms"}, "copy": {"interval": "1h"}},
    ),
    "flow": Scenario(budget=25, top={"flowControl": JAIL}),
    "block": Scenario(budget=20, block={"check": {"maxHold": "500ms"}}, throttled=True),
    "sigterm": Scenario(
        budget=20, block={"check": {"interval": "1h"}, "copy": {"interval": "1h"}}, sigterm=True
    ),
    "forbidden": Scenario(budget=20, allowed=False),
    "down": Scenario(budget=20, running=False),
}


@dataclass(frozen=True)
class Pull:
    """One client's pull in one variant, and what the registry's direct port got meanwhile."""

    client: str
    variant: str
    image: str
    run: Run
    connections: int
    """TCP connections the direct port accepted (a TLS hello counts, though no request does)."""
    contacts: list[Contact]
    """HTTP requests the direct port answered."""
    proxy_log: str = ""

    @property
    def ok(self) -> bool:
        return self.run.returncode == 0

    def says(self, *texts: str) -> bool:
        """Whether the client's output has any of ``texts``."""
        return any(text in self.run.output for text in texts)

    @property
    def reads(self) -> list[str]:
        """``METHOD kind`` of each request the direct port got (``HEAD manifests``...)."""
        return [f"{c.method} {_kind(c.uri)}" for c in self.contacts]

    def __str__(self) -> str:
        contacts = "\n".join(f"  {c}" for c in self.contacts) or "  (none)"
        return (
            f"{self.client} {self.variant} {self.image}\n{self.run}\n"
            f"--- direct port: {self.connections} connections, {len(self.contacts)} requests\n"
            f"{contacts}\n--- kuikproxy log ---\n{self.proxy_log}"
        )


def _kind(uri: str) -> str:
    path = uri.partition("?")[0]
    if path.rstrip("/") == "/v2":
        return "ping"
    return next((k for k in ("manifests", "blobs") if f"/{k}/" in path), "other")


Pulls = dict[tuple[str, str], Pull]


def shipped(relative: str, proxy: str, registry: str) -> str:
    """A shipped example with kuikproxy's address and the registry's name of the test."""
    edits = PLAIN_HTTP.get(relative, {})
    text = (EXAMPLES / relative).read_text()
    for old in edits:
        assert old in text, f"{relative} no longer has {old!r}: update PLAIN_HTTP"
    return render_example(relative, proxy, registry, **edits)


def test_the_strict_files_name_kuikproxy_and_nowhere_to_fall_back_to() -> None:
    """Statically: each shipped file spells the example proxy and registry as the tests
    substitute them; the strict ones give kuikproxy as the only address (containerd: ``server``
    and the one ``[host]``; containers-registries.conf: each ``location``, no mirror), the
    available ones the registry as the fallback."""
    for relative in SHIPPED.values():
        text = (EXAMPLES / relative).read_text()
        assert "127.0.0.1:7439" in text and "registry.example:5000" in text, relative
    hosts = tomllib.loads((EXAMPLES / SHIPPED["containerd", "strict"]).read_text())
    assert hosts["server"] == "http://127.0.0.1:7439"
    assert list(hosts["host"]) == ["http://127.0.0.1:7439"]
    conf = tomllib.loads((EXAMPLES / SHIPPED["containers", "strict"]).read_text())
    for registry in conf["registry"]:
        assert registry["location"].startswith("127.0.0.1:7439/"), registry
        assert "mirror" not in registry, registry
    hosts = tomllib.loads((EXAMPLES / SHIPPED["containerd", "available"]).read_text())
    assert hosts["server"] == "https://registry.example:5000"
    conf = tomllib.loads((EXAMPLES / SHIPPED["containers", "available"]).read_text())
    assert conf["registry"][0]["location"] == "registry.example:5000"
    assert conf["registry"][0]["mirror"][0]["location"].startswith("127.0.0.1:7439/")


# --- running a scenario ---------------------------------------------------------------------


@dataclass
class Deployment:
    """The peers every scenario shares, and the scenarios run so far."""

    registry: DistributionRegistry
    containerd: CriContainerd
    root: Path
    done: dict[str, Pulls] = field(default_factory=dict)

    def pulls(self, name: str) -> Pulls:
        if name not in self.done:
            self.done[name] = self._run(name, SCENARIOS[name])
        return self.done[name]

    def _run(self, name: str, scenario: Scenario) -> Pulls:
        pairs = [(client, variant) for client in CLIENTS for variant in VARIANTS]
        writer = RegistryClient(self.registry.url)
        images = {p: seed(writer, f"{name}/{p[0]}-{p[1]}", "v1") for p in pairs}
        refuse = THROTTLE if scenario.throttled else None
        with contextlib.ExitStack() as stack:
            front = stack.enter_context(RecordingForwarder(self.registry.url, refuse))
            direct = {
                p: stack.enter_context(RecordingForwarder(self.registry.url, refuse)) for p in pairs
            }
            upstream = front.url if scenario.throttled else self.registry.url
            config: dict[str, Any] = {
                "defaultRegistry": REGISTRY,
                "allowedHosts": [],
                "registries": {REGISTRY: registry_block(self.registry.url)},
                **scenario.top,
            }
            if scenario.allowed:
                for p in pairs:
                    config["registries"][direct[p].host_port] = registry_block(
                        upstream, **scenario.block
                    )
            proxy: Kuikproxy | None = None
            if scenario.running:
                proxy = stack.enter_context(
                    Kuikproxy(workdir(self.root, f"{name}-kuikproxy"), config)
                )
                address = proxy.host_port
            else:
                address = f"127.0.0.1:{free_port()}"

            work = workdir(self.root, name)
            launches = {
                p: self._client(
                    stack, workdir(work, f"{p[0]}-{p[1]}"), *p,
                    image=f"{direct[p].host_port}/{images[p].repository}:v1",
                    registry=direct[p].host_port, proxy=address, budget=scenario.budget,
                )
                for p in pairs
            }  # fmt: skip
            with ThreadPoolExecutor(len(pairs)) as pool:
                futures = {p: pool.submit(launch) for p, launch in launches.items()}
                if scenario.sigterm:
                    assert proxy is not None
                    self._wait_until_held(proxy, [direct[p].host_port for p in pairs])
                    assert proxy._process is not None
                    proxy._process.send_signal(signal.SIGTERM)
                runs = {p: future.result() for p, future in futures.items()}
            log = proxy.log() if proxy is not None else "(kuikproxy not running)"
            pulls = {}
            for p in pairs:
                connections, contacts = direct[p].snapshot()
                pulls[p] = Pull(
                    p[0], p[1], images[p].repository, runs[p], connections, contacts, log
                )
        for pull in pulls.values():  # shown with -s, and in a failing test's captured output
            last = pull.run.output.strip().splitlines()[-1:]
            print(
                f"[{name}] {pull.client} {pull.variant}: exit {pull.run.returncode} "
                f"in {pull.run.seconds:.1f}s, direct {pull.connections} {pull.reads} {last}"
            )
        return pulls

    def _client(
        self,
        stack: contextlib.ExitStack,
        here: Path,
        client: str,
        variant: str,
        *,
        image: str,
        registry: str,
        proxy: str,
        budget: float,
    ) -> Callable[[], Run]:
        """How ``client`` pulls ``image`` (named by ``registry``, its direct port) with the
        shipped file of ``variant`` naming kuikproxy at ``proxy``, working under ``here``."""
        if client in ("ctr", "cri"):
            hosts = shipped(SHIPPED["containerd", variant], proxy, registry)
            if client == "cri":
                workdir(self.containerd.certs, registry).joinpath("hosts.toml").write_text(hosts)
                return lambda: self.containerd.pull_image(image, timeout=budget)
            certs = here / "certs.d"
            workdir(certs, registry).joinpath("hosts.toml").write_text(hosts)
            args = [
                "ctr", "--address", str(self.containerd.socket), "--namespace", "e2e",
                "--timeout", f"{budget}s", "images", "pull", "--hosts-dir", str(certs),
                "--snapshotter", "native", "--platform", "linux/amd64", image,
            ]  # fmt: skip
            return lambda: run_at_most(args, budget + 10)
        conf = here / "registries.conf"
        conf.write_text(shipped(SHIPPED["containers", variant], proxy, registry))
        if client == "skopeo":
            args = [
                "skopeo", "--command-timeout", f"{budget}s", "copy", "--retry-times", "0",
                "--registries-conf", str(conf), f"docker://{image}", f"oci:{here / 'layout'}:v1",
            ]  # fmt: skip
            return lambda: run_at_most(args, budget + 10, isolated_env(here))
        # podman refuses a runroot longer than 50 characters: pytest's tmp_path can be longer.
        runroot = stack.enter_context(tempfile.TemporaryDirectory(prefix="kuik-podman-"))
        args = [
            "podman", "--root", str(here / "root"), "--runroot", runroot,
            "--tmpdir", str(here / "tmp"), "--storage-driver", "vfs",
            "--events-backend", "file", "--cgroup-manager", "cgroupfs",
            "pull", "--platform", "linux/amd64", image,
        ]  # fmt: skip
        env = isolated_env(here, CONTAINERS_REGISTRIES_CONF=str(conf))
        return lambda: run_at_most(args, budget, env)

    @staticmethod
    def _wait_until_held(proxy: Kuikproxy, hosts: list[str], timeout: float = 15) -> None:
        """Until every host has a request held for its window (a check or a queued copy)."""
        deadline = time.monotonic() + timeout
        while True:
            registries = proxy.status()["registries"]
            held = [
                h
                for h in hosts
                if registries.get(h, {}).get("check", {}).get("waiting", 0)
                + registries.get(h, {}).get("copy", {}).get("queued", 0)
            ]
            if len(held) == len(hosts):
                return
            assert time.monotonic() < deadline, f"held {held} of {hosts}\n{proxy.log()}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def deployment(
    registry: DistributionRegistry,
    cri_containerd: CriContainerd,
    tmp_path_factory: pytest.TempPathFactory,
) -> Deployment:
    for binary in ("skopeo", "podman"):
        require(binary)
    return Deployment(registry, cri_containerd, tmp_path_factory.mktemp("deployments"))


def strict(deployment: Deployment, scenario: str) -> list[Pull]:
    """The strict pulls of ``scenario``, each checked to have left the direct port alone."""
    pulls = [deployment.pulls(scenario)[client, "strict"] for client in CLIENTS]
    for pull in pulls:
        assert pull.connections == 0, pull
        assert pull.contacts == [], pull
    return pulls


def available(deployment: Deployment, scenario: str) -> dict[str, Pull]:
    """The available pulls of ``scenario``, by client."""
    return {client: deployment.pulls(scenario)[client, "available"] for client in CLIENTS}


def waited(pull: Pull) -> bool:
    """The client was still waiting when its budget ran out: stopped (podman), its own
    deadline passed (``ctr --timeout``, skopeo's ``--command-timeout``), or no CRI answer."""
    deadline = not pull.ok and pull.says("context deadline exceeded")
    return pull.run.returncode in (-9, 124) or deadline


# --- served ---------------------------------------------------------------------------------


def test_strict_pulls_are_served_through_kuikproxy_alone(deployment: Deployment) -> None:
    """Nothing refused: every client pulls with the strict file, and the direct port gets
    nothing: kuikproxy is the only path, not merely the first."""
    for pull in strict(deployment, "served"):
        assert pull.ok, pull


def test_available_pulls_are_served_through_kuikproxy_while_it_answers(
    deployment: Deployment,
) -> None:
    """Nothing refused: the available files pull through the mirror too, and the direct port
    gets nothing while kuikproxy answers 2xx."""
    for pull in available(deployment, "served").values():
        assert pull.ok, pull
        assert pull.connections == 0, pull


# --- maxHold --------------------------------------------------------------------------------


def test_strict_maxhold_refusals_fail_or_wait(deployment: Deployment) -> None:
    """``check.maxHold: 300ms``, windows an hour apart: each request is refused ``429`` with a
    ``Retry-After`` of about the hour. containerd (``ctr`` and CRI) retries a 429 six times at
    once, at ``[host]`` then at ``server`` — both kuikproxy — and fails the pull:
    ``pulling from host …: 429 Too Many Requests``; the kubelet would retry it with its own
    back-off. skopeo and podman wait ``Retry-After`` (capped at 60 s) between their five tries:
    still waiting when their budget ends. The direct port gets nothing."""
    ctr, cri, skopeo, podman = strict(deployment, "maxhold")
    for pull in (ctr, cri):
        assert not pull.ok and pull.says("429 Too Many Requests"), pull
    for pull in (skopeo, podman):
        assert waited(pull), pull


def test_available_maxhold_refusals_read_the_registry_directly(deployment: Deployment) -> None:
    """The cost: containerd (``ctr`` and CRI), refused six times, resolves the tag at the
    registry itself (a direct ``HEAD``), then fetches the content from its mirror again —
    kuikproxy holds that copy for its window, so the pull still waits, having read the
    registry unpaced. skopeo and podman keep waiting ``Retry-After`` (60 s at most, five
    tries) at the mirror: within the budget they have not fallen back yet; they read the
    registry once their tries are spent, minutes later."""
    pulls = available(deployment, "maxhold")
    for client in ("ctr", "cri"):
        pull = pulls[client]
        assert "HEAD manifests" in pull.reads, pull
        assert not pull.ok, pull
    for client in ("skopeo", "podman"):
        assert waited(pulls[client]), pulls[client]
        assert pulls[client].connections == 0, pulls[client]


# --- flow control ---------------------------------------------------------------------------


def test_strict_flow_control_refusals_fail_the_pull(deployment: Deployment) -> None:
    """A flow-control level with no seat that rejects: every paced read is refused ``429``
    (``priority level 'jail' refused the request``). containerd fails at once after its six
    immediate retries per host; skopeo after five tries ``Retry-After`` apart; podman retries
    that pull three times more and fails too (or is still retrying when its budget ends). The
    direct port gets nothing."""
    ctr, cri, skopeo, podman = strict(deployment, "flow")
    for pull in (ctr, cri):
        assert not pull.ok and pull.says("429 Too Many Requests"), pull
    assert not skopeo.ok and skopeo.says("toomanyrequests"), skopeo
    assert not podman.ok and podman.says("toomanyrequests"), podman


def test_available_flow_control_refusals_pull_from_the_registry(deployment: Deployment) -> None:
    """The cost: every client falls back and the whole pull — manifests and blobs — is read
    from the registry itself, unpaced: containerd at once, skopeo and podman after their five
    refused tries."""
    for pull in available(deployment, "flow").values():
        assert pull.ok, pull
        assert {"GET manifests", "GET blobs"} <= set(pull.reads), pull


# --- a registry that said stop --------------------------------------------------------------


def test_strict_registry_block_fails_the_pull(deployment: Deployment) -> None:
    """The registry answers ``429`` with ``Retry-After: 1``: kuikproxy blocks the host. A check
    the block outlasts past ``check.maxHold`` (500 ms) — containerd's ``HEAD`` — is refused
    ``429`` at once with the block's remaining time, and containerd (``ctr`` and CRI) fails the
    pull after its six immediate tries per host: ``429 Too Many Requests``. skopeo's and
    podman's manifest ``GET`` by tag is a copy (no ``maxHold``): it waits through the block and
    is answered the registry's own ``429`` (``toomanyrequests: slow down``, the registry's
    message); skopeo fails after five tries ``Retry-After`` apart, podman retries the pull and
    is still retrying when its budget ends. The direct port — the registry that said stop —
    gets nothing."""
    ctr, cri, skopeo, podman = strict(deployment, "block")
    for pull in (ctr, cri):
        assert not pull.ok and pull.says("429 Too Many Requests"), pull
    assert not skopeo.ok and skopeo.says("toomanyrequests"), skopeo
    assert not podman.ok, podman


def test_available_registry_block_sends_more_reads_to_the_registry(
    deployment: Deployment,
) -> None:
    """The cost: the registry that said stop gets more requests, not fewer. containerd sends it
    six ``HEAD``s per pull at once, none waiting for ``Retry-After``, all answered ``429``, and
    fails; skopeo and podman, once their five tries at the mirror are spent, send it a ping and
    five more manifest ``GET``s."""
    pulls = available(deployment, "block")
    for client in ("ctr", "cri"):
        pull = pulls[client]
        assert not pull.ok, pull
        assert pull.reads.count("HEAD manifests") >= 6, pull
        assert all(c.status == 429 for c in pull.contacts), pull
    for client in ("skopeo", "podman"):
        pull = pulls[client]
        assert not pull.ok, pull
        assert "GET manifests" in pull.reads, pull


# --- shutdown -------------------------------------------------------------------------------


def test_strict_shutdown_fails_the_pull(deployment: Deployment) -> None:
    """SIGTERM while every client's first read is held for a window an hour away: kuikproxy
    answers the held requests ``503`` at once and stops listening. Every client fails
    (``503 Service Unavailable``; containerd's second try, at ``server``, is refused a
    connection). The direct port gets nothing."""
    for pull in strict(deployment, "sigterm"):
        assert not pull.ok, pull
        assert pull.says("503", "connection refused"), pull


def test_available_shutdown_pulls_from_the_registry(deployment: Deployment) -> None:
    """The cost: on the ``503`` every client reads the whole image from the registry itself:
    a restart of kuikproxy, a rolling update, a node drain, is a burst of unpaced pulls."""
    for pull in available(deployment, "sigterm").values():
        assert pull.ok, pull
        assert "GET blobs" in pull.reads, pull


# --- a host kuikproxy does not allow --------------------------------------------------------


def test_strict_host_not_allowed_fails_the_pull(deployment: Deployment) -> None:
    """kuikproxy's config lacks the registry: ``403 DENIED`` (``host … is not allowed``). The
    pull fails and says why; the direct port gets nothing."""
    ctr, cri, skopeo, podman = strict(deployment, "forbidden")
    for pull in (ctr, cri):
        assert not pull.ok and pull.says("403 Forbidden"), pull
    for pull in (skopeo, podman):
        assert not pull.ok and pull.says("is not allowed"), pull


def test_available_host_not_allowed_pulls_from_the_registry(deployment: Deployment) -> None:
    """The cost: every pull of a registry kuikproxy was not told about succeeds — directly,
    unpaced — so the misconfiguration shows nowhere but in kuikproxy's refusals."""
    for pull in available(deployment, "forbidden").values():
        assert pull.ok, pull
        assert "GET blobs" in pull.reads, pull


# --- kuikproxy down -------------------------------------------------------------------------


def test_strict_kuikproxy_down_fails_the_pull(deployment: Deployment) -> None:
    """Nothing listens at kuikproxy's address: every client fails with ``connection
    refused`` (podman after its three retries, 1 s apart). The direct port gets nothing."""
    for pull in strict(deployment, "down"):
        assert not pull.ok and pull.says("connection refused"), pull


def test_available_kuikproxy_down_pulls_from_the_registry(deployment: Deployment) -> None:
    """The cost: while kuikproxy is away every pull reads the registry itself, unpaced. What
    it buys: the pulls succeed."""
    for pull in available(deployment, "down").values():
        assert pull.ok, pull
        assert "GET blobs" in pull.reads, pull


# --- why the strict hosts.toml has a [host] table -------------------------------------------


def test_containerd_ignores_a_hosts_toml_with_server_alone(
    registry: DistributionRegistry,
    cri_containerd: CriContainerd,
    start_proxy: StartProxy,
    tmp_path: Path,
) -> None:
    """The strict ``hosts.toml`` without its ``[host]`` table — ``server`` = kuikproxy alone —
    is rejected by containerd 1.6 (``failed to decode hosts.toml: invalid `host` tree``), which
    then pulls from the registry itself: every read reaches the direct port. The ``[host]``
    table is what makes the strict file strict."""
    image = seed(RegistryClient(registry.url), "server-alone/app", "v1")
    with RecordingForwarder(registry.url) as direct, start_proxy(registry.url) as proxy:
        text = shipped(SHIPPED["containerd", "strict"], proxy.host_port, direct.host_port)
        server_alone = text.partition("\n[host.")[0]
        assert 'server = "http://' in server_alone
        certs = tmp_path / "certs.d"
        workdir(certs, direct.host_port).joinpath("hosts.toml").write_text(server_alone)
        pull = cri_containerd.ctr(
            "images", "pull", "--hosts-dir", str(certs), "--snapshotter", "native",
            "--platform", "linux/amd64", f"{direct.host_port}/{image.repository}:v1",
        )  # fmt: skip
        connections, contacts = direct.snapshot()
    assert pull.returncode == 0, pull
    assert "invalid `host` tree" in pull.output, pull
    assert connections > 0, pull
    assert any(c.method == "GET" and "/blobs/" in c.uri for c in contacts), contacts
