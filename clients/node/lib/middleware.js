'use strict';

const crypto = require('node:crypto');
const { ALGORITHM_OPTIONS, resolve, show } = require('./algorithms');
const { RateLimitClient, FAILURE_POLICIES, checkCost, checkDeadline } = require('./client');

const WHERE = 'rateLimiter';
const OPTIONS = new Set([
  'client',
  'address',
  'deadlineMs',
  'type',
  ...ALGORITHM_OPTIONS,
  'keyGenerator',
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
const POLICY_ID = '"default"';

/**
 * Express middleware: the seed's `rateLimiter({ redis, type, limit, windowSize })`
 * with `client` or `address` in place of `redis`.
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
    keyGenerator = defaultKey,
    cost,
    prefix = '',
    onServiceError = 'allow',
    failurePolicy,
    headers = true,
    logger = console,
  } = options;

  const algorithm = resolve(options, WHERE);
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
    throw new TypeError(`${WHERE}: \`keyGenerator\` must be a function (req) => string, got ${show(keyGenerator)}`);
  }
  if (cost !== undefined && typeof cost !== 'function') checkCost(cost, WHERE);
  if (typeof prefix !== 'string') {
    throw new TypeError(`${WHERE}: \`prefix\` must be a string, got ${show(prefix)}`);
  }
  if (onServiceError !== 'allow' && onServiceError !== 'deny') {
    throw new TypeError(`${WHERE}: \`onServiceError\` must be 'allow' or 'deny', got ${show(onServiceError)}`);
  }
  if (failurePolicy !== undefined && !Object.prototype.hasOwnProperty.call(FAILURE_POLICIES, failurePolicy)) {
    throw new TypeError(
      `${WHERE}: \`failurePolicy\` must be one of ${Object.keys(FAILURE_POLICIES)
        .map((p) => `'${p}'`)
        .join(', ')}, got ${show(failurePolicy)}`,
    );
  }
  if (typeof headers !== 'boolean') {
    throw new TypeError(`${WHERE}: \`headers\` must be true or false, got ${show(headers)}`);
  }
  if (logger === null || typeof logger !== 'object' || typeof logger.warn !== 'function') {
    throw new TypeError(`${WHERE}: \`logger\` must have a warn(message) method, got ${show(logger)}`);
  }

  const client = givenClient ?? new RateLimitClient({ address, ...(deadlineMs !== undefined && { deadlineMs }) });
  const checkOptions = { type };
  for (const name of algorithm.options) checkOptions[name] = options[name];
  if (failurePolicy !== undefined) checkOptions.failurePolicy = failurePolicy;
  if (deadlineMs !== undefined) checkOptions.deadlineMs = deadlineMs;
  const windowSeconds = algorithm.windowSeconds(options);
  const warn = throttledWarning(logger);

  async function rateLimitMiddleware(req, res, next) {
    let key;
    let spend;
    try {
      key = await keyGenerator(req);
      if (typeof key === 'number') key = String(key);
      if (typeof key !== 'string' || key === '') {
        throw new TypeError(`${WHERE}: keyGenerator(req) must return a non-empty string, got ${show(key)}`);
      }
      key = prefix + key;
      if (Buffer.byteLength(key) > MAX_KEY_BYTES) {
        key = `sha256:${crypto.createHash('sha256').update(key).digest('hex')}`;
      }
      spend = typeof cost === 'function' ? await cost(req) : cost;
      if (spend !== undefined) checkCost(spend, `${WHERE}: cost(req)`);
    } catch (err) {
      next(err);
      return;
    }

    let result;
    try {
      result = await client.check(key, spend === undefined ? checkOptions : { ...checkOptions, cost: spend });
    } catch (err) {
      // By name rather than instanceof: the client may come from another
      // copy of this package.
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
      res.setHeader('RateLimit-Policy', `${POLICY_ID};q=${result.limit};w=${windowSeconds}`);
      res.setHeader(
        'RateLimit',
        `${POLICY_ID};r=${result.remaining};t=${Math.ceil(result.resetAfterMs / 1000)}`,
      );
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
