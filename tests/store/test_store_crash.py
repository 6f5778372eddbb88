"""The store across processes: a SIGKILLed writer leaves only complete runs (one transaction per
run), and processes opening a new file at the same time all get the schema."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from fixtures_db import add_refs
from sqlalchemy import text

from db import Store

STEPS = 2000
WRITER = textwrap.dedent(f"""
    import sys
    from fixtures_db import StoreRefs, sample_result
    from db import Store
    store = Store.open(sys.argv[1])
    refs = StoreRefs(*map(int, sys.argv[2:]))
    for i in range(100_000):
        store.save_run(sample_result(refs, f"run-{{i}}", steps={STEPS}))
        print(i, flush=True)
""")


def _env() -> dict[str, str]:
    tests_dir = Path(__file__).resolve().parents[1]  # the fixtures' folder, then the repository
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), str(tests_dir.parent)])}


def test_sigkilled_writer_leaves_only_complete_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with Store.open(url) as store:
        refs = add_refs(store)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, *map(str, vars(refs).values())],
        stdout=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        for _ in range(3):  # let it commit a few runs, then kill it while it writes more
            assert writer.stdout.readline().strip(), "the writer stopped early"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    with Store.open(url) as store, store.database.connect() as conn:
        per_run = conn.execute(text(
            "SELECT r.run_key, "
            "(SELECT sum(t.steps) FROM decode_steps t WHERE t.measurement_id = m.id), "
            "(SELECT count(*) FROM outcomes o WHERE o.measurement_id = m.id), "
            "(SELECT count(*) FROM device_snapshots s WHERE s.measurement_id = m.id) "
            "FROM runs r JOIN measurements m ON m.run_id = r.id"
        )).all()
        assert len(per_run) >= 3
        assert all(row[1:] == (STEPS, 1, 2) for row in per_run), per_run
        assert store.completed_run_keys() == {row[0] for row in per_run}


def test_concurrent_first_opens_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    opener = "import sys; from db import Store; Store.open(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", opener, url], env=_env(),
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [proc.communicate()[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], errors
    with Store.open(url) as store, store.database.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM alembic_version")) == 1
