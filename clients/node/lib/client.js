'use strict';

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { ALGORITHMS, ALGORITHM_OPTIONS, MAX_COUNT, normalize, resolve, show } = require('./algorithms');
const { Leases, DEFAULT_LEASE_THRESHOLD } = require('./leases');

// The package's own copy of the .proto files it needs (the repository's
// proto/ratelimitd/v1/ratelimit.proto, proto/ratelimitd/v1/lease.proto and
// proto/google/rpc/status.proto; test/package.test.js fails when they
// differ), so that a packed tarball works on its own.
// google/protobuf/duration.proto and any.proto come from protobufjs's
// bundled common types.
const PROTO_ROOT = path.join(__dirname, '..', 'proto');
const PROTO_FILES = ['ratelimitd/v1/ratelimit.proto', 'ratelimitd/v1/lease.proto'];

const DEFAULT_ADDRESS = '127.0.0.1:50051';
// 3x ratelimitd's default --redis-command-timeout (100 ms): when Redis is
// slow, the server's own failure policy answers first (marked `degraded`),
// and the client's onServiceError is the last resort, not the usual path.
const DEFAULT_DEADLINE_MS = 300;
const DEFAULT_CHANNEL_OPTIONS = {
  // grpc-js backs off up to 120 s between reconnects by default: after an
  // outage of the service, calls would keep failing long after it is back.
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 2000,
};

const FAILURE_POLICIES = {
  'fail-closed': 'FAIL_CLOSED',
  'fail-open': 'FAIL_OPEN',
  local: 'LOCAL',
};

const STATUS_NAMES = Object.fromEntries(
  Object.entries(grpc.status).map(([name, number]) => [number, name]),
);

const CHECK_OPTIONS = new Set([
  'type',
  ...ALGORITHM_OPTIONS,
  'limits',
  'policy',
  'cost',
  'failurePolicy',
  'deadlineMs',
]);
// One entry of `limits`: an algorithm as `type` spells it, and its own name,
// key and cost.
const LIMIT_OPTIONS = new Set(['name', 'key', 'type', ...ALGORITHM_OPTIONS, 'cost']);
const CLIENT_OPTIONS = new Set(['address', 'deadlineMs', 'credentials', 'channelOptions', 'leases', 'leaseThreshold']);
// The three forms of a request; exactly one per request.
const FORMS = ['type', 'limits', 'policy'];
// A limit's or a policy's name, as ratelimitd accepts it.
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;

let services;
/** The RateLimiter and Leases services' stub constructors. */
function loadServices() {
  if (!services) {
    const definition = protoLoader.loadSync(PROTO_FILES, {
      includeDirs: [PROTO_ROOT],
      keepCase: true,
      longs: Number, // every count is at most 1e15, exact in a double
      enums: String,
      defaults: true,
      oneofs: true,
    });
    const v1 = grpc.loadPackageDefinition(definition).ratelimitd.v1;
    services = { RateLimiter: v1.RateLimiter, Leases: v1.Leases };
  }
  return services;
}

/**
 * A failed call to ratelimitd, or one failed item of a batch (then `index`
 * is its position); `code` is the gRPC status name, e.g. 'UNAVAILABLE'.
 */
class RateLimitError extends Error {
  constructor(grpcError, { method = 'CheckLimit', index, cause = grpcError } = {}) {
    const code = STATUS_NAMES[grpcError.code] ?? 'UNKNOWN';
    const what = index === undefined ? `ratelimitd ${method} failed` : `ratelimitd ${method}: requests[${index}] failed`;
    super(`${what}: ${code}: ${grpcError.details || grpcError.message}`, { cause });
    this.name = 'RateLimitError';
    this.code = code;
    this.grpcCode = grpcError.code;
    this.details = grpcError.details ?? '';
    if (index !== undefined) this.index = index;
  }
}

class RateLimitClient {
  /**
   * @param {object} [options]
   * @param {string} [options.address] host:port of ratelimitd, default $RATELIMITD_ADDRESS, else 127.0.0.1:50051
   * @param {number} [options.deadlineMs] default deadline of each call, default 300
   * @param {grpc.ChannelCredentials} [options.credentials] default from RATELIMITD_TLS* (see credentialsFromEnv), else plaintext
   * @param {object} [options.channelOptions] grpc-js channel options
   * @param {boolean} [options.leases] decide hot policies from leases (see leases.js); default true, unless $RATELIMITD_LEASES is off
   * @param {number} [options.leaseThreshold] checks per second on one policy and key from which it is leased, default 20
   */
  constructor(options = {}) {
    const where = 'new RateLimitClient';
    if (options === null || typeof options !== 'object') {
      throw new TypeError(`${where}: options must be an object, got ${show(options)}`);
    }
    for (const name of Object.keys(options)) {
      if (!CLIENT_OPTIONS.has(name)) {
        throw new TypeError(
          `${where}: unknown option \`${name}\` (known: ${[...CLIENT_OPTIONS].join(', ')})`,
        );
      }
    }
    const {
      address = addressFromEnv(),
      deadlineMs = DEFAULT_DEADLINE_MS,
      credentials = credentialsFromEnv(where),
      channelOptions = {},
      leases = leasesFromEnv(where),
      leaseThreshold = DEFAULT_LEASE_THRESHOLD,
    } = options;
    if (typeof address !== 'string' || address === '') {
      throw new TypeError(`${where}: \`address\` must be a "host:port" string, got ${show(address)}`);
    }
    checkDeadline(deadlineMs, where);
    if (typeof leases !== 'boolean') {
      throw new TypeError(`${where}: \`leases\` must be true or false, got ${show(leases)}`);
    }
    if (typeof leaseThreshold !== 'number' || !Number.isFinite(leaseThreshold) || leaseThreshold <= 0) {
      throw new TypeError(`${where}: \`leaseThreshold\` must be a number of checks per second above 0, got ${show(leaseThreshold)}`);
    }
    this.address = address;
    this.deadlineMs = deadlineMs;
    this.leases = leases;
    const { RateLimiter, Leases: LeaseService } = loadServices();
    const allChannelOptions = { ...DEFAULT_CHANNEL_OPTIONS, ...channelOptions };
    this._stub = new RateLimiter(address, credentials, allChannelOptions);
    // Connect now, so that the first check does not pay for the handshake.
    this._stub.getChannel().getConnectivityState(true);
    // The lease stream goes where the calls go: the same target, credentials
    // and channel options (grpc-js shares the connections of equal
    // channels); its own channel, so that close() ends the calls at once and
    // the stream once its leases are given back.
    this._leases = leases
      ? new Leases({
          makeStub: () => new LeaseService(address, credentials, allChannelOptions),
          threshold: leaseThreshold,
        })
      : null;
  }

  /**
   * Asks whether `key` may spend `cost` units now: under one limit (`type`
   * and its parameters), several decided together (`limits`), or a policy
   * of the server's (`policy`).
   * Resolves with the decision (a denial is a decision, not an error); rejects
   * with a RateLimitError when ratelimitd fails or does not answer within the
   * deadline, or with a TypeError / RangeError for invalid options.
   */
  check(key, options) {
    let request;
    let multi;
    let deadlineMs;
    try {
      ({ request, multi, deadlineMs = this.deadlineMs } = toRequest(key, options, 'RateLimitClient.check'));
    } catch (err) {
      return Promise.reject(err);
    }
    const leases = request.policy === undefined ? null : this._leases;
    if (leases !== null) {
      // A hot policy is decided here, from the units leased for it.
      const local = leases.decide(request.policy, key, request.cost ?? 1);
      if (local !== null) return Promise.resolve(local);
    }
    return new Promise((resolvePromise, reject) => {
      this._stub.CheckLimit(request, { deadline: Date.now() + deadlineMs }, (err, response) => {
        if (err) {
          reject(new RateLimitError(err));
          return;
        }
        const result = decision(response, multi);
        leases?.observe(request.policy, key, result);
        resolvePromise(result);
      });
    });
  }

  /**
   * Decides many independent requests, `{ key, ...options of check }` each,
   * in one call (CheckLimits). Resolves with one result per request, in
   * order: `{ decision, error: null }`, or `{ decision: null, error }` for an
   * item that failed on its own (a RateLimitError with ratelimitd's code, or
   * the TypeError / RangeError of invalid options, that item then not sent).
   * Rejects only when the call as a whole fails: a RateLimitError (ratelimitd
   * unreachable, the deadline, more requests than its --max-batch-size), or
   * a TypeError when `requests` is not a non-empty array.
   */
  checkMany(requests, options = {}) {
    const where = 'RateLimitClient.checkMany';
    let deadlineMs;
    try {
      if (!Array.isArray(requests) || requests.length === 0) {
        throw new TypeError(
          `${where}: \`requests\` must be a non-empty array of { key, ...check options }, got ${
            Array.isArray(requests) ? 'an empty array' : show(requests)
          }`,
        );
      }
      if (options === null || typeof options !== 'object') {
        throw new TypeError(`${where}: options must be an object, got ${show(options)}`);
      }
      for (const name of Object.keys(options)) {
        if (name !== 'deadlineMs') throw new TypeError(`${where}: unknown option \`${name}\` (known: deadlineMs)`);
      }
      deadlineMs = options.deadlineMs ?? this.deadlineMs;
      checkDeadline(deadlineMs, where);
    } catch (err) {
      return Promise.reject(err);
    }
    const results = new Array(requests.length);
    // What is sent: the position of each item in `requests`, its request, its form.
    const sent = [];
    requests.forEach((item, index) => {
      const at = `${where}: requests[${index}]`;
      try {
        if (item === null || typeof item !== 'object') {
          throw new TypeError(`${at}: must be an object { key, ...check options }, got ${show(item)}`);
        }
        const { key, ...itemOptions } = item;
        if (itemOptions.deadlineMs !== undefined) {
          throw new TypeError(`${at}: \`deadlineMs\` is the whole call's: pass it as checkMany(requests, { deadlineMs })`);
        }
        sent.push({ index, ...toRequest(key, itemOptions, at) });
      } catch (err) {
        results[index] = { decision: null, error: err };
      }
    });
    if (sent.length === 0) return Promise.resolve(results);
    return new Promise((resolvePromise, reject) => {
      const request = { requests: sent.map((s) => s.request) };
      this._stub.CheckLimits(request, { deadline: Date.now() + deadlineMs }, (err, response) => {
        if (err) {
          reject(new RateLimitError(err, { method: 'CheckLimits' }));
          return;
        }
        if (response.results.length !== sent.length) {
          reject(new Error(`${where}: ratelimitd answered ${response.results.length} results to ${sent.length} requests`));
          return;
        }
        response.results.forEach((result, i) => {
          const { index, multi } = sent[i];
          if (result.result === 'response') {
            results[index] = { decision: decision(result.response, multi), error: null };
          } else {
            // A google.rpc.Status: the code and message CheckLimit would have failed with.
            const status = result.error ?? { code: grpc.status.UNKNOWN, message: 'no result' };
            const error = new RateLimitError(
              { code: status.code, details: status.message },
              { method: 'CheckLimits', index, cause: status },
            );
            results[index] = { decision: null, error };
          }
        });
        resolvePromise(results);
      });
    });
  }

  /**
   * Counters of the leases, since the client was made: checks allowed and
   * denied here from leases (`localAllowed`, `localDenied`), checks of a
   * leased policy and key that went to CheckLimit because no lease could
   * decide them (`fallbacks`), asks sent on the lease stream and grants
   * received (`asks`, `grants`). All 0 with `leases: false`.
   */
  leaseStats() {
    return this._leases === null
      ? { localAllowed: 0, localDenied: 0, fallbacks: 0, asks: 0, grants: 0 }
      : { ...this._leases.stats };
  }

  /**
   * Closes the channel; calls made afterwards fail. Gives back the units
   * leased and not spent, and ends the lease stream.
   */
  close() {
    this._leases?.close();
    this._stub.close();
  }
}

/** Whether leases are on: RATELIMITD_LEASES `off` (or 0, false) turns them off; `on`, 1, true or unset, on. */
function leasesFromEnv(where, env = process.env) {
  const value = (env.RATELIMITD_LEASES ?? '').trim().toLowerCase();
  if (['', 'on', '1', 'true'].includes(value)) return true;
  if (['off', '0', 'false'].includes(value)) return false;
  throw new TypeError(`${where}: RATELIMITD_LEASES must be on, off, 1, 0, true or false, got ${show(env.RATELIMITD_LEASES)}`);
}

/** RATELIMITD_ADDRESS, else ratelimitd's own default --listen. */
function addressFromEnv(env = process.env) {
  return env.RATELIMITD_ADDRESS || DEFAULT_ADDRESS;
}

/**
 * Plaintext, unless the environment asks for TLS: RATELIMITD_TLS (1 / true:
 * TLS with the system's roots), RATELIMITD_TLS_CA (a PEM file of the CA),
 * RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY (the client's certificate and
 * key, mutual TLS). Any of the files implies TLS.
 */
function credentialsFromEnv(where, env = process.env) {
  const flag = (env.RATELIMITD_TLS ?? '').trim().toLowerCase();
  if (!['', '0', '1', 'true', 'false'].includes(flag)) {
    throw new TypeError(`${where}: RATELIMITD_TLS must be 1, true, 0 or false, got ${show(env.RATELIMITD_TLS)}`);
  }
  const ca = env.RATELIMITD_TLS_CA || undefined;
  const cert = env.RATELIMITD_TLS_CERT || undefined;
  const key = env.RATELIMITD_TLS_KEY || undefined;
  if ((cert === undefined) !== (key === undefined)) {
    throw new TypeError(`${where}: set both RATELIMITD_TLS_CERT and RATELIMITD_TLS_KEY (mutual TLS), or neither`);
  }
  if (!(flag === '1' || flag === 'true') && ca === undefined && cert === undefined) {
    return grpc.credentials.createInsecure();
  }
  const read = (name, file) => {
    try {
      return fs.readFileSync(file);
    } catch (err) {
      throw new TypeError(`${where}: cannot read ${name} ${show(file)}: ${err.message}`);
    }
  };
  return grpc.credentials.createSsl(
    ca === undefined ? null : read('RATELIMITD_TLS_CA', ca),
    key === undefined ? null : read('RATELIMITD_TLS_KEY', key),
    cert === undefined ? null : read('RATELIMITD_TLS_CERT', cert),
  );
}

/**
 * The CheckLimitRequest for `check(key, options)`, checked, and the call's
 * own `deadlineMs` if it has one; `multi` when it asks several limits or a
 * policy (its decision then has `limits`).
 * Throws a TypeError or RangeError whose message starts with `where`.
 */
function toRequest(key, options, where) {
  if (typeof key !== 'string' || key === '') {
    throw new TypeError(`${where}: \`key\` must be a non-empty string, got ${show(key)}`);
  }
  if (options === null || typeof options !== 'object') {
    throw new TypeError(`${where}: options must be an object with a \`type\`, \`limits\` or \`policy\`, got ${show(options)}`);
  }
  for (const name of Object.keys(options)) {
    if (!CHECK_OPTIONS.has(name)) {
      throw new TypeError(`${where}: unknown option \`${name}\` (known: ${[...CHECK_OPTIONS].join(', ')})`);
    }
  }
  const form = checkForm(options, where);
  const request = { key };
  if (form === 'limits') {
    request.limits = checkLimits(options.limits, where).map(limitToProto);
  } else if (form === 'policy') {
    request.policy = options.policy;
  } else {
    const params = normalize(options, where);
    const algorithm = resolve(params, where);
    request[algorithm.field] = algorithm.toProto(params);
  }
  const { cost, failurePolicy, deadlineMs } = options;
  if (cost !== undefined) {
    checkCost(cost, where);
    request.cost = cost;
  }
  if (failurePolicy !== undefined) {
    checkFailurePolicy(failurePolicy, where);
    request.failure_policy = FAILURE_POLICIES[failurePolicy];
  }
  if (deadlineMs !== undefined) checkDeadline(deadlineMs, where);
  return { request, multi: form !== 'type', deadlineMs };
}

/**
 * Which of the three forms `options` takes: 'type' (one limit, also when
 * none is given: `type` is then reported missing), 'limits' or 'policy'.
 * Checks `policy` and that the other forms' options are absent.
 */
function checkForm(options, where) {
  const given = FORMS.filter((name) => options[name] !== undefined);
  if (given.length > 1) {
    throw new TypeError(
      `${where}: pass one of \`type\` (one limit), \`limits\` (several) and \`policy\` (one of ratelimitd's policies), not ${given
        .map((name) => `\`${name}\``)
        .join(' and ')}`,
    );
  }
  const form = given[0] ?? 'type';
  if (form === 'type') return form;
  for (const name of ALGORITHM_OPTIONS) {
    if (options[name] !== undefined) {
      throw new TypeError(
        form === 'limits'
          ? `${where}: \`${name}\` is not an option with \`limits\`: each limit takes its own`
          : `${where}: \`${name}\` is not an option with \`policy\`: the policy's limits are in ratelimitd's policies file`,
      );
    }
  }
  if (form === 'policy') checkName(options.policy, 'policy', where);
  return form;
}

/**
 * Checks the `limits` option: a non-empty array of limits, each `type` with
 * its parameters and optionally `name`, `key` and `cost`. Returns the
 * limits, normalized (`type` under the server's name, `windowSize`). A limit's `key` is a non-empty string, or
 * also a function when `keyFunctions` (the middleware's, of the request).
 */
function checkLimits(limits, where, { keyFunctions = false } = {}) {
  if (!Array.isArray(limits) || limits.length === 0) {
    throw new TypeError(
      `${where}: \`limits\` must be a non-empty array of limits, got ${Array.isArray(limits) ? 'an empty array' : show(limits)}`,
    );
  }
  const names = new Set();
  return limits.map((limit, i) => {
    const at = `${where}: limits[${i}]`;
    if (limit === null || typeof limit !== 'object') {
      throw new TypeError(`${at}: must be an object with a \`type\`, got ${show(limit)}`);
    }
    for (const name of Object.keys(limit)) {
      if (!LIMIT_OPTIONS.has(name)) {
        throw new TypeError(`${at}: unknown option \`${name}\` (known: ${[...LIMIT_OPTIONS].join(', ')})`);
      }
    }
    const { name, key, cost } = limit;
    if (name !== undefined) {
      checkName(name, 'name', at);
      if (names.has(name)) throw new TypeError(`${at}: \`name\` ${show(name)} is taken by an earlier limit: names must be unique`);
      names.add(name);
    }
    if (key !== undefined && !(keyFunctions && typeof key === 'function') && (typeof key !== 'string' || key === '')) {
      throw new TypeError(
        `${at}: \`key\` must be a non-empty string${keyFunctions ? ' or a function (req) => string' : ''}, got ${show(key)}`,
      );
    }
    if (cost !== undefined) checkCost(cost, at);
    const normalized = normalize(limit, at);
    resolve(normalized, at);
    return normalized;
  });
}

/** One checked entry of `limits` as a Limit message. */
function limitToProto(limit) {
  const algorithm = ALGORITHMS[limit.type];
  const proto = { [algorithm.field]: algorithm.toProto(limit) };
  if (limit.name !== undefined) proto.name = limit.name;
  if (limit.key !== undefined) proto.key = limit.key;
  if (limit.cost !== undefined) proto.cost = limit.cost;
  return proto;
}

function decision(response, multi) {
  const result = {
    allowed: response.allowed,
    limit: response.limit,
    remaining: response.remaining,
    resetAfterMs: response.reset_after ? durationToMs(response.reset_after) : 0,
    // Unset when the cost can never be allowed (costExceedsLimit).
    retryAfterMs: response.retry_after ? durationToMs(response.retry_after) : null,
    costExceedsLimit: response.cost_exceeds_limit,
    degraded: response.degraded,
  };
  if (multi) {
    // The fields above are then the request's as a whole: `allowed` only if
    // every limit allows, `limit` / `remaining` / `resetAfterMs` those of
    // limits[mostRestrictive].
    result.limits = response.limits.map((status) => ({
      name: status.name,
      allowed: status.allowed,
      limit: status.limit,
      remaining: status.remaining,
      resetAfterMs: status.reset_after ? durationToMs(status.reset_after) : 0,
      retryAfterMs: status.retry_after ? durationToMs(status.retry_after) : null,
      costExceedsLimit: status.cost_exceeds_limit,
      shadow: status.shadow,
    }));
    result.mostRestrictive = response.most_restrictive;
  }
  return result;
}

// Rounded up to the millisecond: retrying after retryAfterMs still succeeds.
function durationToMs({ seconds, nanos }) {
  return Number(seconds) * 1000 + Math.ceil(nanos / 1e6);
}

function checkCost(cost, where) {
  if (!Number.isSafeInteger(cost) || cost < 0 || cost > MAX_COUNT) {
    throw new (typeof cost === 'number' ? RangeError : TypeError)(
      `${where}: \`cost\` must be a whole number from 0 to ${MAX_COUNT}, got ${show(cost)}`,
    );
  }
}

function checkName(name, what, where) {
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new TypeError(
      `${where}: \`${what}\` must be 1 to 64 letters, digits, '_', '-' or '.', got ${show(name)}`,
    );
  }
}

function checkFailurePolicy(failurePolicy, where) {
  if (!Object.prototype.hasOwnProperty.call(FAILURE_POLICIES, failurePolicy)) {
    throw new TypeError(
      `${where}: \`failurePolicy\` must be one of ${Object.keys(FAILURE_POLICIES)
        .map((p) => `'${p}'`)
        .join(', ')}, got ${show(failurePolicy)}`,
    );
  }
}

function checkDeadline(deadlineMs, where) {
  if (typeof deadlineMs !== 'number' || !Number.isFinite(deadlineMs) || deadlineMs <= 0) {
    throw new TypeError(`${where}: \`deadlineMs\` must be a number of milliseconds above 0, got ${show(deadlineMs)}`);
  }
}

module.exports = {
  RateLimitClient,
  RateLimitError,
  DEFAULT_ADDRESS,
  DEFAULT_DEADLINE_MS,
  addressFromEnv,
  credentialsFromEnv,
  leasesFromEnv,
  FAILURE_POLICIES,
  checkCost,
  checkDeadline,
  checkFailurePolicy,
  checkForm,
  checkLimits,
};
