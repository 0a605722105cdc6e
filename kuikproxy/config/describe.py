"""The effective settings of a config as text, for ``kuikproxy check-config`` (SPEC §7.1).

What an operator needs is what each host will *actually* run with once ``default`` is merged
in, so every configured host is printed in full, then the default that every other host gets.
Credentials are shown by where they come from (file paths), never by content (R5).
"""

from __future__ import annotations

from kuikproxy.config.models import DEFAULT_BLOCK, Config, RegistrySettings
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
        f"idle {format_duration(copy.idle)}",
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
    return lines


def describe(config: Config) -> str:
    """A human-readable text of ``config``'s effective settings, one block per host."""
    host, port = config.listen_address()
    aliases = ", ".join(f"{alias} → {target}" for alias, target in config.host_aliases.items())
    lines = [
        f"listen: {config.listen}" + ("" if host else f" (every address, port {port})"),
        f"defaultRegistry: {config.default_registry}",
        f"allowedHosts: {', '.join(config.allowed_hosts) or 'none'} (and every configured host)",
        f"hostAliases: {aliases or 'none'}",
        f"resourceIdentity: {', '.join(config.resource_identity)}",
        f"unusedImageRetention: {format_duration(config.unused_image_retention)}",
        f"cache: maxAge {format_duration(config.cache.max_age)}, "
        f"maxEntries {config.cache.max_entries}, maxBytes {_size(config.cache.max_bytes)}",
        f"state: {config.state.path or 'in memory (lost on restart)'}",
    ]
    for name in config.configured_hosts():
        lines.append("")
        lines.extend(_registry(name, name, config.registry(name)))
    lines.append("")
    lines.extend(_registry("default (every other host)", None, config.registries[DEFAULT_BLOCK]))
    return "\n".join(lines) + "\n"
