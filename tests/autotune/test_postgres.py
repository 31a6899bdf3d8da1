"""Two tuner worker processes share one study on a real PostgreSQL server.

The test starts a throwaway cluster (Debian's ``postgresql``: ``initdb`` and ``pg_ctl``
from ``/usr/lib/postgresql/<version>/bin``; ``.ci/run`` installs it where missing) in a
temporary folder, listening on 127.0.0.1 at a free port, and removes it afterwards.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user.
It skips, saying why, only where no server can be had (no binaries, no driver).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb); .ci/run installs Debian's postgresql")
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("no PostgreSQL driver for SQLAlchemy: pip install 'neuron-kernels[postgres]'")
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    root = tempfile.mkdtemp(prefix="nk-pg-")
    if as_user:
        shutil.chown(root, "postgres")
    data, port = Path(root) / "data", _free_port()
    run = lambda *cmd: subprocess.run(  # noqa: E731
        [*as_user, *map(str, cmd)], check=True, capture_output=True, text=True
    )
    try:
        run(bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres")
        run(
            bindir / "pg_ctl",
            "-D",
            data,
            "-l",
            Path(root) / "server.log",
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {root}",
            "start",
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start a PostgreSQL cluster: {exc.stderr or exc.stdout}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_two_workers_share_one_study_on_postgresql(postgres_url, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "neuron_kernels.cli",
        "autotune",
        "matmul",
        "--shape",
        "256x1024x256",
        "--trials",
        "6",
        "--jobs",
        "2",
        "--storage",
        postgres_url,
        "--results",
        str(tmp_path),
        "--quiet",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (summary,) = optuna.get_all_study_summaries(postgres_url)
    study = optuna.load_study(study_name=summary.study_name, storage=postgres_url)
    complete = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    workers = {t.user_attrs["worker"] for t in complete if "duplicate_of" not in t.user_attrs}
    assert len(workers) == 2, f"only {workers} ran trials"
    entry = json.loads((tmp_path / "trn2" / "matmul.json").read_text())["entries"][0]
    assert entry["metric"]["latency_us"] == study.best_value
    assert entry["config"] == study.best_params
