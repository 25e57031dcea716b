"""python -m pipeline {repro,serve,report,status}

  repro   run the DAG (`dvc repro`) as a Prefect flow with one shared API server
  serve   deploy the repro flow on a cron schedule (needs a running server: make server)
  report  this version's metrics, and their diff against a git revision
  status  which stages are stale (`dvc status`)
"""

from __future__ import annotations

import argparse
import os
import sys


def _repro(args: argparse.Namespace) -> int:
    from pipeline.flows import expected_errors, prefect_server

    with expected_errors():
        from pipeline.config import validate_all

        validate_all()  # fail on bad params before a server starts
    with prefect_server() as api_url:
        # Set before Prefect is imported, so this process and every stage process DVC spawns use it.
        os.environ["PREFECT_API_URL"] = api_url
        from pipeline.orchestrate import repro_flow

        with expected_errors():
            repro_flow(targets=args.targets, force=args.force, pull=args.pull, push=args.push)
    return 0


def _serve(args: argparse.Namespace) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set; start a server first (make server)", file=sys.stderr)
        return 2
    from pipeline.orchestrate import repro_flow

    repro_flow.serve(name=args.name, cron=args.cron, parameters={"pull": args.pull, "push": args.push})
    return 0


def _report(args: argparse.Namespace) -> int:
    from pipeline.orchestrate import diff_markdown, metrics_rows, models_markdown
    from pipeline.report import decoding_markdown, generalisation_markdown, load_evaluations

    for row in metrics_rows():
        print(f"{row['file']:40s} {row['metric']:40s} {row['value']}")
    print()
    print(models_markdown())
    print()
    evaluations = load_evaluations()
    print(decoding_markdown(evaluations))
    print()
    print(generalisation_markdown(evaluations))
    print()
    print(diff_markdown(args.rev))
    return 0


def _status(args: argparse.Namespace) -> int:
    from pipeline.orchestrate import dvc

    return dvc("status").returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    repro = sub.add_parser("repro", help="run dvc repro as a Prefect flow")
    repro.add_argument("targets", nargs="*", help="stages to reproduce (default: all)")
    repro.add_argument("--force", action="store_true", help="re-run stages even when nothing changed")
    repro.add_argument("--pull", action="store_true", help="dvc pull before reproducing")
    repro.add_argument("--push", action="store_true", help="dvc push after reproducing")
    serve = sub.add_parser("serve", help="deploy the repro flow on a schedule")
    serve.add_argument("--cron", default="0 3 * * *", help="cron schedule (default: daily at 03:00)")
    serve.add_argument("--name", default="scheduled-repro", help="deployment name")
    serve.add_argument("--pull", action="store_true")
    serve.add_argument("--push", action="store_true")
    report = sub.add_parser("report", help="metrics and their diff against a revision")
    report.add_argument("--rev", default="HEAD", help="git revision to compare with (default: HEAD)")
    sub.add_parser("status", help="dvc status")
    args = parser.parse_args(argv)
    return {"repro": _repro, "serve": _serve, "report": _report, "status": _status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
