'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { ALGORITHM_OPTIONS, MAX_COUNT, resolve, show } = require('./algorithms');

// The repository's proto/ folder: this package lives in clients/node/.
// google/protobuf/duration.proto comes from protobufjs's bundled common types.
const PROTO_ROOT = path.join(__dirname, '..', '..', '..', 'proto');
const PROTO_FILE = 'ratelimitd/v1/ratelimit.proto';

const DEFAULT_ADDRESS = '127.0.0.1:50051';
// Above ratelimitd's default --redis-command-timeout (100 ms), so that when
// Redis hangs the server's failure policy still gets to answer in time.
const DEFAULT_DEADLINE_MS = 150;
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

const CHECK_OPTIONS = new Set(['type', ...ALGORITHM_OPTIONS, 'cost', 'failurePolicy', 'deadlineMs']);
const CLIENT_OPTIONS = new Set(['address', 'deadlineMs', 'credentials', 'channelOptions']);

let serviceConstructor;
function loadService() {
  if (!serviceConstructor) {
    const definition = protoLoader.loadSync(PROTO_FILE, {
      includeDirs: [PROTO_ROOT],
      keepCase: true,
      longs: Number, // every count is at most 1e15, exact in a double
      enums: String,
      defaults: true,
      oneofs: true,
    });
    serviceConstructor = grpc.loadPackageDefinition(definition).ratelimitd.v1.RateLimiter;
  }
  return serviceConstructor;
}

/** A failed call to ratelimitd; `code` is the gRPC status name, e.g. 'UNAVAILABLE'. */
class RateLimitError extends Error {
  constructor(grpcError) {
    const code = STATUS_NAMES[grpcError.code] ?? 'UNKNOWN';
    super(`ratelimitd CheckLimit failed: ${code}: ${grpcError.details || grpcError.message}`, {
      cause: grpcError,
    });
    this.name = 'RateLimitError';
    this.code = code;
    this.grpcCode = grpcError.code;
    this.details = grpcError.details ?? '';
  }
}

class RateLimitClient {
  /**
   * @param {object} [options]
   * @param {string} [options.address] host:port of ratelimitd, default 127.0.0.1:50051
   * @param {number} [options.deadlineMs] default deadline of each call, default 150
   * @param {grpc.ChannelCredentials} [options.credentials] default insecure (plaintext)
   * @param {object} [options.channelOptions] grpc-js channel options
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
      address = DEFAULT_ADDRESS,
      deadlineMs = DEFAULT_DEADLINE_MS,
      credentials = grpc.credentials.createInsecure(),
      channelOptions = {},
    } = options;
    if (typeof address !== 'string' || address === '') {
      throw new TypeError(`${where}: \`address\` must be a "host:port" string, got ${show(address)}`);
    }
    checkDeadline(deadlineMs, where);
    this.address = address;
    this.deadlineMs = deadlineMs;
    const Service = loadService();
    this._stub = new Service(address, credentials, { ...DEFAULT_CHANNEL_OPTIONS, ...channelOptions });
    // Connect now, so that the first check does not pay for the handshake.
    this._stub.getChannel().getConnectivityState(true);
  }

  /**
   * Asks whether `key` may spend `cost` units now.
   * Resolves with the decision (a denial is a decision, not an error); rejects
   * with a RateLimitError when ratelimitd fails or does not answer within the
   * deadline, or with a TypeError / RangeError for invalid options.
   */
  check(key, options) {
    let request;
    let deadlineMs;
    try {
      ({ request, deadlineMs } = this._request(key, options));
    } catch (err) {
      return Promise.reject(err);
    }
    return new Promise((resolvePromise, reject) => {
      this._stub.CheckLimit(request, { deadline: Date.now() + deadlineMs }, (err, response) => {
        if (err) reject(new RateLimitError(err));
        else resolvePromise(decision(response));
      });
    });
  }

  /** Closes the channel; calls made afterwards fail. */
  close() {
    this._stub.close();
  }

  _request(key, options) {
    const where = 'RateLimitClient.check';
    if (typeof key !== 'string' || key === '') {
      throw new TypeError(`${where}: \`key\` must be a non-empty string, got ${show(key)}`);
    }
    if (options === null || typeof options !== 'object') {
      throw new TypeError(`${where}: options must be an object with a \`type\`, got ${show(options)}`);
    }
    for (const name of Object.keys(options)) {
      if (!CHECK_OPTIONS.has(name)) {
        throw new TypeError(`${where}: unknown option \`${name}\` (known: ${[...CHECK_OPTIONS].join(', ')})`);
      }
    }
    const algorithm = resolve(options, where);
    const request = { key, [algorithm.field]: algorithm.toProto(options) };
    const { cost, failurePolicy, deadlineMs = this.deadlineMs } = options;
    if (cost !== undefined) {
      checkCost(cost, where);
      request.cost = cost;
    }
    if (failurePolicy !== undefined) {
      if (!Object.prototype.hasOwnProperty.call(FAILURE_POLICIES, failurePolicy)) {
        throw new TypeError(
          `${where}: \`failurePolicy\` must be one of ${Object.keys(FAILURE_POLICIES)
            .map((p) => `'${p}'`)
            .join(', ')}, got ${show(failurePolicy)}`,
        );
      }
      request.failure_policy = FAILURE_POLICIES[failurePolicy];
    }
    checkDeadline(deadlineMs, where);
    return { request, deadlineMs };
  }
}

function decision(response) {
  return {
    allowed: response.allowed,
    limit: response.limit,
    remaining: response.remaining,
    resetAfterMs: response.reset_after ? durationToMs(response.reset_after) : 0,
    // Unset when the cost can never be allowed (costExceedsLimit).
    retryAfterMs: response.retry_after ? durationToMs(response.retry_after) : null,
    costExceedsLimit: response.cost_exceeds_limit,
    degraded: response.degraded,
  };
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
  FAILURE_POLICIES,
  checkCost,
  checkDeadline,
};
