"""Namespaces: which counters a limiter of the middleware counts on.

Each limiter counts on its own by default: the keys it sends start with a
prefix derived from its options, so two limiters with different limits on
the same key never share a counter, and identical limiters in different
processes (or in the Node client) agree. A `name` sets the namespace
instead: limiters with the same name share their counters on purpose.

The derived prefix is `rl-` + the first 8 hex digits of the SHA-256 of a
canonical text, + `:`. The Node client derives the same from the same text:

- one limit: `limit:<algorithm>:<its parameters in the proto's field order>`,
  durations in whole milliseconds, numbers as the shortest decimal
  (`limit:fixed_window:5:10000`, `limit:token_bucket:10:2.5`,
  `limit:gcra:<rate>:<period_ms>:<burst>`);
- several: `limits:` + each as `<name>=<algorithm>:<params>` (+ `@<key>`
  for a limit with its own key), joined by `,`;
- a policy: `policy:<name>`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from ._request import ALGORITHMS, Limit, _name


def number(value: int | float) -> str:
    """The shortest decimal that reads back as `value`, written as
    JavaScript's Number#toString writes it (2.5, 10, 0.1, 1e-7, 1e+21), so
    the Node client derives the same text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    text = "".join(map(str, digits))
    # value = 0.<text> x 10^point
    point = len(text) + exponent
    if -6 < point <= 21:
        if point <= 0:
            out = "0." + "0" * -point + text
        elif point >= len(text):
            out = text + "0" * (point - len(text))
        else:
            out = text[:point] + "." + text[point:]
    else:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        out = f"{mantissa}e{'+' if point - 1 >= 0 else '-'}{abs(point - 1)}"
    return ("-" if sign else "") + out


def limit_text(limit: Limit) -> str:
    """`<algorithm>:<params>` of one limit (its type already the server's name)."""
    algorithm = ALGORITHMS[limit.type]
    values = []
    for param in algorithm.params + algorithm.optional:
        value = getattr(limit, param)
        if param == "burst" and value is None:
            value = limit.limit  # the server's default: what the proto carries
        values.append(number(value))
    return ":".join([limit.type, *values])


def canonical_text(
    *,
    type: str = "fixed_window",
    limits: Sequence[Limit | Mapping[str, Any]] | None = None,
    policy: str | None = None,
    **params: Any,
) -> str:
    """The text a limiter's namespace is derived from (see the module)."""
    if policy is not None:
        return f"policy:{policy}"
    if limits is not None:
        parts = []
        for one in limits:
            one = one if isinstance(one, Limit) else Limit(**one)
            part = f"{one.name or ''}={limit_text(one)}"
            if one.key is not None:
                part += f"@{one.key}"
            parts.append(part)
        return "limits:" + ",".join(parts)
    given = {name: value for name, value in params.items() if value is not None}
    return "limit:" + limit_text(Limit(type=type, **given))


def derived_prefix(text: str) -> str:
    """`rl-` + the first 8 hex digits of SHA-256(text) + `:`."""
    return f"rl-{hashlib.sha256(text.encode()).hexdigest()[:8]}:"


def namespace(name: str | None, **options: Any) -> str:
    """The key prefix of a limiter: `<name>:` when named, else derived from
    its options (`canonical_text`)."""
    if name is not None:
        return _name("name", name) + ":"
    return derived_prefix(canonical_text(**options))
