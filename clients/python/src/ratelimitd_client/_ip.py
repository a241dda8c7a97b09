"""The middleware's default key: the client's IP address, written one way
however the server reports it, by the rule of
clients/test-vectors/ip-keys.json, which the Node client follows too (its
`ipKey`), byte for byte:

- an IPv4 address is its own key;
- an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, however written) is the
  IPv4 address, unmapped before any masking (masking it would leave every
  IPv4 client of a dual-stack server one key);
- any other IPv6 address is its network of `ipv6_subnet` bits (56 by
  default: a client is usually given a whole /64 or /56), as the network
  address in RFC 5952's form then `/<bits>` (`2001:db8:abcd:1200::/56`);
  with `ipv6_subnet=None`, the whole address in that form;
- a zone id (`%eth0`) is dropped; anything that is not an IP address is
  returned as it is.
"""

from __future__ import annotations

import ipaddress

DEFAULT_IPV6_SUBNET = 56


def check_ipv6_subnet(value: object, name: str = "ipv6_subnet") -> int | None:
    """`value` as a prefix length, or None for masking off; a ValueError
    naming `name` unless it is an int from 1 to 128, None or False."""
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 128:
        raise ValueError(
            f"{name} must be a prefix length from 1 to 128, or None (or False) to key each IPv6 "
            f"address whole (got {value!r})"
        )
    return value


def ip_key(address: str, ipv6_subnet: int | None = DEFAULT_IPV6_SUBNET) -> str:
    """The key of a client's address (`request.client.host`), as the
    middleware's default key makes it: `"192.0.2.1"` for `"192.0.2.1"` and
    for `"::ffff:192.0.2.1"`, `"2001:db8:abcd:1200::/56"` for
    `"2001:db8:abcd:1234::1"`; anything that is not an IP address as it is.
    `ipv6_subnet`: the prefix length IPv6 addresses are keyed by, 1 to 128,
    or None (or False) to key each whole. For your own `key_func`:
    `ip_key(request.client.host)`."""
    return _key(address, check_ipv6_subnet(ipv6_subnet))


def _key(address: str, ipv6_subnet: int | None) -> str:
    """ip_key with a checked `ipv6_subnet`."""
    # ipaddress also takes ints and bytes: only text is an address here.
    if not isinstance(address, str):
        return address
    # A zone id names the server's interface, not the client: dropped. An
    # empty one, a second `%`, or one on an IPv4 address is no address.
    bare, percent, zone = address.partition("%")
    if percent and (not zone or "%" in zone):
        return address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return address
    # An IPv4 address is its own key (with a zone id, it is no address).
    if not isinstance(ip, ipaddress.IPv6Address):
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ipv6_subnet is None:
        return ip.compressed
    network = ipaddress.IPv6Network((ip, ipv6_subnet), strict=False)
    return f"{network.network_address.compressed}/{ipv6_subnet}"
