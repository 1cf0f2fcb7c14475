"""Command line: ``python -m hypergrid demo|show|plan [...]``; ``--help`` also names the launcher, ``hypergrid.run``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from hypergrid.values import shown

_COMMANDS = {
    "demo": "run the main job: a local gloo grid, every family all-reduced and checked",
    "show": "print a grid's layout, families and node report (no process group needed)",
    "plan": "rank the orders of a grid's dims on a cluster's tiers for given traffic, fastest first",
}
_LAUNCHER = (
    "launcher (a module of its own): python -m hypergrid.run [torchrun's flags] SCRIPT [ARGS]\n"
    "  torchrun whose agent keeps the surviving workers running when one dies, and says how the job\n"
    "  ended (see python -m hypergrid.run --help and docs/launcher.md), e.g.\n"
    "  python -m hypergrid.run --standalone --nproc-per-node 4 train.py"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a sub-command; ``-h`` lists them; a missing or unknown one is one line on stderr (status 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        listing = "\n".join(f"  {name:<6} {text}" for name, text in _COMMANDS.items())
        print(f"usage: python -m hypergrid COMMAND [options]\n\ncommands:\n{listing}\n\n{_LAUNCHER}")
        return 0
    if args and args[0] == "run":
        print(
            "python -m hypergrid: error: the launcher is a module of its own: python -m hypergrid.run", file=sys.stderr
        )
        return 2
    if not args or args[0] not in _COMMANDS:
        said = f"unknown command {shown(args[0])}" if args else "no command given"
        print(f"python -m hypergrid: error: {said}; choose from {sorted(_COMMANDS)} (see --help)", file=sys.stderr)
        return 2
    try:
        return _run(args[0], args[1:])
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(command: str, argv: list[str]) -> int:
    if command == "show":
        from hypergrid.cli import show as cli

        return cli.show(argv)
    if command == "plan":
        from hypergrid.cli import plan as cli_plan

        return cli_plan.main(argv)
    from hypergrid.cli import demo

    return demo.main(argv)


if __name__ == "__main__":
    sys.exit(main())
