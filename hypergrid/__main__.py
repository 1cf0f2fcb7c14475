"""Command line: ``python -m hypergrid demo|show|plan [...]``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hypergrid.values import shown

_COMMANDS = {
    "demo": "run the main job: a local gloo grid, every family all-reduced and checked",
    "show": "print a grid's layout, families and node report (no process group needed)",
    "plan": "rank the orders of a grid's dims on a cluster's tiers for given traffic, fastest first",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a sub-command; print the list of commands on ``-h`` or a bad one."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in _COMMANDS:
        listing = "\n".join(f"  {name:<6} {text}" for name, text in _COMMANDS.items())
        print(f"usage: python -m hypergrid COMMAND [options]\n\ncommands:\n{listing}")
        if args and args[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {shown(args[0])}; choose from {sorted(_COMMANDS)}", file=sys.stderr)
            return 2
        return 0 if args else 2
    if args[0] == "show":
        from hypergrid.cli import show as cli

        return cli.show(args[1:])
    if args[0] == "plan":
        from hypergrid.cli import plan as cli_plan

        return cli_plan.main(args[1:])
    from hypergrid.cli import demo

    return demo.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
