"""structlog set-up: one line per event on stderr, with node, vhost, queue and channel fields."""
from __future__ import annotations

import logging
import sys

import structlog


class _ToStructlog(logging.Handler):
    """Libraries log through `logging` (grpc reports a servicer's exception there, behind a
    NullHandler of its own): their warnings and errors go to the node's log, traceback and all."""

    def emit(self, record: logging.LogRecord) -> None:
        structlog.get_logger(record.name).log(record.levelno, record.getMessage(), exc_info=record.exc_info)


def configure(level: str = "info", json: bool = False) -> None:
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(handler, _ToStructlog) for handler in root.handlers):
        root.addHandler(_ToStructlog(logging.WARNING))
