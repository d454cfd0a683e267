"""The ``servesim`` command.

Subcommands are small functions in their own modules; this file only parses arguments and turns
user errors (`ConfigError`) into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.errors import ConfigError


def cmd_run(args) -> int:
    from simulator.config import apply_overrides, load_yaml
    from simulator.results import format_summary, write_config, write_error, write_results
    from simulator.runner import build, simulate

    path = Path(args.file)
    config = apply_overrides(load_yaml(path), args.set or [])
    name = config.get("name") if isinstance(config.get("name"), str) else path.stem
    try:
        built = build(config, str(path), path.parent, seed=args.seed)
    except ConfigError as e:
        out = Path(args.out) if args.out else Path("results") / name / "failed"
        write_config(out, {"as_given": config})
        write_error(out, e.one_line())
        raise
    out = Path(args.out) if args.out else Path("results") / built.name / f"seed{built.seed}"
    write_config(out, built.resolved)
    results = simulate(built)
    write_results(out, results, write_steps=not args.no_steps)
    if not args.quiet:
        print(format_summary(results.summary, built.name))
        print(f"results: {out}  (simulated in {results.wall_s:.2f} s)")
    return 0


def cmd_profile(argv: list[str]) -> int:
    from profiles.cli import main as profile_main

    return profile_main(argv)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servesim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one experiment YAML")
    run.add_argument("file")
    run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a key")
    run.add_argument("--out", help="results folder (default results/<name>/seed<N>)")
    run.add_argument("--seed", type=int, help="override the experiment's seed")
    run.add_argument("--no-steps", action="store_true", help="do not write steps.csv")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(func=cmd_run)
    sub.add_parser("profile", help="profile GPU kernels into latency tables (needs torch+CUDA)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "profile":
            return cmd_profile(argv[1:])
        args = make_parser().parse_args(argv)
        return args.func(args)
    except ConfigError as e:
        print(f"servesim: error: {e.one_line()}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
