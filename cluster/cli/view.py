"""`rayeval view`: a report page for a run, a sweep, or two runs compared."""

from __future__ import annotations

import argparse
from pathlib import Path

from cluster.cli.judge_choice import add_judge_choice, add_prompt_choice, add_version_choice, compare_options

EPILOG = """examples:
  rayeval view runs/qwen-gsm8k                 # runs/qwen-gsm8k/report/index.html
  rayeval view runs/sweep-sft --open           # a sweep: curves by step, each step's page linked
  rayeval view runs/base runs/tuned            # the paired comparison, and the questions where they differ
The page is one file with its data inline: it opens from file://, from a static folder on object storage,
or from a CI artifact, with no server and no network."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="write a report page for a run, a sweep, or two runs compared (static HTML, no server)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "folders", nargs="+", metavar="RUN_DIR", help="a run or sweep folder; two run folders compare"
    )
    p.add_argument(
        "--open", action="store_true", help="open the page in this machine's browser, where one exists"
    )
    p.add_argument(
        "--output",
        "--out",
        dest="out",
        type=Path,
        metavar="DIR",
        help="where a comparison's page goes (default: under RUN_A); --out is the same flag",
    )
    p.add_argument(
        "--level", type=float, default=0.05, help="a comparison's significance level (default 0.05)"
    )
    add_judge_choice(
        p,
        "A and B",
        judge_help="a run judged by several judges: whose verdicts to show (default: the latest judge's, as in "
        "summary.json); a comparison pairs this judge's verdicts, as `rayeval compare --judge`",
    )
    add_prompt_choice(p)
    add_version_choice(p, "the two runs")
    p.set_defaults(handler=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from cluster.cli.output_paths import output_folder, written
    from cluster.storage import readable_folder
    from evaluators.errors import EvalInputError
    from evaluators.view import is_sweep_folder, write_comparison_report, write_run_report, write_sweep_report

    if len(args.folders) > 2:
        raise EvalInputError(
            f"rayeval view takes one folder, or two run folders to compare (got {len(args.folders)})"
        )
    options = compare_options(args)
    if args.out and len(args.folders) == 1:
        raise EvalInputError(
            "--output is where a comparison's page goes; a run's or a sweep's page goes in its folder's report/"
        )
    out = output_folder(args.out, "--output") if args.out else None
    folders = [Path(readable_folder(f)) for f in args.folders]
    for folder in folders:
        if not folder.is_dir():
            raise EvalInputError(
                f"{folder} is not a folder: give a run folder (with summary.json) or a sweep's"
            )
    if len(folders) == 2:
        with written(out or folders[0], "--output"):
            page = write_comparison_report(folders[0], folders[1], out, options, args.judge)
    elif is_sweep_folder(folders[0]):
        page = write_sweep_report(folders[0])
    else:
        page = write_run_report(folders[0], args.judge)
    print(page)
    if not args.out:
        _upload_pages(args.folders[0], folders[0], page)
    if args.open:
        _open(page)
    return 0


def _upload_pages(given: str, local: Path, page: Path) -> None:
    """A folder on object storage gets its pages beside its files (a sweep's steps' too), so the folder served
    as static files shows them; the URI of the page is printed."""
    from cluster.storage import FolderMirror, RemoteFolder, is_remote

    if not is_remote(given):
        return
    remote = RemoteFolder.parse(given, "the folder")
    pages = tuple(p.parent.relative_to(local).as_posix() for p in local.glob("**/report/**/index.html"))
    FolderMirror(local, remote).push(final=True, only=pages)
    print(f"{remote.uri.rstrip('/')}/{page.relative_to(local).as_posix()}")


def _open(page: Path) -> None:
    import webbrowser

    try:
        webbrowser.get()
    except webbrowser.Error:
        print("no browser on this machine: open the file above where one is (it is self-contained)")
        return
    webbrowser.open(page.resolve().as_uri())
