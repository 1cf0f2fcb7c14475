"""One agent's place in a ring (`hypergrid.launch.ring.AgentRing`), as a process of its own that a test kills.

    python tests/workers/ringed.py PORT INDEX AGENTS OUT

Connects to the test's store on ``127.0.0.1:PORT``, joins the ring as agent ``INDEX`` of ``AGENTS`` with the
workers ``2*INDEX`` and ``2*INDEX + 1``, writes ``OUT/ready<INDEX>``, and appends each death it finds to
``OUT/lost<INDEX>`` (one JSON line: the agent, its ranks, when); ``OUT/watching<INDEX>``: the agent it holds a
connection to now. Leaves in order once ``OUT/stop<INDEX>`` exists.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time

import torch.distributed as dist

from hypergrid.launch.ring import AgentRing


def main() -> int:
    port, index, agents, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))

    def lost(agent: int, ranks: list[int], said: str) -> None:
        with (out / f"lost{index}").open("a") as file:
            file.write(json.dumps({"agent": agent, "ranks": ranks, "at": time.time(), "said": said}) + "\n")

    ring = AgentRing(store, "R/", index, agents, [2 * index, 2 * index + 1], lost)
    ring.start()
    (out / f"ready{index}").write_text("")
    shown: int | None = None
    while not (out / f"stop{index}").exists():
        if ring.watching != shown:  # (written whole: the test reads it any time)
            shown = ring.watching
            (out / f"watching{index}.tmp").write_text(str(shown))
            (out / f"watching{index}.tmp").replace(out / f"watching{index}")
        time.sleep(0.02)
    ring.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
