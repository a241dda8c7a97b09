#!/usr/bin/env python3
"""Instructions per decision, by component, from callgrind files.

benches/callgrind.sh runs it; by hand:

    python3 benches/callgrind_table.py --decisions 20000 \\
        echo=/tmp/cg/echo.out redis=/tmp/cg/redis.out:2143

Each argument is NAME=FILE, optionally followed by `:` and the script calls
Redis served in the measured window. Each function's own (self)
instructions, as `callgrind_annotate --inclusive=no --threshold=100` lists
them, go to one component by the function's name (its crate, or for C its
name), else its file, else "other". The allocator calls come from the
file's call counts: every call to malloc, calloc, realloc and free, exact.
Prints Markdown tables: component by server, allocator calls, and the
functions with the most own instructions in the last server (redis if
given).
"""

import argparse
import collections
import re
import subprocess
import sys
import tempfile

HPACK_DATE = "h2's HPACK search of the date headers, with memcmp (grows with the run's seconds)"

# (component, how its functions' names start); first match wins. Names are
# callgrind's demangled Rust paths with the `<X as Trait>` and
# `core::ptr::drop_in_place<X>` wrappers taken off (see owner()).
COMPONENTS = [
    # hyper writes a `date` header on every response; each new second adds
    # an entry to the connection's HPACK table, and h2's encoder compares
    # the next dates with every one (a memcmp each): the one cost that
    # grows with the run's length in seconds rather than its decisions.
    (HPACK_DATE,
     r"(h2::hpack::table::Table::index|h2::hpack::header::Header::value_eq|__memcmp_\w+)$"),
    ("gRPC transport (tonic, h2, hyper, tower, http)",
     r"(tonic|tonic_health|tonic_reflection|h2|hyper|hyper_util|tower|tower_layer|"
     r"tower_service|http|http_body|http_body_util|axum|axum_core|matchit|bytes|"
     r"httparse|pin_project|pin_project_lite|sync_wrapper|want|try_lock|atomic_waker|"
     r"futures_channel)::"),
    ("prost (decoding, encoding)", r"(prost|prost_types|tonic_prost|ratelimitd::pb)::"),
    ("ratelimitd: store, batch queue and driver", r"ratelimitd::store::"),
    ("ratelimitd: decision path (api, decider, limiter, algorithm, limit, policy)",
     r"ratelimitd::(decider|algorithm|limiter|limit|policy|api|codec|spec|lease)::"),
    ("ratelimitd: server, metrics, other", r"ratelimitd::"),
    ("metrics, tracing", r"(metrics|metrics_util|metrics_exporter_prometheus|tracing|"
     r"tracing_core|tracing_subscriber|quanta|sketches_ddsketch)::"),
    ("deadpool", r"(deadpool|deadpool_redis|deadpool_runtime)::"),
    ("redis-rs", r"(redis|combine|arcstr)::"),
    ("tokio (scheduler, IO, time)", r"(tokio|tokio_util|mio|tokio_stream)::"),
    ("futures", r"(futures|futures_util|futures_core|futures_task|futures_sink)::"),
    ("hashing, maps, RNG", r"(foldhash|hashbrown|ahash|quick_cache|rand|rand_core|"
     r"rand_chacha|ppv_lite86|indexmap|arc_swap|parking_lot|parking_lot_core|"
     r"lock_api|crossbeam_utils|crossbeam_epoch|smallvec|slab|equivalent)::"),
    ("allocator (malloc, free, realloc)",
     r"(malloc|free|cfree|realloc|calloc|_int_malloc|_int_free|_int_realloc|"
     r"malloc_consolidate|sysmalloc|unlink_chunk|tcache_\w+|__libc_(malloc|free|"
     r"realloc|calloc)|(__rustc::)?(__rust_\w+|__rdl_\w+)|alloc::alloc::\w+|"
     r"_int_memalign|_mid_memalign|posix_memalign|aligned_alloc|alloc_perturb|"
     r"__default_morecore|__glibc_morecore|arena_get2|checked_request2size)$"),
    ("Rust std (core, alloc, std)", r"(core|alloc|std|std_detect|hashbrown)::"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in COMPONENTS]
LIBC = "libc, syscalls, vdso (memcpy, send, epoll, futex, ...)"
OTHER = "other"
ORDER = [name for name, _ in COMPONENTS] + [LIBC, OTHER]

# The C library's and the kernel interface's objects (libc.so, ld.so, the vdso).
LIBC_OBJECT = re.compile(r"(libc\.so|libc-|ld-linux|libpthread|libm\.so|vdso)")
ALLOCATOR_CALLS = ("malloc", "calloc", "realloc", "free")


def owner(function):
    """The path a function's cost belongs to: the type of `<X as T>::f`,
    what `core::ptr::drop_in_place<X>` drops, otherwise its own path."""
    # callgrind marks recursion levels ('2) and gcc its clones (.constprop.0).
    name = re.sub(r"('\d+|\.(constprop|isra|part|cold)\.\d+)+$", "", function.strip())
    for _ in range(4):
        if name.startswith("core::ptr::drop_in_place<"):
            name = name[len("core::ptr::drop_in_place<"):]
        elif name.startswith(("<", "[")):
            name = name[1:]
        else:
            break
        name = re.sub(r"^(&|mut |dyn |\*const |\*mut )+", "", name)
    return name


def component(function, file, obj):
    name = owner(function)
    for comp, pattern in COMPILED:
        if pattern.match(name):
            return comp
    if LIBC_OBJECT.search(obj or "") or file.startswith("./"):
        return LIBC
    # A Rust function without a crate path: its file says whose it is.
    for crate in ("tokio", "h2", "hyper", "tonic", "redis", "prost", "deadpool"):
        if f"/{crate}-" in file:
            return component(f"{crate}::x", "", "")
    return OTHER


LINE = re.compile(r"^\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(.*?)(?:\s+\[([^\]]*)\])?\s*$")


def self_costs(path):
    """(file, function, object) -> own instructions, from callgrind_annotate."""
    # A dump taken while calls are under way lists each as `calls=0`:
    # callgrind_annotate 3.19 then counts the call's inclusive cost as the
    # caller's own. As one call, it is the callee's.
    with open(path, encoding="utf-8", errors="replace") as f, \
            tempfile.NamedTemporaryFile("w", suffix=".out") as fixed:
        for line in f:
            fixed.write("calls=1 " + line[8:] if line.startswith("calls=0 ") else line)
        fixed.flush()
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--threshold=100", "--auto=no", fixed.name],
            check=True, capture_output=True, text=True).stdout
    costs = collections.Counter()
    total = None
    in_functions = False
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            total = int(line.split()[0].replace(",", ""))
            continue
        if line.startswith("Ir") and "file:function" in line:
            in_functions = True
            continue
        if not in_functions or line.startswith("-") or not line.strip():
            continue
        match = LINE.match(line)
        if not match:
            continue
        cost, place, obj = match.groups()
        file, _, function = place.partition(":")
        costs[(file, function, obj or "")] += int(cost.replace(",", ""))
    if total is None:
        sys.exit(f"{path}: no PROGRAM TOTALS in callgrind_annotate's output")
    return total, costs


def calls_to(path, names):
    """How many times the functions named `names` were called, in all."""
    ids = {}
    counts = collections.Counter()
    target = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("cfn="):
                match = re.match(r"cfn=(?:\((\d+)\))?\s*(.*)", line.rstrip("\n"))
                number, name = match.groups()
                if name:
                    if number:
                        ids[number] = name
                else:
                    name = ids.get(number, "")
                target = name
            elif line.startswith("fn="):
                match = re.match(r"fn=(?:\((\d+)\))?\s*(.*)", line.rstrip("\n"))
                number, name = match.groups()
                if name and number:
                    ids[number] = name
            elif line.startswith("calls="):
                if target in names:
                    counts[target] += int(line[6:].split()[0])
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, required=True)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("servers", nargs="+", metavar="NAME=FILE[:SCRIPT_CALLS]")
    args = parser.parse_args()

    names, per_server, totals, allocs, scripts, raw = [], {}, {}, {}, {}, {}
    for spec in args.servers:
        name, _, rest = spec.partition("=")
        path, _, calls = rest.partition(":")
        names.append(name)
        total, costs = self_costs(path)
        raw[name] = costs
        totals[name] = total
        buckets = collections.Counter()
        for (file, function, obj), cost in costs.items():
            buckets[component(function, file, obj)] += cost
        # What callgrind_annotate left out (nothing at --threshold=100).
        buckets[OTHER] += total - sum(costs.values())
        per_server[name] = buckets
        allocs[name] = calls_to(path, set(ALLOCATOR_CALLS))
        scripts[name] = int(calls) if calls else None

    d = args.decisions
    diffs = []
    if "redis" in names and "embedded" in names:
        diffs.append(("redis − embedded", "redis", "embedded"))
    if "redis" in names and "echo-redis" in names:
        diffs.append(("redis − echo-redis", "redis", "echo-redis"))
    if "echo-redis" in names and "echo" in names:
        diffs.append(("echo-redis − echo", "echo-redis", "echo"))

    print("Instructions per decision, by component (each function's own instructions):")
    print()
    print("| component | " + " | ".join(names + [n for n, _, _ in diffs]) + " |")
    print("|---|" + "---:|" * (len(names) + len(diffs)))
    for comp in ORDER:
        if not any(per_server[n][comp] for n in names):
            continue
        cells = [f"{per_server[n][comp] / d:,.0f}" for n in names]
        cells += [f"{(per_server[a][comp] - per_server[b][comp]) / d:+,.0f}" for _, a, b in diffs]
        print(f"| {comp} | " + " | ".join(cells) + " |")
    cells = [f"**{totals[n] / d:,.0f}**" for n in names]
    cells += [f"**{(totals[a] - totals[b]) / d:+,.0f}**" for _, a, b in diffs]
    print("| **total** | " + " | ".join(cells) + " |")
    steady = {n: totals[n] - per_server[n][HPACK_DATE] for n in names}
    cells = [f"**{steady[n] / d:,.0f}**" for n in names]
    cells += [f"**{(steady[a] - steady[b]) / d:+,.0f}**" for _, a, b in diffs]
    print("| **total without the HPACK date search** | " + " | ".join(cells) + " |")
    print()
    print("Allocator calls per decision (callgrind's call counts) and Redis script calls:")
    print()
    print("| server | malloc | calloc | realloc | free | malloc + calloc + realloc | script calls per decision |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names:
        a = allocs[n]
        s = f"{scripts[n] / d:.3f}" if scripts[n] else "-"
        print(f"| {n} | {a['malloc'] / d:.2f} | {a['calloc'] / d:.2f} | {a['realloc'] / d:.2f} "
              f"| {a['free'] / d:.2f} | {(a['malloc'] + a['calloc'] + a['realloc']) / d:.2f} | {s} |")
    print()
    last = "redis" if "redis" in names else names[-1]
    functions = collections.Counter()
    where = {}
    for (file, function, obj), cost in raw[last].items():
        function = re.sub(r"'\d+$", "", function)
        functions[function] += cost
        where[function] = component(function, file, obj)
    print(f"The {args.top} functions with the most own instructions per decision, {last}:")
    print()
    print("| instructions per decision | function | component |")
    print("|---:|---|---|")
    for function, cost in functions.most_common(args.top):
        shown = function if len(function) <= 140 else function[:137] + "..."
        shown = shown.replace("|", "\\|")
        print(f"| {cost / d:,.0f} | `{shown}` | {where[function]} |")


if __name__ == "__main__":
    main()
