"""Two servers of the same model driven alike in alternating rounds, and the ratio of the first to
the second per round: the form of bench_compiled.py (compiled against pure) and bench_revisions.py
(this tree against an earlier revision)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

from bench_client_vs_hey import Measure
from bench_front_end import Endpoint, Run, measure

# A driver: for a server's label, the call that drives it once and measures the client's side.
Driver = Callable[[str], Callable[[], Measure]]


class SideBySide:
    """The runs of ``labels`` (two servers, by label) under each driver, in rounds whose order of
    the servers alternates, so a host whose load drifts weighs on both alike."""

    def __init__(self, labels: tuple[str, str], pids: Mapping[str, int], clients: int) -> None:
        self.labels = labels
        self.pids = pids
        self.clients = clients
        self.runs: list[tuple[int, str, str, Run]] = []  # (round, protocol, label, run)

    def run(self, drivers: Mapping[str, Driver], rounds: int) -> None:
        for round_no in range(rounds):
            order = self.labels if round_no % 2 == 0 else self.labels[::-1]
            for protocol, driver in drivers.items():
                for label in order:
                    pid = self.pids[label]
                    endpoint = Endpoint(label, "", lambda pid=pid: [pid], pid)
                    self.runs.append(
                        (round_no, protocol, label, measure(endpoint, protocol, self.clients, driver(label)))
                    )

    def rows(self, protocol: str) -> list[str]:
        """The protocol's table rows, one per server: its median round by req/s, and every round's errors."""
        lines = []
        for label in self.labels:
            mine = sorted((r for _, p, b, r in self.runs if (p, b) == (protocol, label)), key=lambda r: r.measure.rps)
            mid = mine[len(mine) // 2]
            m = mid.measure
            errors = sum(r.measure.errors for r in mine)
            lines.append(
                f"| {protocol} | {label} | {m.rps:,.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | {mid.server_us:.0f} "
                f"| {errors} |"
            )
        return lines

    def ratios(self, protocol: str) -> tuple[list[float], list[float]]:
        """Per round, the first server's req/s and server CPU per request over the second's."""
        first, second = self.labels
        rps, cpu = [], []
        for round_no in sorted({n for n, _, _, _ in self.runs}):
            pair = {b: r for n, p, b, r in self.runs if (n, p) == (round_no, protocol)}
            rps.append(pair[first].measure.rps / pair[second].measure.rps)
            cpu.append(pair[first].server_us / pair[second].server_us)
        return rps, cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}x (rounds {min(values):.3f}x to {max(values):.3f}x)"
