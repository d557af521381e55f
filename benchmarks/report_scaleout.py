"""RESULTS.md section 11: scaling out over hosts (issue 17.4), from
benchmarks/results_scaleout.json (scaleout.py). Spliced into RESULTS.md in place of its
previous text, so that a run of scaleout.py alone leaves every other section as it is.

    python -m benchmarks.report_scaleout [results_scaleout.json] [RESULTS.md]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .common import machine_line, size_label, summary
from .report_base import table

HEADING = "## 11. Scaling out over hosts (issue 17)"
GOAL = 1.3  # t(R)/t(0) <= GOAL / R


def _median(case: dict[str, Any], key: str) -> float:
    return float(summary([v[key] for v in case["versions"]])["median"])


def _base(cases: list[dict[str, Any]], case: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (
            c
            for c in cases
            if c["replicas"] == 0 and c["bytes"] == case["bytes"] and c["actors"] == case["actors"]
        ),
        None,
    )


def link_rate(cases: list[dict[str, Any]], case: dict[str, Any]) -> float | None:
    """Bytes per second one link delivered: the primary alone's (R = 0) rate to all
    actors, same size and actor count (its uplink carried every copy)."""
    base = _base(cases, case)
    return None if base is None else base["actors"] * base["bytes"] / _median(base, "all_seconds")


def link_model(cases: list[dict[str, Any]], case: dict[str, Any]) -> float | None:
    """Seconds after the push's return the links alone allow, at ``link_rate``: the
    busiest server's actors' copies (A_max: the most actors one server serves), after,
    for a star of R replicas, the R - 1 copies the primary's link still sends once the
    learner's push is in (it sends one to each replica); a chain forwards one copy per
    link as it arrives, so only A_max remains."""
    rate = link_rate(cases, case)
    if rate is None:
        return None
    served: dict[str, int] = {}
    for _, url in case["placement"]:
        served[url] = served.get(url, 0) + 1
    copies = max(served.values())
    if case["replicas"] > 1 and case.get("topology", "star") == "star":
        copies += case["replicas"] - 1
    return copies * case["bytes"] / rate


def ratio(cases: list[dict[str, Any]], case: dict[str, Any]) -> float | None:
    """t(R)/t(0): median time until every actor holds a version, over the primary
    alone's, same size and actor count."""
    base = _base(cases, case)
    if base is None or not case["replicas"]:
        return None
    return _median(case, "all_seconds") / _median(base, "all_seconds")


def section(results: dict[str, Any]) -> list[str]:
    cases = results.get("cases", [])
    if not cases:
        return []
    m = results["machine"]
    lines = [
        HEADING,
        "",
        f"*{machine_line(m)}; load average {m['load_average'][0]:.1f} when the run "
        f"started, {results.get('load_average_end', [0])[0]:.1f} when it ended.* "
        "`python -m benchmarks.scaleout` (root; [docs/benchmarks.md]"
        "(../docs/benchmarks.md#scaling-out-over-hosts-issue-174)): hosts are network "
        "namespaces on one Linux bridge, each host's link capped at "
        f"{results['rate']} each way with `tc tbf`"
        + (f", {results['delay_ms']} ms netem delay" if results.get("delay_ms") else "")
        + ". A learner host pushes to the primary redis-server's host; R replica hosts, "
        "each replica `--replicaof` the primary (star) or the one before it (chain: r1 "
        "of the primary, r2 of r1, ...); the actors spread evenly over "
        f"{results['actor_hosts']} actor hosts, host aj reading from replica "
        "r((j-1) mod R + 1), or from the primary when R = 0, so that the serving "
        "host's uplink is the link that limits. Each actor loops `wait_for` + "
        "`pull_if_newer` and records when it got each version. "
        + (
            "Actors reached their replica through the primary's URL with the redis "
            "backend's `replicas=` naming it."
            if results.get("connect") == "replicas="
            else "Actors connected to their replica's address."
        ),
        "",
        "Per version, pushed once every actor held the one before: the time from the "
        "push's return until every actor holds it (median over versions, IQR in "
        "brackets); what the links allow: the copies the busiest link still carries "
        "after the push returned (the busiest server's actors', plus R - 1 replication "
        "copies on a star's primary) at the rate one link delivered with R = 0, and the "
        "measured time as a multiple of it (1.00×: the links are the limit, not "
        "varsync); t(R)/t(0) against the goal 1.3/R; the bytes delivered to all actors "
        "per second of that time; each actor's lag in versions when a push returned (1: "
        "it held the version before). Then pushes back to back, none waiting for the "
        "fan-out: the actors' lag at each push, when all held the last one, and how many "
        "of those versions each actor pulled (`pull_if_newer` takes the newest there is when "
        "a pull starts) and how many pulls began again on a newer version. "
        "Every server and process ran on this machine's 2 cores; the load column is "
        "the 1-minute load average during the case.",
        "",
    ]
    lines += _findings(cases) + _cases_table(cases)
    option = results.get("replicas_option")
    if option and option.get("cases"):
        m2 = option["machine"]
        lines += [
            "### The same through the redis backend's `replicas=`",
            "",
            f"*Measured {m2['started']}, load average {m2['load_average'][0]:.1f} "
            f"when it started.* `python -m benchmarks.scaleout --connect replicas= "
            "...`: each actor connects to the primary's URL with `replicas=` naming "
            "its host's replica (issue 17.1), instead of to the replica's address; "
            "the last column counts the `GET`s (chunks) the primary answered from the "
            "actors' start to the last spaced version.",
            "",
        ]
        lines += _cases_table(option["cases"])
    return lines


def _cases_table(cases: list[dict[str, Any]]) -> list[str]:
    """One row per case: R, replication, size, actors."""
    counted = any("primary_gets" in c for c in cases)
    rows = []
    for case in sorted(
        cases,
        key=lambda c: (c["bytes"], c["actors"], c["replicas"], c.get("topology", "star") != "star"),
    ):
        times = summary([v["all_seconds"] for v in case["versions"]])
        rate = summary([v["bytes_per_s"] for v in case["versions"]])
        push = summary([v["push_seconds"] for v in case["versions"]])
        lags = [lag for v in case["versions"] for lag in v["lag_at_push"]]
        r = ratio(cases, case)
        model = link_model(cases, case)
        goal = GOAL / case["replicas"] if case["replicas"] else None
        verdict = "" if r is None or goal is None else ("met" if r <= goal else "missed")
        rows.append(
            [
                size_label(case["bytes"]),
                str(case["actors"]),
                str(case["replicas"]),
                case.get("topology", "star") if case["replicas"] > 1 else "–",
                f"{times['median']:.2f} s ({times['q1']:.2f}–{times['q3']:.2f})",
                f"{model:.2f} s ({times['median'] / model:.2f}×)" if model else "–",
                f"{r:.2f}" if r is not None else "–",
                f"≤ {goal:.2f} {verdict}" if goal else "–",
                f"{rate['median'] / 1e6:.0f} MB/s",
                f"{push['median']:.2f} s",
                f"{summary(lags)['median']:.0f} (max {max(lags)})",
                _back_to_back_cell(case),
                f"{max(v['load_average'] for v in case['versions']):.1f}",
                str(len(case["versions"])),
            ]
            + ([str(case.get("primary_gets", "–"))] if counted else [])
        )
    return table(
        [
            "nest",
            "actors",
            "R",
            "replication",
            "until all hold it",
            "links allow (measured ×)",
            "t(R)/t(0)",
            "goal 1.3/R",
            "to all actors",
            "push",
            "lag at push, median",
            "back to back: lag at push, median (max); all hold the last; versions pulled",
            "load (1 min)",
            "versions",
        ]
        + (["GETs the primary answered"] if counted else []),
        rows,
    )


def _findings(cases: list[dict[str, Any]]) -> list[str]:
    """t(R)/t(0) per size and actor count, then what the run shows."""
    bullets = []
    for nbytes in sorted({c["bytes"] for c in cases}):
        for count in sorted({c["actors"] for c in cases if c["bytes"] == nbytes}):
            parts = []
            for case in cases:
                r = ratio(cases, case)
                if (
                    case["bytes"] == nbytes
                    and case["actors"] == count
                    and r is not None
                    and case["replicas"] > 1
                ):
                    goal = GOAL / case["replicas"]
                    parts.append(
                        f"{case.get('topology', 'star')} R={case['replicas']} "
                        f"{r:.2f} ({'met' if r <= goal else 'missed'} ≤ {goal:.2f})"
                    )
            if parts:
                bullets.append(
                    f"- **{size_label(nbytes)}, {count} actors**, t(R)/t(0): "
                    + "; ".join(parts)
                    + "."
                )
    if not bullets:
        return []
    return (
        ["**t(R)/t(0) against the goal 1.3/R**:", ""]
        + bullets
        + [
            "",
            (
                "What limits is a link in every case where the figures match the links' "
                "allowance (× close to 1.00). A star of R replicas cannot reach 1/R: its "
                "primary's uplink carries R copies of every push, R - 1 of them after the push "
                "returned, so t(R)/t(0) ≥ ((R - 1) + A/R) / A for A actors (0.44 for R = 4 and 16 "
                "actors). A chain carries one copy per link; each replica forwards a chunk "
                "(`chunk_size`, 4 MiB) only once it has received it whole, so each hop adds a "
                "chunk's transfer time (~35 ms at 1 Gbit/s): small against a 100 MB fan-out, "
                "most of a 10 MB one (which is also where the other engineers' load on this "
                "machine shows most)."
            ),
            "",
        ]
        + _back_to_back_finding(cases)
    )


def _back_to_back_finding(cases: list[dict[str, Any]]) -> list[str]:
    fast = [(c, c["back_to_back"]) for c in cases if c.get("back_to_back")]
    if not fast:
        return []
    multiples = [f["all_seconds"] / _median(c, "all_seconds") for c, f in fast]
    pulled = [n for _, f in fast for n in f["pulled"]]
    restarted = sum(sum(f.get("restarted", [])) for _, f in fast)
    return [
        (
            f"Back to back ({len(fast[0][1]['pushes'])} pushes, none waiting for the fan-out), "
            f"an actor pulled {min(pulled)} to {max(pulled)} of them: `pull_if_newer` takes the "
            "newest version when a pull starts, and a pull runs to its end unless its version "
            "is retired meanwhile (with the default `keep=1`, two pushes later), when it begins "
            f"again on a newer one ({restarted} pulls in all the cases). So every actor held the "
            f"last push {min(multiples):.1f}–{max(multiples):.1f}× the spaced time after it "
            "returned: actors never fell further behind than the pushes in flight (the lag "
            "column), but each pull of an intermediate version costs a whole fan-out. A "
            "fan-out slower than the push interval wants a larger `keep` and pushes no faster "
            "than the fan-out."
        ),
        "",
    ]


def _back_to_back_cell(case: dict[str, Any]) -> str:
    fast = case.get("back_to_back")
    if not fast:
        return "–"
    lags = [lag for p in fast["pushes"] for lag in p["lag_at_push"]]
    again = sum(fast.get("restarted", []))
    restarted = (
        f", {again} pull{'' if again == 1 else 's'} begun again" if "restarted" in fast else ""
    )
    return (
        f"{summary(lags)['median']:.0f} ({max(lags)}); {fast['all_seconds']:.2f} s, "
        f"{min(fast['pulled'])}–{max(fast['pulled'])} of {len(fast['pushes'])} pulled" + restarted
    )


def splice(results: dict[str, Any], out: Path) -> None:
    """Write section 11 into ``out`` in place of its previous text (up to the next ``## ``
    heading), or before "## What was run", or at the end."""
    mine = section(results)
    lines = out.read_text().rstrip("\n").split("\n") if out.exists() else []
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    at = [i for i in heads if lines[i] == HEADING]
    if at:
        end = next((i for i in heads if i > at[0]), len(lines))
        lines[at[0] : end] = mine
    else:
        before = next((i for i in heads if lines[i].startswith("## What was run")), len(lines))
        lines[before:before] = mine
    out.write_text("\n".join(lines).rstrip() + "\n")


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    source = Path(argv[0]) if argv else here / "results_scaleout.json"
    target = Path(argv[1]) if len(argv) > 1 else here / "RESULTS.md"
    splice(json.loads(source.read_text()), target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def saved_section(folder: Path) -> list[str]:
    """Section 11 from ``folder``'s results_scaleout.json (none if absent or unreadable):
    report.py's hook, so that ``make bench``'s RESULTS.md keeps the last scale-out run."""
    try:
        return section(json.loads((folder / "results_scaleout.json").read_text()))
    except (OSError, ValueError, KeyError):
        return []
