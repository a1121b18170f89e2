"""Storage URLs as autotune prints them: never with a password. Light (the CLI imports it at start)."""

from __future__ import annotations

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """A URL without its password, for printing."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
