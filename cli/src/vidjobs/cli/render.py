"""The commands for people who render, built on the Python client: `render`, `jobs ...`, `account`, `models`,
`login` and `logout`. They talk to the API only, never to the database, so they work against any deployment.

What a command exists to give (a job id, a path, JSON) goes to stdout; the live stage line, progress bars and
notes go to stderr, and only when it is a terminal.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from functools import wraps
from itertools import islice
from pathlib import Path
from typing import Any, TypeAlias

import msgspec

from vidjobs.cli import profile, show
from vidjobs.cli.exitcodes import Exit
from vidjobs.common.errors import ConfigError
from vidjobs_client import (
    APIError,
    ChecksumMismatch,
    Client,
    ConnectionFailed,
    JobNotReady,
    RetryPolicy,
    UploadRejected,
    VidjobsError,
    WaitTimeout,
)
from vidjobs_client.models import Job, JobOptions

Handler = Callable[[argparse.Namespace], Exit]
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what add_subparsers returns


def said_retry(reason: str, wait: float) -> None:
    show.err.print(f"[dim]vidjobs: {escape_text(reason)}; trying again in {wait:.1f} s[/]")


def escape_text(text: str) -> str:
    return text.replace("[", r"\[")


def _client(args: argparse.Namespace) -> Client:
    chosen = profile.resolve(args.url, args.api_key)
    return Client(chosen.url, chosen.api_key, retry=RetryPolicy(on_retry=said_retry))


def reporting(handler: Handler) -> Callable[[argparse.Namespace, Any], int]:
    """The handler, with the client's errors turned into a message on stderr and an exit status."""

    @wraps(handler)
    def run(args: argparse.Namespace, _settings: Any = None) -> int:
        try:
            return handler(args)
        except (APIError, UploadRejected) as exc:
            show.err.print(f"vidjobs: {escape_text(str(exc))}")
            return Exit.API_ERROR
        except ConnectionFailed as exc:
            show.err.print(f"vidjobs: cannot reach the API: {escape_text(str(exc))}; is it running "
                           "(`vidjobs up`), and is the URL right (--url, VIDJOBS_URL, `vidjobs login`)?")
            return Exit.UNREACHABLE
        except ChecksumMismatch as exc:
            show.err.print(f"vidjobs: {escape_text(str(exc))}; download it again")
            return Exit.BAD_DOWNLOAD
        except JobNotReady as exc:
            show.err.print(f"vidjobs: {exc}")
            return Exit.JOB_FAILED
        except WaitTimeout as exc:
            show.err.print(f"vidjobs: {exc}; `vidjobs jobs watch ID` follows it again")
            return Exit.TIMED_OUT
        except (ConfigError, VidjobsError) as exc:
            show.err.print(f"vidjobs: {escape_text(str(exc))}")
            return Exit.USAGE

    return run


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


def _param(text: str) -> tuple[str, Any]:
    key, value = _pair(text)
    try:  # a number, true/false or JSON where it parses as one; else the text itself
        return key, msgspec.json.decode(value)
    except msgspec.DecodeError:
        return key, value


def _connection_flags() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--url", help="the API (VIDJOBS_URL, else `vidjobs login`'s, else " + profile.DEFAULT_URL + ")")
    parent.add_argument("--api-key", help="the API key (VIDJOBS_API_KEY, else `vidjobs login`'s)")
    parent.add_argument("--json", action="store_true", help="JSON on stdout (one object a line), nothing else")
    return parent


def add_commands(sub: Subcommands, epilog: str) -> Subcommands:
    """The commands; returns the `jobs` group's subcommands, which the operator's commands join."""
    common = _connection_flags()

    def command(parent: Subcommands, name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[common], help=text, description=text, epilog=epilog)
        parser.set_defaults(handler=reporting(handler), needs_settings=False)
        return parser

    render = command(sub, "render", _render, "render a video from a prompt, or render a job again (--again)")
    render.add_argument("prompt", metavar="PROMPT", nargs="?")
    render.add_argument("--again", metavar="JOB_ID",
                        help="render that job's request again as a new job (after a render_timeout, say); takes "
                             "no PROMPT or request options")
    render.add_argument("-m", "--model", help="<provider>/<model> (default: the first `vidjobs models` lists)")
    render.add_argument("-d", "--duration", type=int, metavar="S", help="seconds of video")
    render.add_argument("--aspect", choices=["16:9", "9:16", "1:1"], help="aspect ratio")
    render.add_argument("--resolution", choices=["480p", "720p", "1080p"])
    render.add_argument("--seed", type=int)
    render.add_argument("--negative", metavar="TEXT", help="what not to render")
    render.add_argument("--image", metavar="FILE|upl_ID", help="render from this first frame (uploaded first)")
    render.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                        help="a provider extra (repeatable); VALUE is JSON where it parses as JSON")
    render.add_argument("--meta", type=_pair, action="append", default=[], metavar="KEY=VALUE",
                        help="a label of your own (repeatable)")
    render.add_argument("--fallback", action="append", metavar="MODEL", dest="fallbacks",
                        help="a model to move to while it waits, if its provider is down or the wait passes "
                             "--max-wait (repeat for more, in order; default: your account's list)")
    render.add_argument("--no-fallback", action="store_true", help="never move it, whatever your account's default")
    render.add_argument("--max-wait", type=int, metavar="S",
                        help="move to a fallback that starts sooner once its estimated start is S seconds away")
    render.add_argument("--batch", action="store_true",
                        help="queue it behind your waiting interactive jobs (for work nobody is waiting on)")
    render.add_argument("--idempotency-key", metavar="KEY", help="repeat the command safely: same key, same job")
    render.add_argument("-w", "--wait", action="store_true", help="follow the job until it ends")
    render.add_argument("-o", "--output", metavar="PATH", help="save the video here when ready (implies --wait)")
    render.add_argument("--timeout", type=float, metavar="S", help="stop waiting after S seconds")

    jobs = sub.add_parser("jobs", help="your jobs: list, show, watch, cancel, rm, download")
    actions = jobs.add_subparsers(dest="action", required=True)
    listing = command(actions, "list", _list, "your jobs, newest first")
    listing.add_argument("-s", "--status", help="only these statuses, comma-separated (e.g. failed,canceled)")
    listing.add_argument("-m", "--model", help="only jobs of this model")
    listing.add_argument("-L", "--limit", type=int, default=20, help="show at most this many (default 20)")
    for name, handler, text in [("show", _show, "one job"), ("watch", _watch, "follow a job until it ends"),
                                ("cancel", _cancel, "cancel a job")]:
        one = command(actions, name, handler, text)
        one.add_argument("job_id", metavar="JOB_ID")
        if name == "watch":
            one.add_argument("--timeout", type=float, metavar="S", help="stop watching after S seconds")
    remove = command(actions, "rm", _remove, "delete jobs and their files")
    remove.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    download = command(actions, "download", _download, "save a job's video, checked against its sha256")
    download.add_argument("job_id", metavar="JOB_ID")
    download.add_argument("-o", "--output", metavar="PATH", help="a file or folder (default ./<job id>.mp4)")
    download.add_argument("--part", choices=["video", "thumbnail", "preview"], default="video")

    command(sub, "account", _account, "your account: credit, limits, jobs under way")
    command(sub, "models", _models, "the models you can render with, and their prices")
    login = command(sub, "login", _login, "check an API key and remember it (and the URL) for later commands")
    login.add_argument("--with-token", action="store_true", help="read the key from stdin")
    logout = sub.add_parser("logout", help="forget the remembered key", epilog=epilog)
    logout.set_defaults(handler=reporting(_logout), needs_settings=False)
    return actions


def _emit(args: argparse.Namespace, value: object, plain: str) -> None:
    if args.json:
        show.json_line(value)
    else:
        print(plain)


def _options(vj: Client, args: argparse.Namespace) -> JobOptions:
    options: JobOptions = {}
    for flag, field in [("duration", "duration_s"), ("aspect", "aspect_ratio"), ("resolution", "resolution"),
                        ("seed", "seed"), ("negative", "negative_prompt")]:
        if getattr(args, flag) is not None:
            options[field] = getattr(args, flag)  # type: ignore[literal-required]
    if args.param:
        options["params"] = dict(args.param)
    if args.meta:
        options["metadata"] = dict(args.meta)
    if args.no_fallback or args.fallbacks:
        options["fallback_models"] = [] if args.no_fallback else list(args.fallbacks)
    if args.max_wait is not None:
        options["max_wait_s"] = args.max_wait
    if args.batch:
        options["priority"] = "batch"
    if args.image:
        options["input_image"] = args.image if args.image.startswith("upl_") else _upload(vj, Path(args.image))
    return options


def _upload(vj: Client, path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"--image {path}: no such file (give an image file, or an upl_ id from an earlier upload)")
    upload = vj.upload(path)  # waits until the server has decoded it: a job may name only a ready upload
    if show.interactive():
        show.err.print(f"[dim]uploaded {escape_text(path.name)} as {upload.id} ({upload.width}x{upload.height})[/]")
    return upload.id


def _default_model(vj: Client) -> str:
    models = vj.list_models()
    if not models:
        raise ConfigError("this deployment lists no models; name one with --model")
    if show.interactive():
        show.err.print(f"[dim]model {models[0].id} (--model picks another; `vidjobs models` lists them)[/]")
    return models[0].id


def _follow(vj: Client, job: Job, args: argparse.Namespace, *, every_change: bool = False) -> Job:
    """The job once it ended, shown live on a terminal (or, with `every_change`, as JSON lines)."""
    if job.finished:
        return job
    if args.json and every_change:
        return vj.wait(job.id, timeout_s=args.timeout, on_change=show.json_line)
    if not show.interactive() or args.json:
        return vj.wait(job.id, timeout_s=args.timeout)
    with show.StageLine(job.id) as line:
        line.update(job)
        return vj.wait(job.id, timeout_s=args.timeout, on_change=line.update)


def _save(vj: Client, job: Job, output: str | None, part: str = "video") -> Path:
    if not show.interactive():
        return vj.download(job, output, part=part)  # type: ignore[arg-type]
    with show.Transfer(job.id) as bar:
        return vj.download(job, output, part=part, on_progress=bar.update)  # type: ignore[arg-type]


def _ended(vj: Client, job: Job, args: argparse.Namespace, *, output: str | None = None,
           json_result: bool = True) -> Exit:
    """Say how the job ended (and save its video if asked); the exit status says whether it worked out."""
    if not job.succeeded:
        show.err.print(escape_text(show.failure(job)))
        if args.json and json_result:
            show.json_line(job)
        return Exit.JOB_FAILED
    path = _save(vj, job, output) if output else None
    if args.json and json_result:
        show.json_line(job)
    elif not show.interactive():
        print(path or job.id)
    else:
        o = job.outputs
        size = f"{o.width}x{o.height}, {o.duration_s:g} s" if o else ""
        show.out.print(f"[green]ready[/] {job.id} ({size}, {job.cost.actual_credits} credits)"
                       + (f" saved to {escape_text(str(path))}" if path else f"; `vidjobs jobs download {job.id}`"))
    return Exit.OK


# What `--again` takes from the job it renders again, so none of these may be given beside it.
_REQUEST_FLAGS = {"prompt": "PROMPT", "model": "--model", "duration": "--duration", "aspect": "--aspect",
                  "resolution": "--resolution", "seed": "--seed", "negative": "--negative", "image": "--image",
                  "param": "--param", "meta": "--meta", "fallbacks": "--fallback", "no_fallback": "--no-fallback",
                  "max_wait": "--max-wait", "batch": "--batch"}


def _made(vj: Client, args: argparse.Namespace) -> Job:
    """The job the command makes: a new one from PROMPT and the options, or (--again) a rerun of one."""
    if args.again is None:
        if not args.prompt:
            raise ConfigError("give a PROMPT, or --again JOB_ID to render a job again")
        options = _options(vj, args)
        model = args.model or _default_model(vj)
        return vj.create_job(model, args.prompt, idempotency_key=args.idempotency_key, **options)
    given = [flag for name, flag in _REQUEST_FLAGS.items() if getattr(args, name)]
    if given:
        raise ConfigError(f"--again renders {args.again}'s own request; drop {', '.join(given)}")
    job = vj.rerun_job(args.again, idempotency_key=args.idempotency_key)
    if show.interactive():
        show.err.print(f"[dim]{job.id} renders {escape_text(args.again)} again[/]")
    return job


def _render(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        job = _made(vj, args)
        if not (args.wait or args.output or args.timeout):
            _emit(args, job, plain=job.id)
            return Exit.OK
        return _ended(vj, _follow(vj, job, args), args, output=args.output)


def _list(args: argparse.Namespace) -> Exit:
    filters: dict[str, Any] = {"limit": max(1, min(args.limit, 100))}
    if args.status:
        filters["status"] = args.status
    if args.model:
        filters["model"] = args.model
    with _client(args) as vj:
        jobs = list(islice(vj.iter_jobs(**filters), max(0, args.limit)))
    if args.json:
        for job in jobs:
            show.json_line(job)
    elif show.interactive():
        show.job_table(jobs)
    else:
        for job in jobs:
            print("\t".join([job.id, job.status, job.stage, job.model, job.created_at.isoformat()]))
    return Exit.OK


def _show(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        job = vj.get_job(args.job_id)
    if args.json:
        show.json_line(job)
    else:
        show.job_details(job)
    return Exit.OK


def _watch(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        job = _follow(vj, vj.get_job(args.job_id), args, every_change=True)
        return _ended(vj, job, args, json_result=False)


def _cancel(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        job = vj.cancel_job(args.job_id)
    _emit(args, job, plain=f"{job.id} {job.status}")
    return Exit.OK


def _remove(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        for job_id in args.job_ids:
            vj.delete_job(job_id)
            _emit(args, {"id": job_id, "deleted": True}, plain=f"{job_id} deleted")
    return Exit.OK


def _download(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        path = _save(vj, vj.get_job(args.job_id), args.output, args.part)
    _emit(args, {"id": args.job_id, "path": str(path)}, plain=str(path))
    return Exit.OK


def _account(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        account = vj.account()
    if args.json:
        show.json_line(account)
        return Exit.OK
    c, limits = account.credits, account.limits
    print(f"{account.name} ({account.id})\n"
          f"credit: {c.available} available ({c.balance} balance, {c.reserved} reserved); {account.spent_today} "
          f"spent today{'' if limits.daily_spend_cap is None else f' of {limits.daily_spend_cap}'}\n"
          f"jobs: {account.active_jobs} under way, {account.queued_jobs} waiting; {limits.concurrent_jobs} "
          f"render at once")
    return Exit.OK


def _models(args: argparse.Namespace) -> Exit:
    with _client(args) as vj:
        models = vj.list_models()
    for model in models:
        if args.json:
            show.json_line(model)
            continue
        prices = ", ".join(f"{res} {price:g}/s" for res, price in model.credits_per_second.items() if price)
        lengths = show.spans(model.durations_s)
        print(f"{model.id}\t{lengths} s\t{prices or 'unpriced'}")
    return Exit.OK


def _key_for_login(args: argparse.Namespace) -> str:
    if args.api_key:
        return str(args.api_key)
    if args.with_token:
        return sys.stdin.readline().strip()
    if sys.stdin.isatty():
        return getpass.getpass("API key (vj_...): ").strip()
    raise ConfigError("give the key with --api-key, or pipe it in with --with-token")


def _login(args: argparse.Namespace) -> Exit:
    url = args.url or profile.resolve_url()
    key = _key_for_login(args)
    if not key:
        raise ConfigError("an empty API key")
    with Client(url, key, retry=RetryPolicy(on_retry=said_retry)) as vj:
        account = vj.account()  # a key the API refuses is not saved
    path = profile.save(profile.Profile(url=url, api_key=key))
    show.err.print(f"logged in to {url} as {escape_text(account.name)} ({account.id}); saved in {path}")
    if args.json:
        show.json_line({"url": url, "account_id": account.id, "config": str(path)})
    return Exit.OK


def _logout(args: argparse.Namespace) -> Exit:
    path = profile.forget()
    show.err.print(f"forgot the key in {path}" if path else "no key was remembered")
    return Exit.OK
