"""Where a study lives: SQLite by default, any SQLAlchemy RDB URL, or Optuna's journal file.

Default: ``sqlite:///<user cache>/neuron-kernels/autotune.db`` (``$XDG_CACHE_HOME``, else
``~/.cache``), or the URL in ``$NEURON_KERNELS_STUDIES``. A study is a work log (every
trial, pruned and failed ones too), not a shipped result: it belongs in a writable
per-user place that survives between runs, so a killed run resumes, and not in the package
folder, which may be read-only (a wheel install) and is versioned (``perf_results/`` holds
only the best config per key). SQLite suits one node, several worker processes included;
for many nodes use a server (``postgresql+psycopg://...``, ``mysql+pymysql://...``) or, on a
shared filesystem, ``journal:PATH`` (Optuna's ``JournalFileBackend``; its file lock works on
NFS).

RDB storages run Optuna's heartbeat: a worker that dies (SIGKILL, a lost node) leaves its
trial RUNNING; once it misses its heartbeat for the grace period, the next worker to start a
trial marks it FAIL, and ``RetryHeartbeatStaleTrialCallback`` enqueues its config again, so the
config is neither lost nor counted as a result. Optuna 5.1's journal storage has no
heartbeat: a dead worker's trial stays RUNNING there (never counted as a result).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import optuna

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "GRACE_PERIOD_S",
    "STUDIES_ENV",
    "StorageError",
    "default_storage_url",
    "open_storage",
]

STUDIES_ENV = "NEURON_KERNELS_STUDIES"
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60  # a trial silent this long belongs to a dead worker
JOURNAL_PREFIX = "journal:"


class StorageError(Exception):
    """The storage URL cannot be used; the message is one line naming why."""


def default_storage_url() -> str:
    env = os.environ.get(STUDIES_ENV)
    if env:
        return env
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return f"sqlite:///{cache / 'neuron-kernels' / 'autotune.db'}"


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; use psycopg (3) where only it is here."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and sep:
        if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg"):
            return f"postgresql+psycopg://{rest}"
        if scheme == "postgres":
            return f"postgresql://{rest}"
    return url


def _fast_sqlite(storage) -> None:
    """WAL journal and ``synchronous=NORMAL``: one fsync per checkpoint instead of per
    commit (a trial makes ~20 commits). Still safe against a killed process; WAL needs the
    file on a local disk (use journal:PATH on a shared filesystem)."""
    from sqlalchemy import event

    def pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(storage.engine, "connect", pragmas)
    storage.engine.dispose()  # connections opened so far reconnect with the pragmas


def open_storage(
    url: str,
    heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
    grace_period: int = GRACE_PERIOD_S,
):
    """An Optuna storage for ``url``; raises :class:`StorageError` (one line) when it cannot
    be opened: a bad URL, a missing driver, a server that does not answer."""
    if url.startswith(JOURNAL_PREFIX):
        path = url[len(JOURNAL_PREFIX) :].removeprefix("//")
        if not path:
            raise StorageError("a journal storage needs a file: journal:PATH")
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise StorageError(f"the journal's folder {parent} does not exist")
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(path))
    if "://" not in url:
        raise StorageError(
            "must be an SQLAlchemy URL (sqlite:///PATH, postgresql+psycopg://..., "
            "mysql+pymysql://...) or journal:PATH"
        )
    url = _with_driver(url)
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=1
                ),
            )
        if url.startswith("sqlite"):
            _fast_sqlite(storage)
        return storage
    except ModuleNotFoundError as exc:
        hint = " (pip install 'neuron-kernels[postgres]')" if "psycopg" in str(exc) else ""
        raise StorageError(f"its database driver is not installed: {exc.name}{hint}") from None
    except Exception as exc:  # SQLAlchemy's errors: bad URL, refused connection, bad login
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open it: {type(exc).__name__}: {first}") from None
