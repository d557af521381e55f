"""The faulty soak's figures: what the faults left behind (growth of fds, threads, server
counts) judged against an allowance, and the columns and notes of the soak's table."""

from __future__ import annotations

from typing import Any

ALLOWANCE = 4  # growth of anything that is not a leak (a reconnection, a pooled worker)
NOTE = (
    "interrupts: 20% of pushes, 10% of reader calls, at a random moment within 1.2 x "
    "the call's median; memory: the writer only (readers are threads, an Interrupter "
    "needs a main thread). Lost replies: 1% per proxy, redis and reverb."
)


def growth(outcome: dict[str, Any], key: str, since: str = "held_start") -> int | None:
    if since not in outcome or "held_end" not in outcome:
        return None
    return int(outcome["held_end"][key] - outcome[since][key])


def summarise(result: dict[str, Any], row: dict[str, Any]) -> None:
    """Adds the faulty soak's figures to ``row`` (clean.summary's)."""
    outcomes = result["outcomes"]
    writers = [o for o in outcomes if o["role"] == "writer"]
    readers = [o for o in outcomes if o["role"] != "writer"]
    survived: dict[str, int] = {}
    for o in outcomes:
        for name, count in o.get("survived", {}).items():
            survived[name] = survived.get(name, 0) + count
    row.update(
        faults=True,
        interrupted=sum(o.get("interrupted", 0) for o in outcomes),
        swallowed=sum(o.get("fired", 0) - o.get("interrupted", 0) for o in outcomes),
        lost=result["lost"],
        survived=survived,
        published_unheard=sum(o.get("published_unheard", 0) for o in writers),
        pushed_again=sum(o.get("pushed_again", 0) for o in writers),
        typical_ms={o["role"]: o.get("typical_ms", {}) for o in outcomes},
        held={
            key: ([growth(o, key) for o in writers], [growth(o, key) for o in readers])
            for key in ("fds", "threads", "os threads")
        },
        server_counts=result["server_counts"],
        interrupted_by_role={o["role"]: o.get("interrupted", 0) for o in outcomes},
        fd_growth_by_kind={o["role"]: _kind_growth(o) for o in outcomes if _kind_growth(o)},
        second_half={
            key: [growth(o, key, "held_mid") for o in outcomes]
            for key in ("fds", "threads", "os threads")
        },
    )
    leaks = []
    own_process = writers if result["backend"] == "memory" else outcomes  # memory: threads
    for key in ("fds", "threads"):
        for o in own_process:
            grew, late = growth(o, key), growth(o, key, "held_mid")
            if grew is not None and grew > ALLOWANCE and (late is None or late > 0):
                leaks.append(
                    f"{o['role']}: {key} grew by {grew} over the faulty soak "
                    f"({late} in its second half)"
                )
    start, end, _ = result["server_counts"]
    for key, value in end.items():  # not keys: a lost push's chunks expire (docs/redis.md)
        if key != "redis keys" and key in start and value - start[key] > ALLOWANCE:
            leaks.append(f"server: {key} went from {start[key]} to {value}")
    row["leaks"] = leaks
    row["errors"] += len(result["late_errors"])
    row["problems"] = (row["problems"] + result["late_errors"] + leaks)[:12]


def _kind_growth(outcome: dict[str, Any]) -> dict[str, int]:
    if "held_start" not in outcome or "held_end" not in outcome:
        return {}
    start, end = outcome["held_start"]["fd kinds"], outcome["held_end"]["fd kinds"]
    return {
        k: end.get(k, 0) - start.get(k, 0)
        for k in set(start) | set(end)
        if end.get(k, 0) != start.get(k, 0)
    }


HEADER = (
    " interrupted calls | lost replies | failed calls survived | "
    "fd growth (writer; max reader) | thread growth (writer; max reader) | "
    "server side (start → end) |"
)


def columns(row: dict[str, Any]) -> str:
    """The fault columns of one row of the table (``–`` for a clean row)."""
    if not row.get("faults"):
        return " – | – | – | – | – | – |"

    def pair(key: str) -> str:
        writer, readers = row["held"][key]
        shown = [f"{v:+d}" if v is not None else "?" for v in writer[:1]]
        known = [v for v in readers if v is not None]
        if row["backend"] == "memory":
            return (shown[0] if shown else "?") + " (one process)"
        return (shown[0] if shown else "?") + "; " + (f"{max(known):+d}" if known else "?")

    start, end, _ = row["server_counts"]
    side = ", ".join(f"{k} {start.get(k, '?')} → {v}" for k, v in end.items()) or "–"
    lost = str(row["lost"]) if row["backend"] in ("redis", "reverb") else "–"
    return (
        f" {row['interrupted']} | {lost} | {sum(row['survived'].values())} | "
        f"{pair('fds')} | {pair('threads')} | {side} |"
    )


def notes(row: dict[str, Any]) -> list[str]:
    """Lines printed under the table for a faulty row."""
    name = f"{row['backend']} (faults)"
    lines = [
        (
            f"{name}: survived {row['survived'] or 'nothing'}; pushes interrupted or "
            f"failed yet published: {row['published_unheard']}, not published (pushed "
            f"again): {row['pushed_again']}; OS threads growth (writer; readers) "
            f"{row['held']['os threads']}"
        )
    ]
    if row["swallowed"]:
        lines.append(
            f"{name}: {row['swallowed']} interrupts fired but the call returned "
            "(raised inside a finaliser or callback and ignored)"
        )
    lines.append(f"{name}: interrupted calls per role {row['interrupted_by_role']}")
    lines.append(
        f"{name}: growth in the second half of the faulty soak (writer, readers) "
        f"{row['second_half']}"
    )
    for role, kinds in row["fd_growth_by_kind"].items():
        lines.append(f"{name}: {role}: open fds grew by kind {kinds}")
    lines.append(
        f"{name}: median call (ms) {row['typical_ms']}; server side after the "
        f"clients exited: {row['server_counts'][2] or '–'}"
    )
    return lines
