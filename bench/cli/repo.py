"""`bench results …` (a results repository: runners/results_repo.py) and `bench publish` (its
static leaderboard: leaderboard/site.py). A refusal is a BenchError: the root command prints it
as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from bench.cli import _progress, app, out

results_app = typer.Typer(help="A results repository: bundles anyone can submit and anyone can check.",
                          no_args_is_help=True)
app.add_typer(results_app, name="results")


@results_app.command("init")
def results_init(repo: Path = typer.Argument(..., help="The folder (a git repository's, or a new one).")):
    """Make an empty results repository: index.json, bundles/, keys/ (the keyring) and a .gitignore."""
    from runners.results_repo import init

    init(repo)
    out.print(f"results repository at {repo}: add public keys to {repo / 'keys'} (NAME.pub) to accept only signed "
              "bundles", highlight=False)


@results_app.command("keygen")
def results_keygen(name: str = typer.Argument(..., help="The signer's name (what pages show)."),
                   out_dir: Path = typer.Option(Path("."), "--out", help="Where to write NAME.key and NAME.pub.")):
    """A new ed25519 key pair: NAME.key signs bundles (keep it private), NAME.pub goes into a results
    repository's keys/."""
    from bench.signing import new_key

    key, pub = new_key(name, out_dir)
    out.print(f"{key} (private: `bench runs export … --sign {key}`), {pub} (public: copy it to a results "
              "repository's keys/)", highlight=False)


@results_app.command("add")
def results_add(bundle: Path = typer.Argument(..., help="A bundle from `bench runs export`."),
                repo: Path = typer.Option(..., help="The results repository."),
                verify: str = typer.Option("claimed", help="What to re-run before adding: claimed (nothing), first "
                                           "(each run's first 3 steps), window (each run's deciding window, from the "
                                           "checkpoint the bundle carries), full (every step)."),
                device: Optional[str] = typer.Option(None, help="Where to re-run (default: the device each run "
                                                     "recorded)."),
                as_json: bool = typer.Option(False, "--json")):
    """Validate a bundle (as `bench runs import`, against the repository's runs), check its signature
    against the repository's keyring, re-run what --verify asks, and add it with its verification
    level. A refused bundle (bad input, an identity change, a bad signature, a re-run that differs)
    changes nothing: exit 2."""
    from runners.results_repo import add

    if verify == "claimed":
        entry = add(repo, bundle, verify, device)
    else:
        with _progress(f"re-running ({verify})") as prog:
            task = prog.add_task("steps", total=None, rate="")
            entry = add(repo, bundle, verify, device,
                        progress=lambda step, total, m: prog.update(task, completed=step, total=total))
    if as_json:
        out.print_json(json.dumps(entry, default=str))
        return
    checked = ", ".join(f"{v['run']} steps {v['window_start'] + 1}–{v['steps']} {v['verdict']}"
                        for v in entry["verifications"]) or "nothing re-run (claimed)"
    out.print(f"added {bundle} as {entry['file']}: {len(entry['runs'])} run(s), signed by "
              f"{entry['signer'] or 'nobody'}; {checked}", highlight=False)


@app.command()
def publish(results: Path = typer.Option(..., help="The results repository."),
            out_dir: Path = typer.Option(..., "--out", help="The folder to write the static site to."),
            title: str = typer.Option("bench leaderboard", help="The site's title.")):
    """Write a static leaderboard (HTML, no server) of a results repository: the ranking, the precision
    grid, each run's verdict with its evidence, verification level, signer, curves and mismatch; the
    paper's reference rows apart. Any static host serves the folder."""
    from leaderboard.site import write_site
    from runners.results_repo import read_index, signers, store_url

    index = read_index(results)
    url = store_url(results)                         # re-checks every bundle's file and signature
    pages = write_site(url, out_dir, title, signers=signers(index))
    out.print(f"{out_dir / 'index.html'}: {pages} page(s)", highlight=False)
