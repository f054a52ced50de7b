"""VRAMScope entry point: no arguments → the desktop app; a subcommand → the same engine, headless.

Each subcommand lives in cli/<name>.py, a `Command`: `add_arguments(parser)` and `run(args) -> int`; COMMANDS lists
them, so mypy checks every one against the protocol.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, Protocol

from cli import calibrate, diff, estimate, max_batch, max_context, monitor, open_snapshot, plan, profile, report
from cli.terminal import shown
from engine import __version__


class Command(Protocol):
    """A subcommand's module: it defines its options, then runs with them and returns the exit status."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: dict[str, tuple[Command, str]] = {
    "estimate": (estimate, "peak memory of a training step or inference pass"),
    "max-batch": (max_batch, "largest batch whose estimated peak fits a budget"),
    "max-context": (max_context, "longest context (prompt + new tokens, or sequence) that fits a budget"),
    "profile": (profile, "run the step for real on this machine and measure it"),
    "plan": (plan, "ranked recommendations to make a model fit"),
    "monitor": (monitor, "snapshot or record the local NVIDIA GPUs"),
    "report": (report, "export a PDF (and HTML/JSON) memory report"),
    "open": (open_snapshot, "a real run's PyTorch memory snapshot: categories, OOM explanation, estimate beside it"),
    "calibrate": (calibrate, "measure this machine's GPU and keep a calibration profile for estimates"),
    "diff": (diff, "two estimates or snapshots side by side; --fail-over PCT: a memory guard for CI"),
}


class _Parser(argparse.ArgumentParser):
    """Option mistakes are one line and exit 2, like every other mistake (`--help` still shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {shown(message)} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vramscope", description="Will this fit on my GPU? VRAMScope answers.")
    p.add_argument("--version", action="version", version=f"VRAMScope {__version__}")
    p.add_argument("--screenshot", metavar="PATH", help="render the main window headless to PNG and exit")
    sub = p.add_subparsers(dest="command")
    for name, (command, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        command.add_arguments(sp)
        sp.set_defaults(_run=command.run)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command:
        from engine.core.errors import UserError

        try:
            return int(args._run(args) or 0)
        except UserError as e:
            print(f"error: {shown(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except SystemExit as e:  # user code that exits past the engine's guards: never a silent status
            print(f"error: the command was ended by sys.exit({e.code!r}) inside the model's code", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `... | head` closed the pipe: nothing more to say
            sys.stdout = open(os.devnull, "w")
            return 0
    from gui.app import run_app

    return run_app(screenshot=args.screenshot)


if __name__ == "__main__":
    import multiprocessing

    multiprocessing.freeze_support()  # the app's engine process, inside a PyInstaller bundle
    sys.exit(main())
