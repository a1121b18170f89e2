"""The one error path for files a user names and directories autotune writes.

Every file given on the command line (``--model``, ``--cluster``, ``--profile``, ``--space``, ``--plan``) is
read by ``read_text``, and every directory written into (``--out``, ``--plot``'s folder) is made ready by
``writable_dir`` before anything slow runs: a missing file, a directory where a file was expected, bytes
that are not UTF-8, or a folder that cannot be created or written all end in one ``ConfigError`` line
naming the flag and the fix, never a traceback after minutes of work.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autotune.errors import ConfigError

__all__ = ["read_text", "writable_dir", "writable_file"]


def read_text(path: str | Path, flag: str, *, missing: str = "pass an existing file") -> str:
    """The file's text; ``ConfigError`` (naming ``flag``; ``missing`` says what to do when there is no such
    file) when it cannot be read or is not UTF-8."""
    where = f"{flag} {path}" if flag else str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        hint = " (it holds a config.json: pass that file)" if (Path(path) / "config.json").is_file() else ""
        raise ConfigError(f"{where}: is a directory; pass a file{hint}") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read ({e.strerror}); {missing}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where}: not a UTF-8 text file (byte {e.start}: {e.reason}); pass a JSON or YAML file"
        ) from None


def writable_dir(path: str | Path, flag: str) -> Path:
    """Create ``path`` (and its parents) and check a file can be written there; ``ConfigError`` if not."""
    where = Path(path)
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".autotune-write-check-"):
            pass
    except FileExistsError:
        raise ConfigError(f"{flag} {path}: exists and is not a directory; pass a directory") from None
    except OSError as e:
        raise ConfigError(
            f"{flag} {path}: cannot write there ({e.strerror}); pass a writable directory"
        ) from None
    return where


def writable_file(path: str | Path, flag: str) -> Path:
    """Check the file ``path`` can be (over)written: its folder is writable and it is not a directory."""
    where = Path(path)
    if where.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; pass a file name")
    writable_dir(where.parent if str(where.parent) else Path(os.curdir), flag)
    return where
