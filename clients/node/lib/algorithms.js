'use strict';

// The `type` option, one entry per algorithm, under the server's own names
// (the proto's oneof fields, the policies file's `algorithm:`): the options
// it takes, how they are checked, the CheckLimitRequest oneof field they
// become, the window reported in the RateLimit-Policy header, and its
// parameters in the proto's field order (the limiter's namespace). Adding an
// algorithm to the proto means adding one entry here (and its types in
// index.d.ts).

// Bounds from proto/ratelimitd/v1/ratelimit.proto and the README's input rules.
const MAX_COUNT = 1e15;
const MAX_SLIDING_LIMIT = 100000;
const MAX_WINDOW_MS = 366 * 24 * 60 * 60 * 1000;

const ALGORITHMS = {
  fixed_window: {
    field: 'fixed_window',
    options: ['limit', 'windowSize'],
    validate(o, where) {
      count(o, 'limit', MAX_COUNT, where);
      windowMs(o, 'windowSize', where);
    },
    toProto: (o) => ({ limit: o.limit, window: durationFromMs(o.windowSize) }),
    windowSeconds: (o) => Math.ceil(o.windowSize / 1000),
    params: (o) => [o.limit, o.windowSize],
  },
  sliding_window: {
    field: 'sliding_window',
    options: ['limit', 'windowSize'],
    validate(o, where) {
      count(o, 'limit', MAX_SLIDING_LIMIT, where);
      windowMs(o, 'windowSize', where);
    },
    toProto: (o) => ({ limit: o.limit, window: durationFromMs(o.windowSize) }),
    windowSeconds: (o) => Math.ceil(o.windowSize / 1000),
    params: (o) => [o.limit, o.windowSize],
  },
  token_bucket: {
    field: 'token_bucket',
    options: ['capacity', 'refillRate'],
    validate(o, where) {
      count(o, 'capacity', MAX_COUNT, where);
      const rate = o.refillRate;
      if (typeof rate !== 'number' || !Number.isFinite(rate) || rate <= 0) {
        throw new TypeError(
          `${where}: \`refillRate\` (tokens per second) must be a finite number above 0, got ${show(rate)}`,
        );
      }
      if ((o.capacity / rate) * 1000 > MAX_WINDOW_MS) {
        throw new RangeError(
          `${where}: \`capacity\` / \`refillRate\` (the time to refill an empty bucket) must be at most 366 days, got ${o.capacity / rate} s`,
        );
      }
    },
    toProto: (o) => ({ capacity: o.capacity, refill_per_second: o.refillRate }),
    // The time an empty bucket takes to fill: the window of `capacity` units.
    windowSeconds: (o) => Math.ceil(o.capacity / o.refillRate),
    params: (o) => [o.capacity, o.refillRate],
  },
  gcra: {
    field: 'gcra',
    options: ['limit', 'windowSize', 'burst'],
    validate(o, where) {
      count(o, 'limit', MAX_COUNT, where);
      windowMs(o, 'windowSize', where);
      if (o.burst !== undefined) count(o, 'burst', MAX_COUNT, where);
    },
    // `limit` per `windowSize` sustained; bursts of `burst` (default: limit).
    toProto: (o) => ({
      rate: o.limit,
      period: durationFromMs(o.windowSize),
      burst: o.burst ?? o.limit,
    }),
    windowSeconds: (o) => Math.ceil(o.windowSize / 1000),
    params: (o) => [o.limit, o.windowSize, o.burst ?? o.limit],
  },
  sliding_window_counter: {
    field: 'sliding_window_counter',
    options: ['limit', 'windowSize'],
    validate(o, where) {
      count(o, 'limit', MAX_COUNT, where);
      windowMs(o, 'windowSize', where);
    },
    toProto: (o) => ({ limit: o.limit, window: durationFromMs(o.windowSize) }),
    windowSeconds: (o) => Math.ceil(o.windowSize / 1000),
    params: (o) => [o.limit, o.windowSize],
  },
};

/** Every `type`, by the server's names. */
const TYPES = Object.keys(ALGORITHMS);

/** The short names (`fixed`, `sliding`, `token`), kept for migration. */
const ALIASES = { fixed: 'fixed_window', sliding: 'sliding_window', token: 'token_bucket' };

/** Spellings this package no longer takes (it is unpublished 0.x), and the name to use. */
const REMOVED = { slidingCounter: 'sliding_window_counter' };

/** Every option name any algorithm takes, and `windowMs` (express-rate-limit's name of `windowSize`). */
const ALGORITHM_OPTIONS = [...new Set(TYPES.flatMap((t) => ALGORITHMS[t].options)), 'windowMs'];

/**
 * `options` with `type` under its server name and `windowMs` as
 * `windowSize`, not yet checked otherwise. Throws a TypeError whose message
 * starts with `where` for a removed spelling, or both `windowMs` and
 * `windowSize`.
 */
function normalize(options, where) {
  const out = { ...options };
  const type = options.type;
  if (typeof type === 'string' && Object.prototype.hasOwnProperty.call(ALIASES, type)) out.type = ALIASES[type];
  if (typeof type === 'string' && Object.prototype.hasOwnProperty.call(REMOVED, type)) {
    throw new TypeError(`${where}: \`type\` ${show(type)} is now spelled '${REMOVED[type]}' (the server's name)`);
  }
  if (options.windowMs !== undefined) {
    if (options.windowSize !== undefined) {
      throw new TypeError(`${where}: pass one of \`windowMs\` and \`windowSize\` (the same option), not both`);
    }
    out.windowSize = options.windowMs;
  }
  delete out.windowMs;
  return out;
}

/** The canonical text of one limit, `<algorithm>:<parameters>`, for the limiter's namespace. */
function canonical(options) {
  return [options.type, ...ALGORITHMS[options.type].params(options).map((v) => (typeof v === 'function' ? '*' : String(v)))].join(':');
}

/**
 * Checks `type` and its options (those of `options` named in
 * ALGORITHM_OPTIONS); returns the algorithm's table entry. Throws a
 * TypeError or RangeError whose message starts with `where`.
 */
function resolve(options, where) {
  const type = options.type;
  if (!Object.prototype.hasOwnProperty.call(ALGORITHMS, type)) {
    throw new TypeError(
      `${where}: \`type\` must be one of ${TYPES.map((t) => `'${t}'`).join(', ')} (or the short names ${Object.keys(ALIASES)
        .map((a) => `'${a}'`)
        .join(', ')}), got ${show(type)}`,
    );
  }
  const algorithm = ALGORITHMS[type];
  for (const name of ALGORITHM_OPTIONS) {
    if (options[name] !== undefined && !algorithm.options.includes(name)) {
      throw new TypeError(
        `${where}: \`${name}\` is not an option of type '${type}', which takes ${algorithm.options
          .map((n) => `\`${n}\``)
          .join(' and ')}`,
      );
    }
  }
  algorithm.validate(options, where);
  return algorithm;
}

function count(o, name, max, where) {
  const value = o[name];
  if (!Number.isSafeInteger(value) || value < 1 || value > max) {
    throw new (typeof value === 'number' ? RangeError : TypeError)(
      `${where}: \`${name}\` must be a whole number from 1 to ${max}, got ${show(value)}`,
    );
  }
}

function windowMs(o, name, where) {
  const value = o[name];
  if (!Number.isSafeInteger(value) || value < 1 || value > MAX_WINDOW_MS) {
    throw new (typeof value === 'number' ? RangeError : TypeError)(
      `${where}: \`${name}\` must be a whole number of milliseconds from 1 to ${MAX_WINDOW_MS} (366 days), got ${show(value)}`,
    );
  }
}

function durationFromMs(ms) {
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1e6 };
}

function show(value) {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'function') return 'a function';
  return String(value);
}

module.exports = { ALGORITHMS, TYPES, ALIASES, ALGORITHM_OPTIONS, MAX_COUNT, normalize, canonical, resolve, count, show };
