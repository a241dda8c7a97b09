'use strict';

const crypto = require('node:crypto');
const { ALGORITHMS, ALGORITHM_OPTIONS, canonical, count, normalize, resolve, show, MAX_COUNT } = require('./algorithms');
const {
  RateLimitClient,
  checkCost,
  checkDeadline,
  checkFailurePolicy,
  checkForm,
  checkLimits,
} = require('./client');
const { DEFAULT_IPV6_SUBNET, checkIpv6Subnet, keyOf } = require('./ip-key');

const WHERE = 'rateLimiter';
const OPTIONS = new Set([
  'client',
  'address',
  'deadlineMs',
  'type',
  ...ALGORITHM_OPTIONS,
  // express-rate-limit's older name of `limit`.
  'max',
  'limits',
  'policy',
  'keyGenerator',
  // express-rate-limit's users know `keyGenerator`; ratelimitd's own
  // examples and other limiters say `key`: either names the same option.
  'key',
  // The default key's: how much of an IPv6 address is the client.
  'ipv6Subnet',
  'cost',
  'name',
  'prefix',
  'onServiceError',
  'onDegraded',
  'failurePolicy',
  'standardHeaders',
  'legacyHeaders',
  'message',
  'statusCode',
  'handler',
  'skip',
  'requestWasSuccessful',
  'skipFailedRequests',
  'skipSuccessfulRequests',
  'requestPropertyName',
  'logger',
]);
// Options of a single-node Redis middleware or of express-rate-limit this middleware does not
// take, and what to do instead.
const NOT_OPTIONS = {
  redis: "counters live in ratelimitd; pass `address` (e.g. '127.0.0.1:50051') or `client` (a RateLimitClient)",
  store: "counters live in ratelimitd; pass `address` (e.g. '127.0.0.1:50051') or `client` (a RateLimitClient)",
  headers: "it is now `standardHeaders` ('draft-6', 'draft-7', 'draft-8' or false), as express-rate-limit names it",
  passOnStoreError: "use `onServiceError: 'allow'` (the default) or 'deny'",
  identifier: 'the RateLimit-Policy item is named after the limit it describes: name it in `limits` (`limits: [{ name, type, ... }]`)',
  validate: 'options are always checked when rateLimiter() is called',
};
// express-rate-limit's defaults, used when no `type`, `limits` or `policy` is given.
const ERL_DEFAULTS = { type: 'fixed_window', limit: 5, windowSize: 60000 };
const HEADER_VERSIONS = ['draft-6', 'draft-7', 'draft-8'];
// ratelimitd accepts keys of 1 to 1024 bytes; longer ones are hashed.
const MAX_KEY_BYTES = 1024;
// At most one warning per this period while ratelimitd keeps failing.
const WARN_INTERVAL_MS = 10000;
// The RateLimit-Policy id of a limit without a name.
const DEFAULT_POLICY_ID = 'default';
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const DEFAULT_MESSAGE = { error: 'Rate limit exceeded' };

/**
 * Express middleware: the single-node Redis middleware's `rateLimiter({ redis, type, limit, windowSize })`
 * with `client` or `address` in place of `redis`, with express-rate-limit's
 * options; or, in place of `type` and its parameters, several limits decided
 * together (`limits`) or a policy of ratelimitd's policies file (`policy`).
 */
function rateLimiter(options) {
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`${WHERE}: options must be an object, got ${show(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (Object.prototype.hasOwnProperty.call(NOT_OPTIONS, name)) {
      throw new TypeError(`${WHERE}: \`${name}\` is not used: ${NOT_OPTIONS[name]}`);
    }
    if (!OPTIONS.has(name)) {
      throw new TypeError(`${WHERE}: unknown option \`${name}\` (known: ${[...OPTIONS].join(', ')})`);
    }
  }
  const {
    client: givenClient,
    address,
    deadlineMs,
    limits,
    policy,
    cost,
    name,
    prefix = '',
    onServiceError = 'allow',
    onDegraded,
    failurePolicy,
    standardHeaders = 'draft-8',
    legacyHeaders = false,
    message = DEFAULT_MESSAGE,
    statusCode = 429,
    handler,
    skip,
    requestWasSuccessful = defaultRequestWasSuccessful,
    skipFailedRequests = false,
    skipSuccessfulRequests = false,
    requestPropertyName = 'rateLimit',
    logger = console,
  } = options;

  if (options.key !== undefined && options.keyGenerator !== undefined) {
    throw new TypeError(`${WHERE}: pass one of \`key\` and \`keyGenerator\` (the same option), not both`);
  }
  const ownKey = options.key ?? options.keyGenerator;
  if (options.ipv6Subnet !== undefined && ownKey !== undefined) {
    throw new TypeError(
      `${WHERE}: \`ipv6Subnet\` applies to the default key only; with your own \`${options.key !== undefined ? 'key' : 'keyGenerator'}\`, ` +
        'call ipKey(req.ip, { ipv6Subnet }) in it',
    );
  }
  const ipv6Subnet = checkIpv6Subnet(options.ipv6Subnet === undefined ? DEFAULT_IPV6_SUBNET : options.ipv6Subnet, WHERE);
  const keyGenerator = ownKey ?? ((req) => defaultKey(req, ipv6Subnet));

  // One limit (`type`), several (`limits`) or a policy.
  const form = checkForm(options, WHERE);
  let params = null; // the one limit, normalized; `limit` may be a function
  let limitFunction = null;
  if (form === 'type') {
    const given = {};
    for (const option of [...ALGORITHM_OPTIONS, 'type']) if (options[option] !== undefined) given[option] = options[option];
    if (options.max !== undefined) {
      if (given.limit !== undefined) throw new TypeError(`${WHERE}: pass one of \`limit\` and \`max\` (the same option), not both`);
      given.limit = options.max;
    }
    params = normalize(given, WHERE);
    if (params.type === undefined) {
      // express-rate-limit's usage, `rateLimiter({ windowMs, limit })`: its
      // defaults, on a fixed window (the algorithm of its memory store).
      params = { ...ERL_DEFAULTS, ...params };
    }
    if (typeof params.limit === 'function') {
      limitFunction = params.limit;
      resolve({ ...params, limit: 1 }, WHERE);
    } else {
      resolve(params, WHERE);
    }
  } else if (options.max !== undefined) {
    throw new TypeError(
      `${WHERE}: \`max\` is not an option with \`${form}\`: ${form === 'limits' ? 'each limit takes its own' : "the policy's limits are in ratelimitd's policies file"}`,
    );
  }
  const normalizedLimits = form === 'limits' ? checkLimits(limits, WHERE, { keyFunctions: true }) : null;
  if (givenClient !== undefined && address !== undefined) {
    throw new TypeError(
      `${WHERE}: pass one of \`address\` (e.g. '127.0.0.1:50051') and \`client\` (a RateLimitClient), not both`,
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
  if (name !== undefined && (typeof name !== 'string' || !NAME.test(name))) {
    throw new TypeError(`${WHERE}: \`name\` must be 1 to 64 letters, digits, '_', '-' or '.', got ${show(name)}`);
  }
  if (typeof prefix !== 'string') {
    throw new TypeError(`${WHERE}: \`prefix\` must be a string, got ${show(prefix)}`);
  }
  if (onServiceError !== 'allow' && onServiceError !== 'deny') {
    throw new TypeError(`${WHERE}: \`onServiceError\` must be 'allow' or 'deny', got ${show(onServiceError)}`);
  }
  if (failurePolicy !== undefined) checkFailurePolicy(failurePolicy, WHERE);
  if (standardHeaders !== true && standardHeaders !== false && !HEADER_VERSIONS.includes(standardHeaders)) {
    throw new TypeError(
      `${WHERE}: \`standardHeaders\` must be ${HEADER_VERSIONS.map((v) => `'${v}'`).join(', ')}, true ('draft-6') or false, got ${show(standardHeaders)}`,
    );
  }
  const headerVersion = standardHeaders === true ? 'draft-6' : standardHeaders;
  for (const [option, value] of Object.entries({ legacyHeaders, skipFailedRequests, skipSuccessfulRequests })) {
    if (typeof value !== 'boolean') throw new TypeError(`${WHERE}: \`${option}\` must be true or false, got ${show(value)}`);
  }
  for (const [option, value] of Object.entries({ onDegraded, handler, skip })) {
    if (value !== undefined && typeof value !== 'function') {
      throw new TypeError(`${WHERE}: \`${option}\` must be a function, got ${show(value)}`);
    }
  }
  if (typeof requestWasSuccessful !== 'function') {
    throw new TypeError(`${WHERE}: \`requestWasSuccessful\` must be a function (req, res) => boolean, got ${show(requestWasSuccessful)}`);
  }
  if (!Number.isInteger(statusCode) || statusCode < 100 || statusCode > 599) {
    throw new TypeError(`${WHERE}: \`statusCode\` must be an HTTP status code, got ${show(statusCode)}`);
  }
  if (typeof requestPropertyName !== 'string' || requestPropertyName === '') {
    throw new TypeError(`${WHERE}: \`requestPropertyName\` must be a non-empty string, got ${show(requestPropertyName)}`);
  }
  if (logger === null || typeof logger !== 'object' || typeof logger.warn !== 'function') {
    throw new TypeError(`${WHERE}: \`logger\` must have a warn(message) method, got ${show(logger)}`);
  }

  const client =
    givenClient ??
    new RateLimitClient({ ...(address !== undefined && { address }), ...(deadlineMs !== undefined && { deadlineMs }) });

  // Each limiter counts on its own: its namespace is its `name`, or derived
  // from what it limits (the same in every process, and in the Python client).
  let text;
  if (form === 'type') text = `limit:${canonical({ ...params, limit: limitFunction ?? params.limit })}`;
  else if (form === 'limits') {
    text = `limits:${normalizedLimits
      .map((l) => `${l.name ?? ''}=${canonical(l)}${typeof l.key === 'string' ? `@${l.key}` : ''}`)
      .join(',')}`;
  } else text = `policy:${policy}`;
  const namespace = name !== undefined ? `${name}:` : namespaceOf(text);

  const checkOptions = {};
  if (form === 'policy') checkOptions.policy = policy;
  if (failurePolicy !== undefined) checkOptions.failurePolicy = failurePolicy;
  if (deadlineMs !== undefined) checkOptions.deadlineMs = deadlineMs;
  // The `w` of RateLimit-Policy, in seconds: the limit's window, or each
  // limit's. A policy's windows are ratelimitd's: its items go without `w`.
  const windowSeconds = form === 'type' ? ALGORITHMS[params.type].windowSeconds(params) : undefined;
  const limitWindows = normalizedLimits?.map((l) => ALGORITHMS[l.type].windowSeconds(l));
  const warn = throttledWarning(logger);
  // Throttled apart, so that an outage's warning does not hide them.
  const warnHook = throttledWarning(logger);
  const warnLater = throttledWarning(logger);
  const stats = { decided: 0, denied: 0, failOpen: 0, failClosed: 0 };
  const deferred = skipFailedRequests || skipSuccessfulRequests;
  const optionsUsed = Object.freeze({ ...options, statusCode, message, standardHeaders: headerVersion, legacyHeaders });

  // A key as ratelimitd takes it: prefixed, namespaced, hashed when too long.
  function limitedKey(value, what) {
    if (typeof value === 'number') value = String(value);
    if (typeof value !== 'string' || value === '') {
      throw new TypeError(`${WHERE}: ${what} must return a non-empty string, got ${show(value)}`);
    }
    const key = prefix + namespace + value;
    if (Buffer.byteLength(key) > MAX_KEY_BYTES) {
      return `sha256:${crypto.createHash('sha256').update(key).digest('hex')}`;
    }
    return key;
  }

  // The `limits` of one request: each limit's own key, if it has one,
  // derived, prefixed and namespaced as the request's.
  async function limitsFor(req) {
    return Promise.all(
      normalizedLimits.map(async (limit, i) => {
        const { key: own, ...rest } = limit;
        if (own === undefined) return rest;
        const value = typeof own === 'function' ? await own(req) : own;
        return { ...rest, key: limitedKey(value, `limits[${i}].key(req)`) };
      }),
    );
  }

  // What one request asks: its key, and the options of client.check.
  async function requestOf(req, res) {
    const key = limitedKey(await keyGenerator(req, res), 'keyGenerator(req)');
    let requestOptions = { ...checkOptions };
    if (form === 'type') {
      let limit = params.limit;
      if (limitFunction) {
        limit = await limitFunction(req, res);
        count({ limit }, 'limit', MAX_COUNT, `${WHERE}: limit(req)`);
      }
      const { type } = params;
      requestOptions.type = type;
      for (const option of ALGORITHMS[type].options) {
        if (params[option] !== undefined) requestOptions[option] = params[option];
      }
      if (limitFunction) requestOptions.limit = limit;
    } else if (form === 'limits') {
      requestOptions.limits = await limitsFor(req);
    }
    const spend = typeof cost === 'function' ? await cost(req, res) : cost;
    if (spend !== undefined) {
      checkCost(spend, `${WHERE}: cost(req)`);
      requestOptions.cost = spend;
    }
    return { key, requestOptions, spend: spend ?? 1 };
  }

  function degraded(req, res, reason, extra) {
    if (!res.headersSent) res.setHeader('RateLimit-Degraded', reason);
    if (onDegraded) {
      try {
        onDegraded(req, { reason, ...extra });
      } catch (err) {
        warnHook(`onDegraded threw: ${err?.message ?? err}`);
      }
    }
  }

  async function rateLimitMiddleware(req, res, next) {
    let asked;
    try {
      if (skip && (await skip(req, res))) {
        next();
        return;
      }
      asked = await requestOf(req, res);
    } catch (err) {
      next(err);
      return;
    }
    const { key, requestOptions, spend } = asked;

    let result;
    // With skipFailedRequests / skipSuccessfulRequests: look (cost 0) now,
    // spend once the response says whether this request counts.
    let spendLater = false;
    try {
      if (deferred) {
        const lookOptions = { ...requestOptions, cost: 0 };
        if (lookOptions.limits) lookOptions.limits = lookOptions.limits.map((l) => (l.cost === undefined ? l : { ...l, cost: 0 }));
        const look = await client.check(key, lookOptions);
        if (hasRoom(look, spend, requestOptions)) {
          // The headers and req.rateLimit then describe the quota without
          // this request, which may not count.
          spendLater = true;
          result = look;
        }
      }
      // No room (or no deferral): decide and spend now, as usual.
      result ??= await client.check(key, requestOptions);
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
        stats.failOpen += 1;
        const reason =
          err.code === 'DEADLINE_EXCEEDED' ? 'timeout' : err.code === 'UNAVAILABLE' ? 'unavailable' : 'error';
        degraded(req, res, reason, { error: err });
        next();
      } else {
        stats.failClosed += 1;
        if (!res.headersSent) sendBody(res, 503, { error: 'Rate limiter unavailable' });
      }
      return;
    }
    stats.decided += 1;

    // With several limits, the top-level fields are the most restrictive
    // one's: it is the item sent.
    const window = form === 'type' ? windowSeconds : limitWindows?.[result.mostRestrictive ?? 0];
    const resetSeconds = Math.ceil(result.resetAfterMs / 1000);
    if (!res.headersSent) {
      setHeaders(res, { headerVersion, legacyHeaders, id: policyId(result), window, result, resetSeconds });
    }
    req[requestPropertyName] = {
      limit: result.limit,
      used: result.limit - result.remaining,
      remaining: result.remaining,
      resetTime: new Date(Date.now() + result.resetAfterMs),
      key,
    };
    if (result.degraded) degraded(req, res, 'store', { decision: result });

    if (result.allowed) {
      if (spendLater) spendAfterResponse(req, res, key, requestOptions);
      next();
      return;
    }
    stats.denied += 1;
    if (res.headersSent) return;
    // No Retry-After when the cost exceeds the limit: waiting never helps.
    if (result.retryAfterMs !== null) {
      res.setHeader('Retry-After', String(Math.ceil(result.retryAfterMs / 1000)));
    }
    try {
      if (handler) {
        await handler(req, res, next, optionsUsed);
      } else {
        const body = typeof message === 'function' ? await message(req, res) : message;
        if (!res.headersSent) sendBody(res, statusCode, body);
      }
    } catch (err) {
      next(err);
    }
  }

  // Spends the request's cost once its response is known, if it counts.
  function spendAfterResponse(req, res, key, requestOptions) {
    let settled = false;
    const settle = async (finished) => {
      if (settled) return;
      settled = true;
      let successful = false;
      if (finished) {
        try {
          successful = Boolean(await requestWasSuccessful(req, res));
        } catch (err) {
          warnHook(`requestWasSuccessful threw: ${err?.message ?? err}`);
        }
      }
      if ((skipFailedRequests && !successful) || (skipSuccessfulRequests && successful)) return;
      try {
        await client.check(key, requestOptions);
      } catch (err) {
        warnLater(`ratelimitd could not count a finished request (${err?.code ?? 'error'}: ${err?.details || err?.message})`);
      }
    };
    res.once('finish', () => settle(true));
    res.once('close', () => settle(res.writableFinished));
    res.once('error', () => settle(false));
  }

  Object.defineProperty(rateLimitMiddleware, 'client', { value: client, enumerable: true });
  Object.defineProperty(rateLimitMiddleware, 'stats', { value: stats, enumerable: true });
  Object.defineProperty(rateLimitMiddleware, 'namespace', { value: namespace, enumerable: true });
  return rateLimitMiddleware;
}

/** The derived namespace of a limiter: `rl-` + 8 hex digits of SHA-256 of its canonical text + `:`. */
function namespaceOf(text) {
  return `rl-${crypto.createHash('sha256').update(text).digest('hex').slice(0, 8)}:`;
}

// Whether a look (a cost 0 decision) leaves room for the request's cost on
// every limit (shadow limits never deny).
function hasRoom(look, spend, requestOptions) {
  if (!look.allowed) return false;
  if (!look.limits) return look.remaining >= spend;
  return look.limits.every((status, i) => {
    if (status.shadow) return true;
    const own = requestOptions.limits?.[i]?.cost;
    return status.remaining >= (own ?? spend);
  });
}

/**
 * The id of the RateLimit-Policy and RateLimit item: the name of the limit
 * the decision describes, as ratelimitd reports it (a policy's limit without
 * a name by its `per`); without one, `default`, or `default#<n>` for the
 * n-th of several. Each limit keeps one id whichever is the most
 * restrictive, as the draft's items identify one quota each; the Python
 * client follows the same rule (clients/test-vectors/policy-ids.json).
 */
function policyId(result) {
  const statuses = result.limits;
  if (!statuses?.length) return DEFAULT_POLICY_ID;
  const i = result.mostRestrictive ?? 0;
  if (statuses[i]?.name) return statuses[i].name;
  return statuses.length > 1 ? `${DEFAULT_POLICY_ID}#${i + 1}` : DEFAULT_POLICY_ID;
}

function setHeaders(res, { headerVersion, legacyHeaders, id, window, result, resetSeconds }) {
  const w = window === undefined ? '' : `;w=${window}`;
  if (headerVersion === 'draft-8') {
    res.setHeader('RateLimit-Policy', `"${id}";q=${result.limit}${w}`);
    res.setHeader('RateLimit', `"${id}";r=${result.remaining};t=${resetSeconds}`);
  } else if (headerVersion === 'draft-7') {
    res.setHeader('RateLimit-Policy', `${result.limit}${w}`);
    res.setHeader('RateLimit', `limit=${result.limit}, remaining=${result.remaining}, reset=${resetSeconds}`);
  } else if (headerVersion === 'draft-6') {
    res.setHeader('RateLimit-Policy', `${result.limit}${w}`);
    res.setHeader('RateLimit-Limit', String(result.limit));
    res.setHeader('RateLimit-Remaining', String(result.remaining));
    res.setHeader('RateLimit-Reset', String(resetSeconds));
  }
  if (legacyHeaders) {
    res.setHeader('X-RateLimit-Limit', String(result.limit));
    res.setHeader('X-RateLimit-Remaining', String(result.remaining));
    res.setHeader('X-RateLimit-Reset', String(Math.ceil((Date.now() + result.resetAfterMs) / 1000)));
  }
}

// The client's address, one key per client: see ip-key.js. Without one
// (a Unix socket), undefined, an error passed to next(err).
function defaultKey(req, ipv6Subnet) {
  return keyOf(req.ip ?? req.socket?.remoteAddress, ipv6Subnet);
}

function defaultRequestWasSuccessful(req, res) {
  return res.statusCode < 400;
}

// Express's res.status().send() when there (a string as HTML, an object as
// JSON, as express-rate-limit does); plain node:http otherwise.
function sendBody(res, status, body) {
  if (typeof res.status === 'function' && typeof res.send === 'function') {
    res.status(status).send(body);
    return;
  }
  const isText = typeof body === 'string' || Buffer.isBuffer(body);
  const text = isText ? body : JSON.stringify(body);
  res.statusCode = status;
  res.setHeader('Content-Type', isText ? 'text/plain; charset=utf-8' : 'application/json; charset=utf-8');
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

module.exports = { rateLimiter, namespaceOf };
