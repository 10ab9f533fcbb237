"""What the integrity check costs at start: open the fault journal and the partition store at growing sizes.

    python3 -m bench.state_open_bench [--sizes 1000 10000 100000]

Each open runs ``PRAGMA quick_check`` (every page read once) so a damaged file stops the start with a message
instead of failing later. The journal is filled with rows of the size the daemon writes (a fault's JSON is about
1 KB); the default retention keeps up to 10,000 resolved faults, so 100,000 records is well past a busy month.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median, timed
from healthd.faults.journal import SCHEMA, Journal
from healthd.state_files import check_integrity

FAULT_JSON = json.dumps({"id": "f" * 32, "message": "XID 48 (Double Bit ECC Error) on GPU 3 " * 12, "evidence": {}})


def fill_journal(path: Path, records: int) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    db.execute("BEGIN")
    for seq in range(1, records + 1):
        fault_id = f"{seq % max(records // 10, 1):032x}"
        db.execute(
            "INSERT OR REPLACE INTO faults (id, state, check_name, code, gpu_uuid, severity, action, last_seq, data)"
            " VALUES (?, 'resolved', 'xid', 'xid_48', 'GPU-3', 3, 2, ?, ?)",
            (fault_id, seq, FAULT_JSON),
        )
        db.execute(
            "INSERT INTO records (seq, fault_id, kind, at, detail, data) VALUES (?, ?, 'opened', ?, '', ?)",
            (seq, fault_id, float(seq), FAULT_JSON),
        )
        db.execute(
            "INSERT INTO outbox (target, seq, fault_id, payload, delivered_at) VALUES ('unix:/hook', ?, ?, ?, ?)",
            (seq, fault_id, FAULT_JSON, float(seq)),
        )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


REPEAT = 5  # timings per measurement; the median is printed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000], help="journal records")
    args = parser.parse_args(argv)
    print(f"{'records':>9} {'file MB':>8} {'quick_check ms':>15} {'Journal() ms':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for records in args.sizes:
            path = Path(tmp) / f"faults-{records}.sqlite"
            fill_journal(path, records)
            size_mb = path.stat().st_size / 2**20

            def check(path: Path = path) -> None:
                db = sqlite3.connect(path)
                check_integrity(db)
                db.close()

            def open_journal(path: Path = path) -> None:
                Journal(path).close()

            check_s = median(timed(check, REPEAT))
            open_s = median(timed(open_journal, REPEAT))
            print(f"{records:>9} {size_mb:>8.1f} {check_s * 1e3:>15.1f} {open_s * 1e3:>13.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
