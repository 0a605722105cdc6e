"""The ``kuikproxy`` command (SPEC §7.1): ``serve``, ``check-config``, ``status``,
``inject-webhook`` and ``ca bundle`` (§13).

Exit codes: 0 success, 1 ``check-config`` found an invalid file, ``status`` could not reach
kuikproxy or ``serve`` cannot use its state file, 2 usage errors and a ``serve`` that cannot
start because its config is invalid (argparse uses 2 for usage errors too, and both mean "fix
how you invoked me", unlike a runtime failure).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from kuikproxy.config import describe, load_config
from kuikproxy.errors import ConfigError, StateError

__all__ = ["main"]

EXIT_INVALID_CONFIG = 1
"""``check-config``: the file is invalid (every error was printed)."""
EXIT_USAGE = 2
"""Bad arguments, or ``serve`` refused to start on an invalid config."""
EXIT_STATE = 1
"""``serve``: the state file (``state.path``) is unreadable, corrupt, newer or in use."""
EXIT_CA = 1
"""``ca bundle``: the CA cannot be loaded or written, or there are no system roots."""
DEFAULT_STATUS_URL = "http://127.0.0.1:7439"
"""Where ``status`` looks for kuikproxy: the embedded default's listen address."""
INJECT_ENVIRONMENT = (
    ("--sidecar-image", "KUIKPROXY_SIDECAR_IMAGE", "IMAGE", "the kuikproxy image of the sidecar"),
    (
        "--config-map",
        "KUIKPROXY_CONFIG_MAP",
        "NAME",
        "the ConfigMap with the sidecar's config.yaml",
    ),
    (
        "--ca-bundle-secret",
        "KUIKPROXY_CA_BUNDLE_SECRET",
        "NAME",
        "the Secret with bundle.pem and the CA the sidecar intercepts TLS with",
    ),
)
"""``inject-webhook``'s required settings: each flag, else its environment variable."""


def _version() -> str:
    try:
        return version("kuikproxy")
    except PackageNotFoundError:
        # Running from a source tree without an install (PYTHONPATH=.).
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kuikproxy",
        description="An egress proxy that paces container registry reads.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="the YAML config file (default: the embedded default config)",
    )
    serve.add_argument(
        "--log-level", choices=("debug", "info", "warning"), default="info", help="default: info"
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="default: text"
    )

    check = commands.add_parser(
        "check-config", help="validate a config file and print the effective per-host settings"
    )
    check.add_argument("file", metavar="FILE")

    status = commands.add_parser(
        "status", help="print a running kuikproxy's /status as tables (registries, rings)"
    )
    status.add_argument(
        "--url",
        default=DEFAULT_STATUS_URL,
        help=f"kuikproxy's address (default: {DEFAULT_STATUS_URL})",
    )
    status.add_argument("--watch", action="store_true", help="redraw the tables until Ctrl-C")
    status.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between redraws with --watch (default: 2)",
    )

    ca = commands.add_parser("ca", help="kuikproxy's interception CA (forward-proxy mode)")
    ca_commands = ca.add_subparsers(dest="ca_command", required=True, metavar="COMMAND")
    ca_bundle = ca_commands.add_parser(
        "bundle",
        help="write the system roots plus kuikproxy's CA, for clients' SSL_CERT_FILE",
        description="The CA is the config's forwardProxy.ca (generated there if missing).",
    )
    ca_bundle.add_argument("--config", metavar="FILE", help="the config whose CA to use")
    ca_bundle.add_argument(
        "--output", "-o", metavar="FILE", help="where to write it (default: standard output)"
    )
    inject = commands.add_parser(
        "inject-webhook",
        help="serve the admission webhook that injects the kuikproxy sidecar into pods",
        description="A mutating admission webhook (AdmissionReview v1, POST /mutate over TLS) "
        'that adds the kuikproxy sidecar to pods labelled kuikproxy.io/inject: "true". '
        "It never refuses a pod: the webhook configuration's failurePolicy decides what "
        "happens when it cannot be called.",
    )
    inject.add_argument(
        "--listen", default="0.0.0.0:8443", metavar="HOST:PORT", help="default: 0.0.0.0:8443"
    )
    for flag, default in (("--tls-cert-file", "/tls/tls.crt"), ("--tls-key-file", "/tls/tls.key")):
        inject.add_argument(flag, default=default, metavar="FILE", help=f"default: {default}")
    for flag, variable, metavar, meaning in INJECT_ENVIRONMENT:
        inject.add_argument(
            flag,
            default=os.environ.get(variable),
            metavar=metavar,
            help=f"{meaning} (env {variable})",
        )
    inject.add_argument(
        "--log-level", choices=("debug", "info", "warning"), default="info", help="default: info"
    )
    inject.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="default: text"
    )
    return parser


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {value!r}")
    return seconds


class _JSONFormatter(logging.Formatter):
    """One JSON object per line, for log collectors; ``extra`` fields are not included."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    # Configured here, before the server starts, so the server module only logs.
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def _print_errors(error: ConfigError) -> None:
    for line in error.errors:
        print(line, file=sys.stderr)


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as error:
        _print_errors(error)
        return EXIT_USAGE
    if config.fleet is not None and (missing := config.fleet.missing()) is not None:
        print(missing, file=sys.stderr)
        return EXIT_USAGE
    # Imported here so that check-config works without importing the web stack.
    from kuikproxy.server import run  # type: ignore[import-not-found,unused-ignore]

    configure_logging(args.log_level, args.log_format)
    try:
        run(config, config_path=args.config)
    except StateError as error:  # P13: refused rather than started over, which loses it
        print(error, file=sys.stderr)
        return EXIT_STATE
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as error:
        _print_errors(error)
        return EXIT_INVALID_CONFIG
    sys.stdout.write(describe(config))
    if config.fleet is not None and (missing := config.fleet.missing()) is not None:
        print(missing, file=sys.stderr)
        return EXIT_INVALID_CONFIG
    return 0


def _status(args: argparse.Namespace) -> int:
    # Imported here: the other commands need none of it.
    from kuikproxy.cli_status import run

    return run(args.url, watch=args.watch, interval=args.interval)


def _inject_webhook(args: argparse.Namespace) -> int:
    # Imported here: the other commands need none of it.
    from kuikproxy.inject.patch import SidecarSettings
    from kuikproxy.inject.webhook import WebhookSettings, run

    missing = [
        f"{flag} (or {variable}) is required"
        for flag, variable, _, _ in INJECT_ENVIRONMENT
        if not getattr(args, flag[2:].replace("-", "_"))
    ]
    try:
        if missing:
            raise ConfigError(missing)
        sidecar = SidecarSettings(args.sidecar_image, args.config_map, args.ca_bundle_secret)
        settings = WebhookSettings.parse(
            args.listen, args.tls_cert_file, args.tls_key_file, sidecar
        )
        configure_logging(args.log_level, args.log_format)
        run(settings)
    except ConfigError as error:
        _print_errors(error)
        return EXIT_USAGE
    return 0


def _ca_bundle(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as error:
        _print_errors(error)
        return EXIT_USAGE
    # cryptography is imported only by the commands that mint certificates
    from kuikproxy.forward.authority import Authority, CertificateError
    from kuikproxy.forward.bundle import bundle

    ca = config.forward_proxy.ca
    try:
        pem = bundle(Authority(ca.cert_file, ca.key_file))
    except CertificateError as error:
        print(f"kuikproxy ca bundle: {error}", file=sys.stderr)
        return EXIT_CA
    if args.output is None:
        sys.stdout.write(pem.decode())
    else:
        with open(args.output, "wb") as file:
            file.write(pem)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits for --help, --version and usage errors; callers get a code instead.
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    if args.command == "serve":
        return _serve(args)
    if args.command == "status":
        return _status(args)
    if args.command == "inject-webhook":
        return _inject_webhook(args)
    if args.command == "ca":
        return _ca_bundle(args)
    return _check_config(args)
