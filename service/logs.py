"""structlog JSON logs: one JSON object per line on stderr.

Records from the standard `logging` module (the engine, grpc) are rendered the
same way. Inside an RPC the structlog context carries `tenant`, `session` and
`request_id` (bound per task, see servicer.py); the engine thread has no such
context, so it passes `request_id` explicitly (`extra=`), which lands in the
same field.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

FORMATS = ("json", "console")


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {FORMATS}")
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # Records from `logging`: their `extra=` fields (request_id) become keys.
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
