"""Drives the Python client for tests/suite/lease_clients.rs: checks each
policy at the rates a schedule gives, as an application would, and prints
what it saw as JSON lines, so that a driver killed midway has told what it
saw up to then: every tenth of a second (stamped with the time, ms since
the Unix epoch), for each policy, how many checks were issued since, when
each check allowed since was answered, and how many were denied or failed;
at the end, the client's lease counters.

Usage: drive.py <settings JSON>, with address, key, schedule (a list of
{seconds, rates: {policy: checks per second}}), deadlineMs (each call's),
leases (false to turn them off), and asyncio (true to drive the AsyncClient instead of the Client).
"""

import asyncio
import json
import sys
import time

from ratelimitd_client import AsyncClient, Client

TICK = 0.005
REPORT = 0.1


class Seen:
    """What the checks got since the last report."""

    def __init__(self, policies):
        self.policies = policies
        self.last_report = time.monotonic()
        self.client = None
        self.reset()

    def reset(self):
        self.seen = {
            policy: {"issued": 0, "allowed": [], "denied": 0, "failed": 0, "errors": []}
            for policy in self.policies
        }

    def answer(self, policy, decision):
        if decision.allowed:
            self.seen[policy]["allowed"].append(int(time.time() * 1000))
        else:
            self.seen[policy]["denied"] += 1

    def failure(self, policy, err):
        seen = self.seen[policy]
        seen["failed"] += 1
        if len(seen["errors"]) < 3:
            seen["errors"].append(repr(err))

    def report(self, force=False):
        if force or time.monotonic() - self.last_report >= REPORT:
            line = {"at": int(time.time() * 1000), "seen": self.seen}
            if self.client is not None:
                line["counters"] = self.client.lease_stats()
            print(json.dumps(line), flush=True)
            self.reset()
            self.last_report = time.monotonic()


def due_checks(phase, phase_start, issued):
    """The checks each policy is due since the phase started."""
    elapsed = time.monotonic() - phase_start
    for policy, rate in phase["rates"].items():
        due = int(rate * elapsed) - issued[policy]
        for _ in range(due):
            issued[policy] += 1
            yield policy


def issue(seen, phase, phase_start, issued):
    """The checks due now, counted as issued."""
    due = list(due_checks(phase, phase_start, issued))
    for policy in due:
        seen.seen[policy]["issued"] += 1
    return due


def client_options(settings):
    # A loaded test machine may answer a call slowly: a check that fails for
    # its deadline would count as failed, which is not what is measured.
    options = {"deadline": settings.get("deadlineMs", 300) / 1000}
    if not settings.get("leases", True):
        options["leases"] = False
    return options


def drive(settings, seen):
    client = seen.client = Client(settings["address"], **client_options(settings))
    phase_start = time.monotonic()
    for phase in settings["schedule"]:
        issued = {policy: 0 for policy in phase["rates"]}
        phase_end = phase_start + phase["seconds"]
        while time.monotonic() < phase_end:
            for policy in issue(seen, phase, phase_start, issued):
                try:
                    seen.answer(policy, client.check(settings["key"], policy=policy))
                except Exception as err:  # noqa: BLE001 - every failure is counted
                    seen.failure(policy, err)
            seen.report()
            time.sleep(TICK)
        phase_start = phase_end
    seen.report(force=True)
    stats = client.lease_stats()
    client.close()
    return stats


async def drive_async(settings, seen):
    client = seen.client = AsyncClient(settings["address"], **client_options(settings))
    phase_start = time.monotonic()
    for phase in settings["schedule"]:
        issued = {policy: 0 for policy in phase["rates"]}
        phase_end = phase_start + phase["seconds"]
        while time.monotonic() < phase_end:
            for policy in issue(seen, phase, phase_start, issued):
                try:
                    seen.answer(policy, await client.check(settings["key"], policy=policy))
                except Exception as err:  # noqa: BLE001 - every failure is counted
                    seen.failure(policy, err)
            seen.report()
            await asyncio.sleep(TICK)
        phase_start = phase_end
    seen.report(force=True)
    stats = client.lease_stats()
    await client.close()
    return stats


def main():
    settings = json.loads(sys.argv[1])
    policies = sorted({policy for phase in settings["schedule"] for policy in phase["rates"]})
    seen = Seen(policies)
    if settings.get("asyncio"):
        stats = asyncio.run(drive_async(settings, seen))
    else:
        stats = drive(settings, seen)
    print(json.dumps({"stats": stats}), flush=True)


if __name__ == "__main__":
    main()
