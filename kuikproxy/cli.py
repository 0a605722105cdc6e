"""The ``kuikproxy`` command (SPEC §7.1): ``serve``, ``check-config`` and ``status``.

Exit codes: 0 success, 1 ``check-config`` found an invalid file or ``status`` could not reach
kuikproxy, 2 usage errors and a ``serve`` that cannot start because its config is invalid
(argparse uses 2 for usage errors too, and both mean "fix how you invoked me", unlike a runtime
failure).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from importlib.metadata import PackageNotFoundError, version

from kuikproxy.config import describe, load_config
from kuikproxy.errors import ConfigError

__all__ = ["main"]

EXIT_INVALID_CONFIG = 1
"""``check-config``: the file is invalid (every error was printed)."""
EXIT_USAGE = 2
"""Bad arguments, or ``serve`` refused to start on an invalid config."""
DEFAULT_STATUS_URL = "http://127.0.0.1:7439"
"""Where ``status`` looks for kuikproxy: the embedded default's listen address."""


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


def _configure_logging(level: str, log_format: str) -> None:
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
    # Imported here so that check-config works without importing the web stack.
    from kuikproxy.web.server import run  # type: ignore[import-not-found,unused-ignore]

    _configure_logging(args.log_level, args.log_format)
    run(config, config_path=args.config)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.file)
    except ConfigError as error:
        _print_errors(error)
        return EXIT_INVALID_CONFIG
    sys.stdout.write(describe(config))
    return 0


def _status(args: argparse.Namespace) -> int:
    # Imported here: the other commands need none of it.
    from kuikproxy.cli_status import run

    return run(args.url, watch=args.watch, interval=args.interval)


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
    return _check_config(args)
