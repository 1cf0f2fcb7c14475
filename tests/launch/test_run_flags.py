"""``python -m hypergrid.run``'s command line: every bad flag is one line naming the flag and the value, exit code 2.

Each case runs the launcher's ``main`` in this process (nothing starts: the
check comes first); one runs the real command, to show there is no traceback
and no usage block.
"""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys

import pytest
import torch
from torch.distributed.run import get_args_parser

from hypergrid.errors import InvalidArgumentError
from hypergrid.launch.launcher import configure, main, parser

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "workers" / "launched.py")  # a script that exists

# (flag, bad value): every flag of the command line that takes a value. The duplicate-output filters are
# missing on purpose: every string is a filter there.
BAD = [
    ("--nnodes", "0"),
    ("--nnodes", "2:1"),
    ("--nnodes", "a:b"),
    ("--nnodes", "1:2:3"),
    ("--nproc-per-node", "abc"),
    ("--nproc-per-node", "0"),
    ("--nproc-per-node", "-1"),
    ("--rdzv-backend", "nope"),
    ("--rdzv-backend", ""),
    ("--rdzv-endpoint", "host:abc"),
    ("--rdzv-endpoint", "host:70000"),
    ("--rdzv-id", ""),
    ("--rdzv-conf", "novalue"),
    ("--rdzv-conf", "=x"),
    ("--max-restarts", "-3"),
    ("--max-restarts", "abc"),
    ("--monitor-interval", "0"),
    ("--monitor-interval", "nan"),
    ("--monitor-interval", "abc"),
    ("--start-method", "thread"),
    ("--event-log-handler", "nope"),
    ("--role", ""),
    ("--redirects", "9"),
    ("--tee", "x"),
    ("--local-ranks-filter", "a,b"),
    ("--node-rank", "-1"),
    ("--master-addr", ""),
    ("--master-port", "0"),
    ("--master-port", "70000"),
    ("--master-port", "abc"),
    ("--local-addr", ""),
    ("--logs-specs", "nope"),
    ("--numa-binding", "nope"),
    ("--signals-to-handle", "SIGNOPE"),
    ("--shutdown-timeout", "0"),
    ("--shutdown-timeout", "abc"),
    ("--min-healthy", "0"),
    ("--min-healthy", "5"),
    ("--min-healthy", "abc"),
    ("--exit-barrier-timeout", "0"),
    ("--exit-barrier-timeout", "inf"),
    ("--exit-barrier-timeout", "abc"),
]


@pytest.mark.parametrize(("flag", "value"), BAD, ids=[f"{flag}={value}" for flag, value in BAD])
def test_a_bad_value_is_one_line_naming_the_flag_and_the_value(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--standalone", "--nproc-per-node", "4"] if flag not in ("--nproc-per-node", "--rdzv-backend") else []
    assert main([*flags, flag, value, SCRIPT]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert flag in lines[0] and any(shown in lines[0] for shown in _as_written(value)), lines[0]


def _as_written(value: str) -> set[str]:
    """How a message may quote ``value``: as text, or as the number argparse parsed it into."""
    forms = {repr(value), f" {value};", f" {value} "}
    with contextlib.suppress(ValueError):
        forms.add(f" {float(value)};")
    return forms


def test_a_log_dir_that_is_a_file_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--log-dir", SCRIPT, SCRIPT]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: hypergrid.run: --log-dir {SCRIPT!r}; expected a directory (an existing file is not one)"
    )


def test_a_script_that_does_not_exist_is_refused(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "trian.py")
    assert main(["--standalone", missing]) == 2
    assert (
        f"training_script {missing!r}; expected the path of a Python script (no such file)" in capsys.readouterr().err
    )
    configure(parser().parse_args(["--standalone", "--no-python", "no-such-program"]))  # a program: not a path
    configure(parser().parse_args(["--standalone", "--module", "no.such.module"]))  # a module: not a path


def test_nproc_per_node_0_is_blamed_on_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--nproc-per-node", "0", SCRIPT]) == 2
    err = capsys.readouterr().err
    assert "--nproc-per-node '0'" in err and "--min-healthy" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min-healthy", "0"], r"--min-healthy 0; expected 1\.\.4"),
        (["--min-healthy", "5"], r"--min-healthy 5; expected 1\.\.4 .*--nproc-per-node 4"),
        (["--nnodes", "2:3", "--rdzv-endpoint", "h:1", "--min-healthy", "9"], r"expected 1\.\.8 .*minimum 2"),
        (["--exit-barrier-timeout", "0"], r"--exit-barrier-timeout 0.0; expected a positive"),
        (["--run-path"], r"--run-path is not supported"),
    ],
)
def test_configure_refuses_before_anything_starts(flags: list[str], message: str) -> None:
    args = parser().parse_args(["--standalone", "--nproc-per-node", "4", *flags, SCRIPT])
    with pytest.raises(InvalidArgumentError, match=message):
        configure(args)


def test_good_values_of_every_flag_pass(tmp_path: pathlib.Path) -> None:
    argv = [
        "--nnodes", "1:2", "--nproc-per-node", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:1234",
        "--rdzv-id", "job", "--rdzv-conf", "join_timeout=5", "--max-restarts", "2", "--monitor-interval", "0.5",
        "--start-method", "fork", "--event-log-handler", "console", "--role", "trainer", "--log-dir",
        str(tmp_path), "--redirects", "0:3,1:1", "--tee", "3", "--local-ranks-filter", "0,1", "--node-rank", "0",
        "--master-addr", "127.0.0.1", "--master-port", "29501", "--local-addr", "127.0.0.1",
        "--signals-to-handle", "SIGTERM,SIGUSR2", "--shutdown-timeout", "5", "--duplicate-stdout-filters", "loss",
        "--min-healthy", "2", "--exit-barrier-timeout", "60", SCRIPT, "--lr", "0.1",
    ]  # fmt: skip
    config, _, args = configure(parser().parse_args(argv))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node, config.max_restarts) == (1, 2, 3, 2)
    assert args[-3:] == [SCRIPT, "--lr", "0.1"]


def test_every_torchrun_flag_is_still_a_flag_of_ours() -> None:
    ours = {option for action in parser()._actions for option in action.option_strings}
    torchrun = {option for action in get_args_parser()._actions for option in action.option_strings}
    assert torchrun <= ours


def test_main_answers_a_bad_flag_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--nproc-per-node", "2", "--min-healthy", "3", SCRIPT]) == 2
    assert "error: hypergrid.run: --min-healthy 3; expected 1..2" in capsys.readouterr().err


def test_a_store_hosted_by_worker_rank_0_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    assert main(["--standalone", "--nproc-per-node", "2", SCRIPT]) == 2
    assert "does not share its store with the workers" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--nproc-per-nod", "1"], ["--nproc-per-nod=1"], ["--min-heal", "1"]])
def test_an_abbreviated_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would take ``--nproc-per-nod`` for ``--nproc-per-node``: a misspelling must not pass silently."""
    assert main(["--standalone", *argv, SCRIPT]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert lines[0].startswith("error: hypergrid.run: unrecognized arguments: ") and argv[0] in lines[0], lines[0]


@pytest.mark.processes
def test_the_real_command_prints_one_line_and_no_traceback() -> None:
    for argv in (["--nproc-per-node", "abc", SCRIPT], ["--max-restarts", "x", SCRIPT]):
        done = subprocess.run(
            [sys.executable, "-m", "hypergrid.run", *argv], cwd=ROOT, capture_output=True, text=True, timeout=100
        )
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
        assert argv[0] in done.stderr and argv[1] in done.stderr


@pytest.mark.processes
def test_the_real_command_refuses_an_abbreviation_in_one_line() -> None:
    """Issue 45's case as a user types it: exit 2, one line, nothing started."""
    argv = [sys.executable, "-m", "hypergrid.run", "--standalone", "--nproc-per-nod", "1", SCRIPT]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip() == "error: hypergrid.run: unrecognized arguments: --nproc-per-nod (see --help)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, 'gpu' counts the GPUs")
def test_gpu_without_cuda_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--standalone", "--nproc-per-node", "gpu", SCRIPT]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: hypergrid.run: --nproc-per-node 'gpu'; "
        "expected a positive int ('gpu' needs CUDA, which is not available)"
    )
