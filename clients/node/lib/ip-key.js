'use strict';

// The middleware's default key: the client's IP address, written one way
// however the server reports it, by the rule of
// clients/test-vectors/ip-keys.json, which the Python client follows too
// (its ip_key), byte for byte.

const net = require('node:net');
const { show } = require('./algorithms');

// A client is usually given a whole /64 or /56: keying each IPv6 address
// apart would give it 2^64 or more fresh limits. express-rate-limit's default.
const DEFAULT_IPV6_SUBNET = 56;

/**
 * `ipv6Subnet` checked: an integer from 1 to 128, or false (masking off).
 * Throws a TypeError or RangeError whose message starts with `where`.
 */
function checkIpv6Subnet(ipv6Subnet, where) {
  if (ipv6Subnet === false) return false;
  if (!Number.isInteger(ipv6Subnet) || ipv6Subnet < 1 || ipv6Subnet > 128) {
    throw new (typeof ipv6Subnet === 'number' ? RangeError : TypeError)(
      `${where}: \`ipv6Subnet\` must be a prefix length from 1 to 128, or false to key each IPv6 address whole, got ${show(ipv6Subnet)}`,
    );
  }
  return ipv6Subnet;
}

/**
 * The key of a client's address: an IPv4 address as itself; an IPv4-mapped
 * IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address; any other IPv6
 * address as its network of `ipv6Subnet` bits (default 56), e.g.
 * `2001:db8:abcd:1200::/56`, or with `ipv6Subnet: false` as the whole
 * address, in RFC 5952's form either way; a zone id dropped. Anything else
 * (undefined, a Unix socket's path) is returned as it is.
 */
function ipKey(address, options = {}) {
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`ipKey: options must be an object, got ${show(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (name !== 'ipv6Subnet') throw new TypeError(`ipKey: unknown option \`${name}\` (known: ipv6Subnet)`);
  }
  const { ipv6Subnet = DEFAULT_IPV6_SUBNET } = options;
  return keyOf(address, checkIpv6Subnet(ipv6Subnet, 'ipKey'));
}

/** ipKey with a checked `ipv6Subnet` (a prefix length, or false). */
function keyOf(address, ipv6Subnet) {
  if (typeof address !== 'string') return address;
  // A zone id names the server's interface, not the client: dropped. An
  // empty one, or a second `%`, is no address.
  const percent = address.indexOf('%');
  const bare = percent === -1 ? address : address.slice(0, percent);
  if (percent !== -1) {
    const zone = address.slice(percent + 1);
    if (zone === '' || zone.includes('%')) return address;
  }
  // An IPv4 address is its own key (with a zone id, it is no address); what
  // is no address stays as it is.
  if (!net.isIPv6(bare)) return address;
  const groups = parseIpv6(bare);
  // IPv4-mapped (::ffff:0:0/96), however written: unmapped first, since
  // masking it would leave every IPv4 client the same key.
  if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) {
    return [groups[6] >> 8, groups[6] & 0xff, groups[7] >> 8, groups[7] & 0xff].join('.');
  }
  if (ipv6Subnet === false) return rfc5952(groups);
  const network = groups.map((group, i) => {
    const bits = Math.min(Math.max(ipv6Subnet - 16 * i, 0), 16);
    return group & ((0xffff << (16 - bits)) & 0xffff);
  });
  return `${rfc5952(network)}/${ipv6Subnet}`;
}

/** The eight 16-bit groups of an address net.isIPv6 accepts (no zone id). */
function parseIpv6(text) {
  let tail = [];
  // A dotted IPv4 address in the last 32 bits.
  if (text.includes('.')) {
    const colon = text.lastIndexOf(':');
    const [a, b, c, d] = text.slice(colon + 1).split('.').map(Number);
    tail = [(a << 8) | b, (c << 8) | d];
    text = text.slice(0, colon + 1);
    // `::1.2.3.4` leaves `::`; `1:2:3:4:5:6:1.2.3.4` leaves `1:2:3:4:5:6:`.
    if (!text.endsWith('::')) text = text.slice(0, -1);
  }
  const hex = (part) => (part === '' ? [] : part.split(':').map((g) => parseInt(g, 16)));
  const double = text.indexOf('::');
  let groups;
  if (double === -1) {
    groups = hex(text);
  } else {
    const left = hex(text.slice(0, double));
    const right = hex(text.slice(double + 2));
    groups = [...left, ...new Array(8 - tail.length - left.length - right.length).fill(0), ...right];
  }
  return [...groups, ...tail];
}

/**
 * RFC 5952's text of eight groups: lower case, no leading zeros, the first
 * longest run of two or more zero groups as `::`.
 */
function rfc5952(groups) {
  let best = { start: -1, length: 1 };
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i += 1;
      continue;
    }
    let end = i;
    while (end < 8 && groups[end] === 0) end += 1;
    if (end - i > best.length) best = { start: i, length: end - i };
    i = end;
  }
  const text = (part) => part.map((g) => g.toString(16)).join(':');
  if (best.start === -1) return text(groups);
  return `${text(groups.slice(0, best.start))}::${text(groups.slice(best.start + best.length))}`;
}

module.exports = { ipKey, keyOf, checkIpv6Subnet, DEFAULT_IPV6_SUBNET };
