"""One Python client deciding one hot policy, for benches/leases.sh: warms
up (the policy turns hot and is leased), then makes `decisions` checks,
closed loop (rate 0) or paced at `rate` a second, and prints one JSON
object: the process's CPU time per decision (its lease thread's or task's
included), decisions per second, how many were allowed, the calls
ratelimitd served for them (the lease stream's asks, and the checks no
lease decided), and the client's lease counters. `asyncio`: true drives the AsyncClient instead of the Client.

Usage: python benches/lease_client.py '{"address": "127.0.0.1:50051",
  "policy": "hot", "decisions": 100000, "rate": 0, "leases": true,
  "asyncio": false}'
"""

import asyncio
import json
import sys
import time

from ratelimitd_client import AsyncClient, Client


def run(settings):
    client = Client(settings["address"], leases=settings["leases"])
    for _ in range(500):
        client.check("bench", policy=settings["policy"])
    before = client.lease_stats()
    decisions, rate = settings["decisions"], settings["rate"]
    cpu = time.process_time()
    started = time.monotonic()
    allowed = 0
    for i in range(decisions):
        if rate > 0:
            wait = started + i / rate - time.monotonic()
            if wait > 0.001:
                time.sleep(wait)
        if client.check("bench", policy=settings["policy"]).allowed:
            allowed += 1
    seconds = time.monotonic() - started
    used = time.process_time() - cpu
    stats = client.lease_stats()
    client.close()
    return used, seconds, allowed, before, stats


async def run_async(settings):
    client = AsyncClient(settings["address"], leases=settings["leases"])
    for _ in range(500):
        await client.check("bench", policy=settings["policy"])
    before = client.lease_stats()
    decisions, rate = settings["decisions"], settings["rate"]
    cpu = time.process_time()
    started = time.monotonic()
    allowed = 0
    for i in range(decisions):
        if rate > 0:
            wait = started + i / rate - time.monotonic()
            if wait > 0.001:
                await asyncio.sleep(wait)
        if (await client.check("bench", policy=settings["policy"])).allowed:
            allowed += 1
    seconds = time.monotonic() - started
    used = time.process_time() - cpu
    stats = client.lease_stats()
    await client.close()
    return used, seconds, allowed, before, stats


def main():
    settings = json.loads(sys.argv[1])
    if settings.get("asyncio"):
        used, seconds, allowed, before, stats = asyncio.run(run_async(settings))
    else:
        used, seconds, allowed, before, stats = run(settings)
    decisions = settings["decisions"]

    def local(counts):
        return counts["local_allowed"] + counts["local_denied"]

    server_calls = stats["asks"] - before["asks"] + decisions - (local(stats) - local(before))
    print(
        json.dumps(
            {
                "cpu_us_per_decision": used * 1e6 / decisions,
                "per_second": decisions / seconds,
                "allowed": allowed,
                "server_calls": server_calls,
                "stats": stats,
            }
        )
    )


if __name__ == "__main__":
    main()
