"""What counting voters costs an honest fleet: ``reads.voters.any_crowded`` on a SQLite
file of 10,000 nodes (each a CPU, every other one also 8 GPUs known by UUID: 50,000
devices). Readers skip ``latest`` when it says False, so this is the whole added cost
of the fleet page, /divergence and pins there. Not run by CI.

    .venv/bin/python bench/voters.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session

from numparity_server.models import Device, Node
from numparity_server.models.base import Base
from numparity_server.reads.voters import any_crowded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10_000)
    nodes = parser.parse_args().nodes
    with tempfile.TemporaryDirectory() as workdir:
        engine = create_engine(f"sqlite:///{Path(workdir) / 'voters.db'}")
        Base.metadata.create_all(engine)
        rows = []
        for i in range(1, nodes + 1):
            rows.append({"identity": f"node:{i}/cpu", "type": "cpu", "model": "cpu",
                         "node_id": i, "owner_node_id": i, "slot": "cpu"})
            if i % 2 == 0:
                rows += [{"identity": f"uuid:GPU-{i}-{g}", "type": "cuda",
                          "model": "cuda/NVIDIA H100/9.0", "uuid": f"GPU-{i}-{g}",
                          "node_id": i, "owner_node_id": i, "slot": f"cuda:{g}"}
                         for g in range(8)]
        with Session(engine) as session:
            session.execute(insert(Node), [{"id": i, "name": f"node-{i:05d}"}
                                           for i in range(1, nodes + 1)])
            session.execute(insert(Device), rows)
            session.commit()
            for per_model in (False, True):
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    found = any_crowded(session, per_model=per_model)
                    times.append(time.perf_counter() - start)
                print(f"any_crowded(per_model={per_model}): {found} on {len(rows):,} devices "
                      f"of {nodes:,} nodes, best of 5 {min(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
