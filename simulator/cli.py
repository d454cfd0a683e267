"""The ``servesim`` command.

Subcommands are small functions in their own modules; this file only parses arguments and turns
user errors (`ConfigError`) into one line on stderr and exit code 2, never a traceback. ``profile``
and ``validate`` belong to the profiler package and are run through `simulator.commands` (the
simulator does not import the profiler).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.argtypes import (
    fraction_open,
    fraction_upper_closed,
    nonnegative_int,
    positive_float,
    positive_int,
)
from simulator.errors import ConfigError


def cmd_run(args) -> int:
    from simulator.config import apply_overrides, blame_overrides, folder_name, load_yaml
    from simulator.files import check_out_dir
    from simulator.results import format_summary, write_config, write_results
    from simulator.runner import build

    path = Path(args.file)
    if args.out:
        check_out_dir(args.out)
    config = apply_overrides(load_yaml(path), args.set or [])
    if config.get("sweep") or len(config.get("seeds") or []) > 1:
        print(
            f"servesim: note: {path} has a sweep/seeds block; `run` runs its base point only "
            "(use `servesim sweep` for the grid)",
            file=sys.stderr,
        )
    config = {k: v for k, v in config.items() if k not in ("sweep", "seeds", "regress")}
    name = folder_name(config, path.stem)
    try:
        with blame_overrides(str(path), args.set):
            built = build(config, str(path), path.parent, seed=args.seed)
    except ConfigError as e:
        _write_failed(Path(args.out) if args.out else Path("results") / name / "failed", config, e)
        raise
    out = check_out_dir(args.out or Path("results") / built.name / f"seed{built.seed}")
    write_config(out, built.resolved)
    results = _simulate_with_progress(built, args.quiet)
    write_results(out, results, write_steps=not args.no_steps)
    if not args.quiet:
        print(format_summary(results.summary, built.name))
        print(f"results: {out}  (simulated in {results.wall_s:.2f} s)")
    return 0


def _simulate_with_progress(built, quiet: bool):
    """Simulate; on a terminal (not --quiet, not CI) with a live progress line on stderr."""
    from simulator.progress import RunProgress, wanted
    from simulator.runner import simulate

    if not wanted(quiet):
        return simulate(built)
    bar = RunProgress(len(built.workload.requests))
    try:
        return simulate(built, progress=bar)
    finally:
        bar.close()


def _write_failed(out: Path, config: dict, error: ConfigError) -> None:
    """Keep the config as given and the error beside it; a folder that cannot be written is
    skipped (the user's error is the one to report, not this one)."""
    from simulator.results import write_config, write_error

    try:
        write_config(out, {"as_given": config})
        write_error(out, error.one_line())
    except OSError:
        pass


def cmd_sweep(args) -> int:
    from simulator.config import apply_overrides, blame_overrides, folder_name, load_yaml
    from simulator.files import check_out_dir
    from simulator.sweeprun import run_sweep

    path = Path(args.file)
    if args.out:
        check_out_dir(args.out)
    config = apply_overrides(load_yaml(path), args.set or [])
    name = folder_name(config, path.stem)
    out = check_out_dir(args.out or Path("results") / name)
    with blame_overrides(str(path), args.set):
        index = run_sweep(
            config, str(path), path.parent, out, jobs=args.jobs, backend=args.backend,
            address=args.address, progress=not args.quiet, overrides=args.set,
        )  # fmt: skip
    failed = index[index["status"] == "failed"]
    print(f"sweep: {len(index)} runs, {len(failed)} failed; index: {out / 'index.csv'}")
    for _, row in failed.iterrows():
        print(f"  failed {row['folder']}: {row['error']}")
    errors = set(failed["error"])
    if len(failed) == len(index) and len(errors) == 1:  # the experiment itself is bad
        print(f"servesim: error: every run failed the same way: {errors.pop()}", file=sys.stderr)
        return 2
    return 1 if len(failed) else 0


def cmd_plot(args) -> int:
    from simulator.plots import plot_results

    out = Path(args.out) if args.out else Path(args.results) / "plots"
    for f in plot_results(Path(args.results), out, at_rate=args.at, run=args.run):
        print(f)
    return 0


def cmd_compare(args) -> int:
    from simulator.compare import compare

    print(compare(Path(args.a), Path(args.b), resamples=args.resamples, seed=args.seed,
                  level=args.level))  # fmt: skip
    return 0


def cmd_capacity(args) -> int:
    from simulator.capacity import capacity_cli

    return capacity_cli(args)


def cmd_plan(args) -> int:
    from simulator.planner import plan_cli

    return plan_cli(args)


def cmd_timeline(args) -> int:
    from simulator.timeline import write_timeline

    run = Path(args.run)
    out = Path(args.out) if args.out else run / "timeline.json"
    n = write_timeline(run, out)
    print(f"{out}: {n} events (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_regress(args) -> int:
    from simulator.regress import regress_cli

    return regress_cli(args)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="servesim",
        description="Discrete-event simulator of LLM serving. `servesim COMMAND --help` lists "
        "a command's options.",
        epilog="A bad input (file, key or option) is one line on stderr naming it, exit code 2.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="simulate one experiment YAML")
    run.add_argument("file", help="experiment YAML (see README: one section per concern)")
    run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    run.add_argument("--out", help="results folder (default results/<name>/seed<N>)")
    run.add_argument("--seed", type=nonnegative_int, help="override the experiment's seed (>= 0)")
    run.add_argument("--no-steps", action="store_true", help="do not write steps.csv")
    run.add_argument("--quiet", action="store_true", help="print nothing (no summary, no progress)")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run every point of an experiment's sweep: and seeds:")
    sw.add_argument("file", help="experiment YAML with a sweep: and/or seeds: block")
    sw.add_argument("--jobs", "-j", type=positive_int, default=1, help="parallel runs (default 1)")
    sw.add_argument("--out", help="sweep folder (default results/<name>)")
    sw.add_argument("--backend", choices=["local", "ray"], default="local",
                    help="local processes (default) or a Ray cluster")  # fmt: skip
    sw.add_argument("--address", help="Ray cluster address to join (default: a local instance)")
    sw.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.set_defaults(func=cmd_sweep)

    _results_parsers(sub)
    _capacity_parser(sub)
    _plan_parser(sub)

    tl = sub.add_parser("timeline", help="export a run as a Chrome/Perfetto trace JSON")
    tl.add_argument("run", help="a run folder (with steps.csv and requests.csv)")
    tl.add_argument("--out", help="output file (default RUN/timeline.json)")
    tl.set_defaults(func=cmd_timeline)

    rg = sub.add_parser("regress", help="re-run the CI subset and compare with baselines")
    rg.add_argument("experiments", help="folder of experiment YAMLs (those with a regress: key)")
    rg.add_argument("--baseline", required=True, help="folder of baseline JSON files")
    rg.add_argument("--update", action="store_true", help="rewrite the baselines")
    rg.add_argument("--tolerance-file", help="YAML of per-metric tolerances")
    rg.add_argument("--only", action="append", help="run only this experiment (by file stem)")
    rg.add_argument("--jobs", "-j", type=positive_int, default=1, help="parallel runs (>= 1)")
    rg.set_defaults(func=cmd_regress)

    sub.add_parser(
        "profile",
        help="profile GPU kernels into latency tables (needs torch+CUDA; `--engine vllm`: whole "
        "steps through vLLM); `profile report DIR`, `profile diff OLD NEW` and `profile "
        "tables` (every engine table's held-out error) read tables without a GPU",
    )
    sub.add_parser(
        "validate",
        help="run an experiment simulated and on a real GPU; report error (`--engine vllm`: "
        "against real vLLM serving, or a stored vLLM run with --real)",
    )
    return p


#: subcommands other packages declare (`simulator.commands`); listed here for ``--help`` only
EXTERNAL_COMMANDS = ("profile", "validate")

SET_HELP = "override a key of the YAML, value parsed as YAML (repeatable)"


def _results_parsers(sub) -> None:
    """Subcommands that read saved results: plot and compare."""
    pl = sub.add_parser("plot", help="plot saved results (a sweep folder or a run folder)")
    pl.add_argument("results", help="a sweep folder (with index.csv) or one run folder")
    pl.add_argument("--out", help="folder for the figures (default RESULTS/plots)")
    pl.add_argument("--at", type=positive_float, help="rate of the CDF plots (default: middle)")
    pl.add_argument("--run", help="run folder for the time-series plot (default: highest rate)")
    pl.set_defaults(func=cmd_plot)

    cp = sub.add_parser("compare", help="side-by-side metrics of two runs (or seed sets)")
    cp.add_argument("a", help="first run folder, seed set (seedN/ folders) or sweep folder")
    cp.add_argument("b", help="second one, compared against the first")
    cp.add_argument("--resamples", type=positive_int, default=10000,
                    help="bootstrap resamples (>= 1, default 10000)")  # fmt: skip
    cp.add_argument("--level", type=fraction_open, default=0.95,
                    help="confidence level, in (0, 1) (default 0.95)")  # fmt: skip
    cp.add_argument("--seed", type=nonnegative_int, default=0, help="bootstrap seed (>= 0)")
    cp.set_defaults(func=cmd_compare)


def _capacity_parser(sub) -> None:
    ca = sub.add_parser("capacity", help="highest arrival rate that meets SLOs, per policy")
    ca.add_argument("file", help="experiment YAML whose arrival rate is searched")
    ca.add_argument(
        "--slo",
        action="append",
        required=True,
        metavar="METRIC_pNN=SECONDS",
        help="e.g. ttft_p95=0.5 (repeat for several)",
    )
    ca.add_argument("--target", type=fraction_upper_closed, default=0.9,
                    help="SLO attainment needed, in (0, 1] (0.9)")  # fmt: skip
    ca.add_argument("--policies", help="comma-separated policies (default: the file's)")
    ca.add_argument("--max-requests", type=positive_int, default=1000, help="requests per run")
    ca.add_argument("--tolerance", type=positive_float, default=0.02,
                    help="relative rate precision (> 0, default 0.02)")  # fmt: skip
    ca.add_argument("--max-runs", type=positive_int, default=30, help="runs per policy at most")
    ca.add_argument("--jobs", "-j", type=positive_int, default=1, help="policies in parallel")
    ca.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_HELP)
    ca.set_defaults(func=cmd_capacity)


def _plan_parser(sub) -> None:
    pl = sub.add_parser("plan", help="cheapest deployment (GPU, TP, precision, replicas, knobs) "
                        "that meets p95 SLOs at a target rate")  # fmt: skip
    pl.add_argument("file", help="plan YAML: base experiment, target rate, SLOs, space, search")
    pl.add_argument("--jobs", "-j", type=positive_int, default=1,
                    help="units searched in parallel (>= 1, default 1)")  # fmt: skip
    pl.add_argument("--backend", choices=["local", "ray"], default="local",
                    help="local processes (default) or Ray, as for sweep")  # fmt: skip
    pl.add_argument("--address", help="Ray cluster address to join (default: a local instance)")
    pl.add_argument("--out", help="plan folder (default results/<plan name>)")
    pl.add_argument(
        "--resume", action="store_true", help="reuse earlier searches in --out with the same inputs"
    )
    pl.add_argument("--quiet", action="store_true", help="no per-unit progress lines on stderr")
    pl.set_defaults(func=cmd_plan)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in EXTERNAL_COMMANDS:
            from simulator.commands import run_command

            return run_command(argv[0], argv[1:])
        args = make_parser().parse_args(argv)
        return args.func(args)
    except ConfigError as e:
        print(f"servesim: error: {e.one_line()}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
