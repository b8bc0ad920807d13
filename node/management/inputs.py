"""The management API's request bodies, checked before anything is done with them.

Every field a route reads goes through one of these: a value of the wrong type, a number
out of range, a name too long for AMQP or a table AMQP cannot carry is a 400 with RabbitMQ's
error body (`{"error":"bad_request","reason":"..."}`) naming the field, never an exception
deep in the codec (a 500). RabbitMQ's own tools send booleans and numbers as strings
("durable": "true", "count": "5"), so those are taken too.
"""
from __future__ import annotations

import base64
import binascii
import math
import re

INT64 = (-(1 << 63), (1 << 63) - 1)
SHORTSTR = 255
STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                     "message_id", "type", "user_id", "app_id", "cluster_id")


class BadInput(ValueError):
    """A field that cannot be used: the reason, for a 400."""


def body_of(data) -> dict:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput("not_json_object")
    return data


def flag(data: dict, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadInput(f"{key} must be true or false (got {_shown(value)})")


def text(data: dict, key: str, default: str | None = None, limit: int | None = None, what: str | None = None) -> str:
    value = data.get(key, default)
    if value is None and default is None:
        raise BadInput(f"[{{error,{{key_missing,{key}}}}}]")
    if not isinstance(value, str):
        raise BadInput(f"{what or key} must be a string (got {_shown(value)})")
    if limit is not None:
        shortstr(value, what or key, limit)
    return value


def shortstr(value: str, what: str, limit: int = SHORTSTR) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise BadInput(f"{what} is longer than {limit} bytes")
    return value


def whole(data: dict, key: str, default: int | None, lo: int = INT64[0], hi: int = INT64[1]) -> int | None:
    value = data.get(key, default)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise BadInput(f"{key} must be a whole number (got {_shown(value)})")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadInput(f"{key} must be a whole number (got {_shown(value)})") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise BadInput(f"{key} must be a whole number (got {_shown(value)})")
    if not lo <= value <= hi:
        raise BadInput(f"{key} must be between {lo} and {hi} (got {_shown(value)})")
    return value


def choice(data: dict, key: str, default: str, options) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or value not in options:
        raise BadInput(f"{key} must be one of {', '.join(options)} (got {_shown(value)})")
    return value


def table(data: dict, key: str) -> dict:
    """An AMQP field table (queue, exchange and binding arguments, message headers)."""
    value = data.get(key)
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{key} must be an object (got {_shown(value)})")
    _check_table(value, key)
    return value


def _check_table(value: dict, where: str) -> None:
    for k, v in value.items():
        shortstr(k, f"a key of {where}")
        _check_field(v, f"{where}.{k}")


def _check_field(value, where: str) -> None:
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise BadInput(f"{where} is out of range for AMQP (a signed 64-bit integer; got {_shown(value)})")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(f"{where} must be a finite number")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_field(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        _check_table(value, where)
        return
    raise BadInput(f"{where} cannot be sent in AMQP (got {_shown(value)})")


def regex(data: dict, key: str, default: str | None = None) -> str:
    value = text(data, key, default)
    try:
        re.compile(value)
    except re.error as exc:
        raise BadInput(f"{key} is not a valid regular expression: {exc}") from None
    return value


def tags(data: dict, key: str = "tags") -> list[str]:
    value = data.get(key, "")
    if value is None:
        return []
    if isinstance(value, str):
        return [t for t in value.replace(",", " ").split() if t]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t for t in value if t]
    raise BadInput(f"{key} must be a string or a list of strings (got {_shown(value)})")


def password_hash(data: dict, key: str = "password_hash") -> str:
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise BadInput(f"{key} must be a string (got {_shown(value)})")
    if value:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadInput(f"{key} is not base64") from None
    return value


def properties(data: dict) -> dict:
    """basic.publish properties as the API takes them (RabbitMQ's names)."""
    value = data.get("properties")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"properties must be an object (got {_shown(value)})")
    out = {}
    for name in STRING_PROPERTIES:
        if value.get(name) is not None:
            out[name] = text(value, name, limit=SHORTSTR, what=f"properties.{name}")
    for name in ("delivery_mode", "priority"):
        if value.get(name) is not None:
            out[name] = whole(value, name, None, 0, 255)
    if value.get("timestamp") is not None:
        out["timestamp"] = whole(value, "timestamp", None, 0, INT64[1])
    if value.get("headers") is not None:
        out["headers"] = table(value, "headers")
    return out


def listed(data: dict, key: str) -> list[dict]:
    """A definitions file's list of objects."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise BadInput(f"{key} must be a list of objects")
    return value


def _shown(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
