"""The effective settings of a config as text, for ``kuikproxy check-config`` (SPEC §7.1).

What an operator needs is what each host will *actually* run with once ``default`` is merged
in, so every configured host is printed in full, then the default that every other host gets.
Credentials are shown by where they come from (file paths), never by content (R5). Flow control
is shown as the effective levels and schemas (the built-in baseline with the file's on top, each
marked built-in or replacing one) in matching order; seat counts (NominalCL...) depend on the
running set of levels and are in ``/status``, not here.
"""

from __future__ import annotations

from kuikproxy.config.flowsettings import FlowControl
from kuikproxy.config.models import DEFAULT_BLOCK, Config
from kuikproxy.config.quotas import QuotaSettings
from kuikproxy.config.registry import RegistrySettings
from kuikproxy.core.flowcontrol import (
    BUILTIN_FLOW_SCHEMAS,
    BUILTIN_PRIORITY_LEVELS,
    FlowRule,
    FlowSchema,
    PriorityLevel,
)
from kuikproxy.core.rates import exceeds, first_pull, pacing_rates, quota_rate
from kuikproxy.durations import format_duration

__all__ = ["describe"]


def _limit(seconds: float) -> str:
    # 0 means "no limit" for timeouts and maxHold; say so rather than print a bare "0s".
    return "none" if seconds == 0 else format_duration(seconds)


def _size(size: int) -> str:
    for suffix, scale in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{suffix}"
    return str(size)


def _registry(title: str, host: str | None, settings: RegistrySettings) -> list[str]:
    check, copy, tls = settings.check, settings.copy, settings.tls
    upstream = settings.upstream_url(host) if host is not None else "https://<host>"
    if host is None and settings.upstream is None:
        upstream += " (docker.io: https://registry-1.docker.io)"
    lines = [
        title,
        f"  upstream: {upstream}",
        f"  paced: {'yes' if settings.paced else 'no (passed through, never paced)'}",
        f"  check: interval {format_duration(check.interval)}, timeout {_limit(check.timeout)}, "
        f"mode {check.mode}, maxHold {_limit(check.max_hold)}, "
        f"followUp {format_duration(check.follow_up)}",
        f"  copy: interval {format_duration(copy.interval)}, timeout {_limit(copy.timeout)}, "
        f"idle {format_duration(copy.idle)}, followUp {format_duration(copy.follow_up)}",
    ]
    credentials = settings.credentials
    if credentials is None:
        lines.append("  credentials: none (anonymous, or the client's own)")
    elif credentials.docker_config_file is not None:
        lines.append(f"  credentials: dockerConfigFile {credentials.docker_config_file}")
    else:
        lines.append(
            f"  credentials: username {credentials.username}, "
            f"passwordFile {credentials.password_file}"
        )
    tls_parts = [f"caFile {tls.ca_file}"] if tls.ca_file else ["system roots"]
    if tls.insecure_skip_verify:
        tls_parts.append("INSECURE: certificate not verified")
    lines.append(f"  tls: {', '.join(tls_parts)}")
    stale = {
        False: "no",
        True: "pulls (while blocked or unreachable; kuik's checks are not)",
        "checks": "pulls and kuik's checks (while blocked or unreachable)",
    }
    lines.append(f"  serveStale: {stale[settings.serve_stale]}")
    lines.extend(_quota(settings.quota))
    if settings.paced:
        lines.extend(_rates(settings))
    return lines


def _per_hour(rate: float) -> str:
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def _rates(settings: RegistrySettings) -> list[str]:
    """What the intervals let through an hour, beside what the quota allows (§14)."""
    check, copy, quota = settings.check, settings.copy, settings.quota
    rates = pacing_rates(check.interval, copy.interval)
    lines = [
        f"  rates: at most {_per_hour(rates.checks_per_hour)} checks/h, "
        f"{_per_hour(rates.copies_per_hour)} copies/h; a first pull waits up to "
        f"{format_duration(first_pull(check.interval, copy.interval))} (a check window, "
        "then a copy window)"
    ]
    bucket = quota.bucket("DataplaneRead", "registry")
    reads = None if bucket is None else bucket.rate_per_minute
    allowed = quota_rate(quota.preset, reads, quota.share)
    if allowed is not None:
        lines.append(
            f"    quota allows {_per_hour(allowed.per_hour)}/h ({allowed.what}), "
            f"counting {allowed.counts}"
        )
        if exceeds(rates, allowed):
            lines.append(
                f"    WARNING: these intervals let through more {allowed.counts} than the quota "
                "allows: lengthen them, or the registry will throttle kuikproxy"
            )
    return lines


def _quota(quota: QuotaSettings) -> list[str]:
    if quota.preset is None and not quota.buckets:
        return ["  quota: none"]
    head = "  quota: " + (f"preset {quota.preset}" if quota.preset else "no preset")
    if quota.preset and quota.share != 1:
        head += f" at share {quota.share:g}"
    if quota.learns_from_headers:
        head += " (manifest GETs per identity, limit read from ratelimit headers)"
    lines = [head]
    preset = quota.preset_buckets()
    for bucket in quota.buckets:
        origin = "" if bucket in preset else " (explicit)"
        lines.append(
            f"    {bucket.category} per {bucket.scope}: {bucket.rate_per_minute:g}/min, "
            f"burst {bucket.burst}{origin}"
        )
    return lines


def _origin(item: PriorityLevel | FlowSchema) -> str:
    builtins: tuple[PriorityLevel | FlowSchema, ...] = (
        BUILTIN_PRIORITY_LEVELS if isinstance(item, PriorityLevel) else BUILTIN_FLOW_SCHEMAS
    )
    for builtin in builtins:
        if builtin.name == item.name:
            return " (built-in)" if builtin == item else " (replaces the built-in)"
    return ""


def _level(level: PriorityLevel) -> str:
    text = f"    {level.name}{_origin(level)}: {level.type}"
    if level.exempt is not None:
        exempt = level.exempt
        return (
            f"{text}, nominalConcurrencyShares {exempt.nominal_concurrency_shares}, "
            f"lendablePercent {exempt.lendable_percent}"
        )
    if level.limited is None:  # unreachable once validated
        return text
    limited = level.limited
    borrowing = limited.borrowing_limit_percent
    text += (
        f", nominalConcurrencyShares {limited.nominal_concurrency_shares}, "
        f"lendablePercent {limited.lendable_percent}, borrowingLimitPercent "
        f"{'unlimited' if borrowing is None else borrowing}, "
        f"{limited.limit_response.type}"
    )
    queuing = limited.limit_response.queuing
    if queuing is not None:
        text += (
            f" (queues {queuing.queues}, handSize {queuing.hand_size}, "
            f"queueLengthLimit {queuing.queue_length_limit})"
        )
    return text


def _rule(rule: FlowRule) -> str:
    parts = []
    if rule.operations:
        parts.append("operation " + " or ".join(rule.operations))
    if rule.resources:
        parts.append("resource " + " or ".join(rule.resources))
    if rule.hosts:
        parts.append("host " + " or ".join(rule.hosts))
    if rule.user_agents:
        parts.append("user agent " + " or ".join(rule.user_agents))
    parts.extend(f"header {h.name}: {' or '.join(h.values)}" for h in rule.headers or ())
    return " and ".join(parts) or "every request"


def _schema(schema: FlowSchema) -> list[str]:
    method = schema.distinguisher_method
    return [
        f"    {schema.name}{_origin(schema)}: precedence {schema.matching_precedence} "
        f"→ {schema.priority_level}, distinguisher {method.type if method else 'none'}",
        *(f"      when {_rule(rule)}" for rule in schema.rules),
    ]


def _flow_control(flow: FlowControl) -> list[str]:
    lines = [
        f"flowControl: serverConcurrencyLimit {flow.server_concurrency_limit}",
        "  priorityLevels:",
        *(_level(level) for level in flow.priority_levels),
        "  flowSchemas (tried in this order, the first match wins):",
    ]
    for schema in flow.flow_schemas:
        lines.extend(_schema(schema))
    return lines


def _forward_proxy(config: Config) -> str:
    forward = config.forward_proxy
    if not forward.enabled:
        return "forwardProxy: off (CONNECT and absolute URIs are refused)"
    tunnels = ", ".join(forward.tunnel_hosts) or "none"
    return (
        f"forwardProxy: on, CONNECT intercepted with the CA {forward.ca.cert_file} "
        f"(key {forward.ca.key_file}); tunnelled blind: {tunnels}"
    )


def _budget(config: Config) -> list[str]:
    """The memory budget and its split: every bound a client can fill, full at once, fits."""
    budget = config.budget()
    memory, source = config.memory()
    lines = [
        f"memory: {_mib(memory)} ({source}): {_mib(budget.base)} for the process, "
        f"{_mib(budget.headroom)} headroom, {_mib(budget.fillable)} for the bounds:"
    ]
    for share in budget.shares:
        if share.each == 1:
            what = _mib(share.value)
        else:
            what = f"{share.value} ({_mib(share.bytes)}, {share.each} B each)"
        lines.append(f"  {share.bound}: {what}{' as written' if share.set else ''}")
    return lines


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f}Mi"


def _store(config: Config) -> str:
    blobs = config.cache.blobs
    if blobs.path is None:
        return "none (blobs stream through; cache.blobs.path unset)"
    return f"{blobs.path}, maxBytes {_size(blobs.max_bytes)}"


def describe(config: Config) -> str:
    """A human-readable text of ``config``'s effective settings, one block per host."""
    host, port = config.listen_address()
    aliases = ", ".join(f"{alias} → {target}" for alias, target in config.host_aliases.items())
    limits = config.limits
    lines = [
        f"listen: {config.listen}" + ("" if host else f" (every address, port {port})"),
        f"defaultRegistry: {config.default_registry}",
        f"allowedHosts: {', '.join(config.allowed_hosts) or 'none'} (and every configured host)",
        f"hostAliases: {aliases or 'none'}",
        f"resourceIdentity: {', '.join(config.resource_identity)}",
        f"unusedImageRetention: {format_duration(config.unused_image_retention)}",
        f"cache: maxAge {format_duration(config.cache.max_age)}",
        f"store: {_store(config)}",
        f"state: {config.state.path or 'in memory (lost on restart)'}",
        *_budget(config),
        f"limits: maxRingImages {limits.max_ring_images} (of maxImages)",
        _forward_proxy(config),
        config.fleet.describe() if config.fleet is not None else "fleet: none (paced alone)",
        "",
        *_flow_control(config.flow_control),
    ]
    for name in config.configured_hosts():
        lines.append("")
        lines.extend(_registry(name, name, config.registry(name)))
    lines.append("")
    lines.extend(_registry("default (every other host)", None, config.registries[DEFAULT_BLOCK]))
    return "\n".join(lines) + "\n"
