"""`vespo reproduce paper|paper-long [flags]`: the paper's staleness table (`paper`) and the same table on 128-token
responses with designs git can date (`paper-long`); each resumable, each ending with its verdicts."""

from __future__ import annotations

import datetime
from pathlib import Path

from vespo.argv import ArgumentParser, warn_renamed
from vespo.deadline import sigterm_as_interrupt
from vespo.experiments.grid import interrupted

TABLES = {
    "paper": "the paper's staleness table on the free-length task, a verdict on every ordering it claims",
    "paper-long": "the staleness table on 128-token responses where the updates differ, designs dated by git",
}
RENAMED = {"--staleness": "--num-mini-batches"}


def cli(argv: list[str]) -> int:
    """`vespo reproduce <table> [flags]`: the table's own command line (`paper_cli`, `paper_long_cli`)."""
    if argv and argv[0] in TABLES:
        return paper_cli(argv[1:]) if argv[0] == "paper" else paper_long_cli(argv[1:])
    p = ArgumentParser(prog="vespo reproduce", description="The paper's tables, each resumable, each ending with "
                       "its verdicts. Run `vespo reproduce <table> --help` for its options.")  # fmt: skip
    p.add_argument("table", choices=list(TABLES), help="; ".join(f"{k}: {v}" for k, v in TABLES.items()))
    p.parse_args(argv)  # --help, or one line naming what is wrong (exit 2)
    return 2


def _grid_flags(p: ArgumentParser, variants: list[str], ns_help: str, ns_default: list[int] | None) -> None:
    """The flags both tables share: the grid (--variants, --num-mini-batches) and where it goes."""
    p.add_argument("--variants", nargs="+", default=variants, help="a subset of the preset's (default: the table's)")
    p.add_argument("--num-mini-batches", "--staleness", type=int, nargs="+", default=ns_default,
                   help=f"values of N, the mini-batches per rollout step ({ns_help}; --staleness: old name, "
                   "deprecated)")  # fmt: skip


def paper_cli(argv: list[str]) -> int:
    """`vespo reproduce paper [--seeds ...] [--jobs 1] [--variants ...] [--num-mini-batches ...] [--smoke]
    [--report-only] [--out-dir DIR]`."""
    from vespo.experiments.presets import PAPER_TABLE
    from vespo.experiments.reproduce import paper

    p = ArgumentParser(prog="vespo reproduce paper", description=TABLES["paper"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--jobs", type=int, default=1, help="cells in parallel (one torch thread each)")
    _grid_flags(p, list(PAPER_TABLE), "default 1 4 8 16 64", [1, 4, 8, 16, 64])
    p.add_argument("--out-dir", type=Path, default=paper.OUT, help="where the sweep and its verdicts go")
    p.add_argument("--smoke", action="store_true", help="two tiny cells, in seconds (CI)")
    p.add_argument("--report-only", action="store_true", help="rebuild the verdicts from out-dir's results.csv")
    args = p.parse_args(argv)
    warn_renamed(p.prog, argv, RENAMED)
    try:
        if not args.report_only:
            with sigterm_as_interrupt():
                paper.run(args.out_dir, args.seeds, args.jobs, args.variants, args.num_mini_batches, args.smoke)
        paper.report(args.out_dir)
    except ValueError as exc:  # a bad grid, or an out-dir without results.csv: one line
        p.error(str(exc))
    except KeyboardInterrupt as exc:
        return interrupted(p.prog, exc)
    print((args.out_dir / "verdicts.md").read_text())
    return 0


def _long_parser() -> ArgumentParser:
    from vespo.experiments.presets import PRESETS
    from vespo.experiments.reproduce.designs import DESIGNS
    from vespo.experiments.reproduce.long import OUT
    from vespo.experiments.reproduce.plan import PRESET

    p = ArgumentParser(prog="vespo reproduce paper-long", description=TABLES["paper-long"])
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the preset's (chosen by power)")
    p.add_argument("--jobs", type=int, default=2, help="cells in parallel (one torch thread each)")
    _grid_flags(p, list(PRESETS[PRESET]), "default 4 16 64 128; with --design: its N or a subset", None)
    p.add_argument("--out-dir", type=Path, default=OUT, help="where the sweep, plan and verdicts go")
    p.add_argument("--smoke", action="store_true", help="four tiny cells, in seconds (CI)")
    p.add_argument("--plan-only", action="store_true", help="print (with --design: write once) the design, run nothing")
    p.add_argument("--report-only", action="store_true", help="rebuild the verdicts from out-dir's results")
    p.add_argument("--design", choices=sorted(DESIGNS), default=None,
                   help="a design of its own: --plan-only writes plans/NAME.md once; without it, its cells run once "
                   "that file is committed")  # fmt: skip
    p.add_argument("--until", default=None, metavar="HH:MM",
                   help="with --design: no seed's cells start after this time (UTC, today)")  # fmt: skip
    p.add_argument("--add-results", type=Path, nargs="+", default=[], metavar="DIR",
                   help="out-dirs of slices of the table run separately: their cells and plans join "
                   "out-dir's")  # fmt: skip
    return p


def until_time(text: str | None) -> datetime.datetime | None:
    """`--until HH:MM` as today's time in UTC (None: no limit); a ValueError naming the flag otherwise."""
    if text is None:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
        return datetime.datetime.now(datetime.timezone.utc).replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError:
        raise ValueError(f"--until must be HH:MM (UTC), got {text!r}") from None


def _design(args) -> None:
    """`--design NAME`: write its plan once (`--plan-only`), or run its committed plan's cells, then the report."""
    from vespo.experiments.reproduce.designs import read_text, write_plan
    from vespo.experiments.reproduce.long import report, run_design

    if args.plan_only:
        print(read_text(write_plan(args.out_dir, args.design)), flush=True)
        return
    until = until_time(args.until)
    if not args.report_only:
        run_design(args.out_dir, args.design, args.jobs, args.num_mini_batches, until)
    report(args.out_dir)
    print((args.out_dir / "verdicts.md").read_text())


def _table(args) -> None:
    """The table (or a slice of it): its plan, then its cells (unless --plan-only / --report-only), a merge of
    `--add-results` slices (every input checked before a file is written), and the report."""
    from vespo.experiments.reproduce.long import report
    from vespo.experiments.reproduce.plan import plan_text
    from vespo.experiments.reproduce.slices import config, prepare_merge, run_dir, typed_row
    from vespo.experiments.sweep import sweep, write_tables
    from vespo.outputs import write_atomic

    ns = args.num_mini_batches or [4, 16, 64, 128]
    cfg = config(args.out_dir, args.seeds, args.jobs, args.variants, ns, args.smoke)
    if not (args.report_only or args.plan_only) and (where := run_dir(args.out_dir, cfg)) != args.out_dir:
        print(f"{args.out_dir} holds a table with cells outside this design: it runs in {where} (merge it: "
              f"--report-only --out-dir {args.out_dir} --add-results {where})", flush=True)  # fmt: skip
        args.out_dir = where
        cfg = config(where, args.seeds, args.jobs, args.variants, ns, args.smoke)
    text = plan_text(cfg)
    if args.add_results:  # every input read and checked before any file is written
        rows, text = prepare_merge(args.out_dir, args.add_results)
    print(text, flush=True)
    if args.plan_only:
        return
    if not args.report_only:
        sweep(cfg)
    if args.add_results:  # the union becomes the table's results.csv, results.md and plan.md
        write_tables(args.out_dir, [typed_row(r) for r in rows], eval_prompts=cfg.eval_size * cfg.eval_n)
    if args.add_results or not args.report_only:  # a report alone leaves the slices' designs as they are
        write_atomic(args.out_dir / "plan.md", text)
    report(args.out_dir)
    print((args.out_dir / "verdicts.md").read_text())


def paper_long_cli(argv: list[str]) -> int:
    """`vespo reproduce paper-long [--design NAME] [--plan-only] [--report-only] [--smoke] [--jobs 2] [--until HH:MM]
    [--add-results DIR...] [--seeds ...] [--variants ...] [--num-mini-batches ...] [--out-dir DIR]`."""
    p = _long_parser()
    args = p.parse_args(argv)
    warn_renamed(p.prog, argv, RENAMED)
    try:
        with sigterm_as_interrupt():
            _design(args) if args.design is not None else _table(args)
    except ValueError as exc:
        p.error(str(exc))
    except KeyboardInterrupt as exc:
        return interrupted(p.prog, exc)
    return 0
