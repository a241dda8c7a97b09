'use strict';

const crypto = require('node:crypto');
const { ALGORITHM_OPTIONS, resolve, show } = require('./algorithms');
const {
  RateLimitClient,
  checkCost,
  checkDeadline,
  checkFailurePolicy,
  checkForm,
  checkLimits,
} = require('./client');

const WHERE = 'rateLimiter';
const OPTIONS = new Set([
  'client',
  'address',
  'deadlineMs',
  'type',
  ...ALGORITHM_OPTIONS,
  'limits',
  'policy',
  'keyGenerator',
  // express-rate-limit's users know `keyGenerator`; issue examples and
  // other limiters say `key`: either names the same option.
  'key',
  'cost',
  'prefix',
  'onServiceError',
  'failurePolicy',
  'headers',
  'logger',
]);
// ratelimitd accepts keys of 1 to 1024 bytes; longer ones are hashed.
const MAX_KEY_BYTES = 1024;
// At most one warning per this period while ratelimitd keeps failing.
const WARN_INTERVAL_MS = 10000;
// The RateLimit-Policy id of a limit without a name.
const DEFAULT_POLICY_ID = 'default';

/**
 * Express middleware: the seed's `rateLimiter({ redis, type, limit, windowSize })`
 * with `client` or `address` in place of `redis`; or, in place of `type` and
 * its parameters, several limits decided together (`limits`) or a policy of
 * ratelimitd's policies file (`policy`).
 */
function rateLimiter(options) {
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`${WHERE}: options must be an object, got ${show(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (name === 'redis') {
      throw new TypeError(
        `${WHERE}: \`redis\` is not used: counters live in ratelimitd; pass \`address\` (e.g. '127.0.0.1:50051') or \`client\` (a RateLimitClient)`,
      );
    }
    if (!OPTIONS.has(name)) {
      throw new TypeError(`${WHERE}: unknown option \`${name}\` (known: ${[...OPTIONS].join(', ')})`);
    }
  }
  const {
    client: givenClient,
    address,
    deadlineMs,
    type,
    limits,
    policy,
    cost,
    prefix = '',
    onServiceError = 'allow',
    failurePolicy,
    headers = true,
    logger = console,
  } = options;

  if (options.key !== undefined && options.keyGenerator !== undefined) {
    throw new TypeError(`${WHERE}: pass one of \`key\` and \`keyGenerator\` (the same option), not both`);
  }
  const keyGenerator = options.key ?? options.keyGenerator ?? defaultKey;

  // One limit (`type`), several (`limits`) or a policy: the algorithm, or
  // each limit's.
  const form = checkForm(options, WHERE);
  const algorithm = form === 'type' ? resolve(options, WHERE) : null;
  const algorithms = form === 'limits' ? checkLimits(limits, WHERE, { keyFunctions: true }) : null;
  if ((givenClient === undefined) === (address === undefined)) {
    throw new TypeError(
      `${WHERE}: pass exactly one of \`address\` (e.g. '127.0.0.1:50051') and \`client\` (a RateLimitClient)`,
    );
  }
  if (givenClient !== undefined && (givenClient === null || typeof givenClient.check !== 'function')) {
    throw new TypeError(`${WHERE}: \`client\` must be a RateLimitClient, got ${show(givenClient)}`);
  }
  if (deadlineMs !== undefined) checkDeadline(deadlineMs, WHERE);
  if (typeof keyGenerator !== 'function') {
    throw new TypeError(`${WHERE}: \`keyGenerator\` (or \`key\`) must be a function (req) => string, got ${show(keyGenerator)}`);
  }
  if (cost !== undefined && typeof cost !== 'function') checkCost(cost, WHERE);
  if (typeof prefix !== 'string') {
    throw new TypeError(`${WHERE}: \`prefix\` must be a string, got ${show(prefix)}`);
  }
  if (onServiceError !== 'allow' && onServiceError !== 'deny') {
    throw new TypeError(`${WHERE}: \`onServiceError\` must be 'allow' or 'deny', got ${show(onServiceError)}`);
  }
  if (failurePolicy !== undefined) checkFailurePolicy(failurePolicy, WHERE);
  if (typeof headers !== 'boolean') {
    throw new TypeError(`${WHERE}: \`headers\` must be true or false, got ${show(headers)}`);
  }
  if (logger === null || typeof logger !== 'object' || typeof logger.warn !== 'function') {
    throw new TypeError(`${WHERE}: \`logger\` must have a warn(message) method, got ${show(logger)}`);
  }

  const client = givenClient ?? new RateLimitClient({ address, ...(deadlineMs !== undefined && { deadlineMs }) });
  const checkOptions = {};
  if (form === 'type') {
    checkOptions.type = type;
    for (const name of algorithm.options) checkOptions[name] = options[name];
  } else if (form === 'policy') {
    checkOptions.policy = policy;
  }
  if (failurePolicy !== undefined) checkOptions.failurePolicy = failurePolicy;
  if (deadlineMs !== undefined) checkOptions.deadlineMs = deadlineMs;
  // The `w` of RateLimit-Policy, in seconds: the limit's window, or each
  // limit's. A policy's windows are ratelimitd's: its items go without `w`.
  const windowSeconds = algorithm?.windowSeconds(options);
  const limitWindows = algorithms?.map((a, i) => a.windowSeconds(limits[i]));
  const warn = throttledWarning(logger);

  // A key as ratelimitd takes it: prefixed, hashed when too long.
  function limitedKey(value, what) {
    if (typeof value === 'number') value = String(value);
    if (typeof value !== 'string' || value === '') {
      throw new TypeError(`${WHERE}: ${what} must return a non-empty string, got ${show(value)}`);
    }
    const key = prefix + value;
    if (Buffer.byteLength(key) > MAX_KEY_BYTES) {
      return `sha256:${crypto.createHash('sha256').update(key).digest('hex')}`;
    }
    return key;
  }

  // The `limits` of one request: each limit's own key, if it has one,
  // derived and prefixed as the request's.
  async function limitsFor(req) {
    return Promise.all(
      limits.map(async (limit, i) => {
        const { key: own, ...rest } = limit;
        if (own === undefined) return rest;
        const value = typeof own === 'function' ? await own(req) : own;
        return { ...rest, key: limitedKey(value, `limits[${i}].key(req)`) };
      }),
    );
  }

  async function rateLimitMiddleware(req, res, next) {
    let key;
    let requestOptions = checkOptions;
    try {
      key = limitedKey(await keyGenerator(req), 'keyGenerator(req)');
      const spend = typeof cost === 'function' ? await cost(req) : cost;
      if (spend !== undefined) checkCost(spend, `${WHERE}: cost(req)`);
      if (form === 'limits') requestOptions = { ...requestOptions, limits: await limitsFor(req) };
      if (spend !== undefined) requestOptions = { ...requestOptions, cost: spend };
    } catch (err) {
      next(err);
      return;
    }

    let result;
    try {
      result = await client.check(key, requestOptions);
    } catch (err) {
      // By name rather than instanceof: the client may come from another
      // copy of this package. An unknown policy (NOT_FOUND) is ratelimitd's
      // configuration, not the request's: handled as an outage.
      if (err?.name !== 'RateLimitError' || err.code === 'INVALID_ARGUMENT') {
        next(err); // a bug in the options or the key, not an outage
        return;
      }
      warn(
        `ratelimitd could not decide (${err.code}: ${err.details || err.message}); ` +
          `onServiceError is '${onServiceError}': ${onServiceError === 'allow' ? 'allowing' : 'refusing with 503'}`,
      );
      if (onServiceError === 'allow') {
        next();
      } else if (!res.headersSent) {
        sendJson(res, 503, { error: 'Rate limiter unavailable' });
      }
      return;
    }

    if (headers && !res.headersSent) {
      // With several limits, the top-level fields are the most restrictive
      // one's: it is the item sent, under its name.
      let id = DEFAULT_POLICY_ID;
      let window = windowSeconds;
      if (form !== 'type') {
        const i = result.mostRestrictive ?? 0;
        id = result.limits?.[i]?.name || DEFAULT_POLICY_ID;
        window = limitWindows?.[i];
      }
      res.setHeader('RateLimit-Policy', `"${id}";q=${result.limit}${window === undefined ? '' : `;w=${window}`}`);
      res.setHeader('RateLimit', `"${id}";r=${result.remaining};t=${Math.ceil(result.resetAfterMs / 1000)}`);
    }
    if (result.allowed) {
      next();
      return;
    }
    if (res.headersSent) return;
    // No Retry-After when the cost exceeds the limit: waiting never helps.
    if (result.retryAfterMs !== null) {
      res.setHeader('Retry-After', String(Math.ceil(result.retryAfterMs / 1000)));
    }
    sendJson(res, 429, { error: 'Rate limit exceeded' });
  }

  Object.defineProperty(rateLimitMiddleware, 'client', { value: client, enumerable: true });
  return rateLimitMiddleware;
}

function defaultKey(req) {
  return req.ip ?? req.socket?.remoteAddress;
}

// Works with Express and with plain node:http responses alike.
function sendJson(res, status, body) {
  const text = JSON.stringify(body);
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/json; charset=utf-8');
  res.setHeader('Content-Length', Buffer.byteLength(text));
  res.end(text);
}

// Logs the first failure at once, then at most one line per WARN_INTERVAL_MS
// with the number of failures in between, so an outage cannot flood the log.
function throttledWarning(logger) {
  let last = -Infinity;
  let suppressed = 0;
  return (message) => {
    const now = Date.now();
    if (now - last < WARN_INTERVAL_MS) {
      suppressed += 1;
      return;
    }
    const more = suppressed > 0 ? ` (and ${suppressed} more failures since the last warning)` : '';
    last = now;
    suppressed = 0;
    logger.warn(`[ratelimitd] ${message}${more}`);
  };
}

module.exports = { rateLimiter };
