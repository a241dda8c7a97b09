// Types of the public API of ratelimitd-client (hand-written; the code is
// plain CommonJS in index.js and lib/).

import type { ChannelCredentials, ChannelOptions } from '@grpc/grpc-js';

/**
 * The algorithms, under the server's names (the proto's oneof fields, the
 * policies file's `algorithm:`), the same in the Python client.
 */
export type RateLimitType = 'fixed_window' | 'sliding_window' | 'token_bucket' | 'gcra' | 'sliding_window_counter';

/** The short names, accepted for migration: fixed = fixed_window, sliding = sliding_window, token = token_bucket. */
export type RateLimitTypeAlias = 'fixed' | 'sliding' | 'token';

/** Every `type` by the server's names, in the order the package knows them. */
export declare const TYPES: readonly RateLimitType[];

/** The window in whole milliseconds, 1 ms to 366 days: `windowMs` (express-rate-limit's name) or `windowSize` (a single-node Redis middleware's). */
export type Window =
  | { windowMs: number; windowSize?: never }
  | { windowSize: number; windowMs?: never };

/** At most `limit` units per window; the window starts with the key's first spending request. */
export type FixedWindowLimit = {
  type: 'fixed_window' | 'fixed';
  /** Units per window, 1 to 1e15. */
  limit: number;
} & Window;

/** At most `limit` units in any span of the window. */
export type SlidingWindowLimit = {
  type: 'sliding_window' | 'sliding';
  /** Units per window, 1 to 100000 (the log holds one entry per unit). */
  limit: number;
} & Window;

/** A bucket of `capacity` tokens, starting full, refilled at `refillRate` tokens per second. */
export interface TokenBucketLimit {
  type: 'token_bucket' | 'token';
  /** 1 to 1e15. */
  capacity: number;
  /** Tokens per second, finite and above 0 (fractions such as 0.5 work). */
  refillRate: number;
}

/** GCRA: `limit` per window sustained (evenly spaced), up to `burst` at once. */
export type GcraLimit = {
  type: 'gcra';
  /** Requests per window, 1 to 1e15. */
  limit: number;
  /** Requests allowed at once, 1 to 1e15; default `limit`. */
  burst?: number;
} & Window;

/** About `limit` units in any span of the window, estimated from two counts (O(1) memory). */
export type SlidingWindowCounterLimit = {
  type: 'sliding_window_counter';
  /** Units per window, 1 to 1e15. */
  limit: number;
} & Window;

export type Limit =
  | FixedWindowLimit
  | SlidingWindowLimit
  | TokenBucketLimit
  | GcraLimit
  | SlidingWindowCounterLimit;

/**
 * What ratelimitd answers when Redis cannot decide: `fail-closed` (an
 * UNAVAILABLE error), `fail-open` (allowed, degraded) or `local` (decided on
 * the instance's own store, degraded). Unset: the server's `--failure-policy`.
 */
export type FailurePolicy = 'fail-closed' | 'fail-open' | 'local';

export interface CallOptions {
  /** Units this request spends, 0 to 1e15; default 1; 0 looks without spending. */
  cost?: number;
  failurePolicy?: FailurePolicy;
  /** This call's deadline in milliseconds; default the client's `deadlineMs`. */
  deadlineMs?: number;
}

/** One limit: `check(key, { type, ...parameters })`. */
export type CheckOptions = Limit & CallOptions;

/** A limit's own name and cost, in `limits`. */
export interface LimitsEntryOptions {
  /** Reported back in its LimitStatus; 1 to 64 letters, digits, '_', '-' or '.'; unique in the request. A named limit counts on a counter of its own. */
  name?: string;
  /** Units this limit spends, 0 to 1e15; default the request's `cost`. */
  cost?: number;
}

/** One of several limits decided together: an algorithm as `type` spells it, and optionally its own name, key and cost. */
export type LimitsEntry = Limit &
  LimitsEntryOptions & {
    /** The key this limit counts on (1 to 1024 bytes); default the request's. */
    key?: string;
  };

/**
 * Several limits, decided together, all or nothing: allowed only if every
 * limit allows, and then each spends; if any denies, none spends anything.
 * At most ratelimitd's --max-limits-per-request (default 64). Two unnamed
 * limits may not count on the same key with the same algorithm.
 */
export interface LimitsCheckOptions extends CallOptions {
  limits: LimitsEntry[];
}

/**
 * A policy of ratelimitd's policies file, by name (1 to 64 letters, digits,
 * '_', '-' or '.'): its limits, decided as `limits` are. One the server does
 * not know is a RateLimitError with code 'NOT_FOUND'.
 */
export interface PolicyCheckOptions extends CallOptions {
  policy: string;
}

/** A decision: a denial is an answer, not an error. */
export interface Decision {
  allowed: boolean;
  /** The limit or capacity in force. */
  limit: number;
  /** Units left after this decision. */
  remaining: number;
  /** Milliseconds until the key is back to its full quota (0 when it is full). */
  resetAfterMs: number;
  /**
   * 0 when allowed; else milliseconds until this cost would be allowed.
   * null when it never will be (`costExceedsLimit`).
   */
  retryAfterMs: number | null;
  /** The cost is above the limit or capacity: denied, however long the caller waits. */
  costExceedsLimit: boolean;
  /** Redis could not decide and the failure policy answered: the shared limit was not consulted. */
  degraded: boolean;
}

/** One limit's part of a decision on several (`limits` or `policy`). */
export interface LimitStatus {
  /** The limit's name ('' if it has none); a policy's limits are named `name`, else their `per` (e.g. '1s'). */
  name: string;
  /** Whether this limit alone allows the cost. When the request is denied, no limit spent anything, whatever this says. */
  allowed: boolean;
  /** The limit or capacity in force. */
  limit: number;
  /** Units left on this limit after the decision. */
  remaining: number;
  /** Milliseconds until this limit is back to its full quota (0 when it is full). */
  resetAfterMs: number;
  /** 0 when this limit allows; else milliseconds until it would; null when it never will (`costExceedsLimit`). */
  retryAfterMs: number | null;
  /** The cost exceeds this limit itself. */
  costExceedsLimit: boolean;
  /** A policy limit in shadow mode: decided and reported, but it never denies. */
  shadow: boolean;
}

/**
 * The decision on several limits or a policy. The Decision fields describe
 * the request as a whole: `allowed` only if every limit allows;
 * `retryAfterMs` until every limit would allow (null if one never would);
 * `costExceedsLimit` if any limit's does; `limit`, `remaining` and
 * `resetAfterMs` those of `limits[mostRestrictive]`.
 */
export interface LimitsDecision extends Decision {
  /** One status per limit, in the request's order (a policy's: the policies file's). */
  limits: LimitStatus[];
  /** Which of `limits` the top-level fields describe: the denying one with the longest wait, else the one with the fewest units left. */
  mostRestrictive: number;
}

/** One request of a batch: its key and what `check` takes, without `deadlineMs` (the call's). */
export type CheckManyRequest = { key: string } & Omit<CallOptions, 'deadlineMs'> &
  (Limit | { limits: LimitsEntry[] } | { policy: string });

/** One request's answer in a batch: its decision, or its own error. */
export type CheckManyResult =
  | { decision: Decision | LimitsDecision; error: null }
  | { decision: null; error: CheckManyError };

/**
 * One request's own error in a batch: a RateLimitError with ratelimitd's
 * code (e.g. 'INVALID_ARGUMENT', 'NOT_FOUND') and the request's `index`, or
 * the TypeError / RangeError of its invalid options (the request was not
 * sent), which has neither. `error.code` and `error.index` may be read on
 * either (undefined on the latter), and `error.code !== undefined` narrows
 * to the RateLimitError.
 */
export type CheckManyError =
  | (RateLimitError & { index: number })
  | ((TypeError | RangeError) & { code?: undefined; index?: undefined });

/** gRPC status names, as `RateLimitError.code`. */
export type GrpcStatusName =
  | 'OK'
  | 'CANCELLED'
  | 'UNKNOWN'
  | 'INVALID_ARGUMENT'
  | 'DEADLINE_EXCEEDED'
  | 'NOT_FOUND'
  | 'ALREADY_EXISTS'
  | 'PERMISSION_DENIED'
  | 'RESOURCE_EXHAUSTED'
  | 'FAILED_PRECONDITION'
  | 'ABORTED'
  | 'OUT_OF_RANGE'
  | 'UNIMPLEMENTED'
  | 'INTERNAL'
  | 'UNAVAILABLE'
  | 'DATA_LOSS'
  | 'UNAUTHENTICATED';

/** A failed call to ratelimitd (unreachable, too slow, or a refused request), or one failed request of a batch. */
export declare class RateLimitError extends Error {
  name: 'RateLimitError';
  /** The gRPC status name, e.g. 'UNAVAILABLE', 'DEADLINE_EXCEEDED', 'INVALID_ARGUMENT', 'NOT_FOUND'. */
  code: GrpcStatusName;
  /** The numeric gRPC status code. */
  grpcCode: number;
  /** The status message, e.g. `key: must be at most 1024 bytes (got 2000)`. */
  details: string;
  /** In a `checkMany` result: the request's position in the batch. */
  index?: number;
  /** The grpc-js error; in a `checkMany` result, the item's google.rpc.Status `{ code, message }`. */
  cause: unknown;
}

export interface RateLimitClientOptions {
  /** host:port of ratelimitd; default $RATELIMITD_ADDRESS, else '127.0.0.1:50051'. */
  address?: string;
  /** Deadline of each call in milliseconds; default 300. */
  deadlineMs?: number;
  /**
   * Default from the environment: TLS when RATELIMITD_TLS is 1 / true (the
   * system's roots) or RATELIMITD_TLS_CA names a PEM file of the CA, with the
   * client certificate RATELIMITD_TLS_CERT and key RATELIMITD_TLS_KEY for
   * mutual TLS; else plaintext. Or `grpc.credentials.createSsl(...)`.
   */
  credentials?: ChannelCredentials;
  /** grpc-js channel options, over this package's reconnect backoff (100 ms to 2 s). */
  channelOptions?: ChannelOptions;
  /**
   * Decide hot policies in this process, from units ratelimitd leases to
   * the client (a policy whose limits all say `lease: true` in its policies
   * file). Default true, unless the environment says RATELIMITD_LEASES=off
   * (or 0, false); a value given here wins over the environment.
   */
  leases?: boolean;
  /**
   * Checks per second of one policy on one key (`check(key, { policy })`,
   * over the last second) from which the client leases it; default 20.
   */
  leaseThreshold?: number;
}

/** The counters of a client's leases, since it was made (all 0 with `leases: false`). */
export interface LeaseStats {
  /** Checks allowed in the client, from leased units, without a call. */
  localAllowed: number;
  /** Checks denied in the client: the policy had nothing left to lease, until its retry time. */
  localDenied: number;
  /** Checks of a leased policy and key that went to ratelimitd (CheckLimit) because no lease could decide them: none granted yet, its units spent or expired, the lease stream down. */
  fallbacks: number;
  /** Asks sent on the lease stream: for a first lease, a renewal or a release. */
  asks: number;
  /** Grants received, one per ask answered. */
  grants: number;
}

export declare class RateLimitClient {
  constructor(options?: RateLimitClientOptions);
  readonly address: string;
  readonly deadlineMs: number;
  /** Whether hot policies are decided from leases. */
  readonly leases: boolean;
  /**
   * Asks whether `key` (1 to 1024 bytes) may spend `cost` units now: under
   * one limit, several (`limits`) or a policy (`policy`). A hot policy is
   * decided in the client while it holds units leased for it (see `leases`).
   * Rejects with a RateLimitError when ratelimitd fails or misses the
   * deadline (NOT_FOUND for an unknown policy), and with a TypeError or
   * RangeError for invalid options.
   */
  check(key: string, options: CheckOptions): Promise<Decision>;
  check(key: string, options: LimitsCheckOptions | PolicyCheckOptions): Promise<LimitsDecision>;
  /**
   * Decides many independent requests in one call (CheckLimits), each as
   * `check` would. Resolves with one result per request, in order, each its
   * decision or its own error. Rejects only when the call as a whole fails:
   * a RateLimitError (unreachable, the deadline, more than ratelimitd's
   * --max-batch-size requests, default 1000), or a TypeError when
   * `requests` is not a non-empty array.
   */
  checkMany(requests: CheckManyRequest[], options?: { deadlineMs?: number }): Promise<CheckManyResult[]>;
  /** The counters of the leases: checks decided in the client, fallbacks to ratelimitd, asks and grants. */
  leaseStats(): LeaseStats;
  /** Closes the channel, gives back the units leased and not spent, and ends the lease stream. */
  close(): void;
}

/** What `rateLimiter` needs of a client: a RateLimitClient, or anything with its `check`. */
export interface Checker {
  check(key: string, options: CheckOptions): Promise<Decision>;
  check(key: string, options: LimitsCheckOptions | PolicyCheckOptions): Promise<LimitsDecision>;
}

interface MiddlewareOptions<Req> {
  /**
   * Derives the limited key from the request; default the client's IP
   * address, `ipKey(req.ip, { ipv6Subnet })`. May be async.
   */
  keyGenerator?: (req: Req) => string | number | Promise<string | number>;
  /** The same option as `keyGenerator`, under a shorter name; pass one of them. */
  key?: (req: Req) => string | number | Promise<string | number>;
  /**
   * The default key's: an IPv6 client is keyed by its network of this many
   * bits, 1 to 128 (default 56), or by its whole address with false
   * (IPv4-mapped addresses are keyed as IPv4 either way). Not with
   * `keyGenerator` or `key`.
   */
  ipv6Subnet?: number | false;
  /** Units each request spends: a number, or a function of the request (may be async). Default 1. */
  cost?: number | ((req: Req) => number | Promise<number>);
  /** Prepended to every key, so that two limiters on the same keys count separately. Default ''. */
  prefix?: string;
  /**
   * When ratelimitd is unreachable, too slow or failing: 'allow' (the
   * default) lets the request through, 'deny' answers 503. Either way a
   * warning is logged (at most one per 10 s).
   */
  onServiceError?: 'allow' | 'deny';
  failurePolicy?: FailurePolicy;
  /** Deadline of each check in milliseconds; default the client's (300). */
  deadlineMs?: number;
  /**
   * Called on each request let through without a decision of ratelimitd's
   * (reason 'timeout', 'unavailable' or 'error', with the RateLimitError),
   * and on each decision ratelimitd made in its degraded mode (reason
   * 'store', with the decision). The same reason is sent in the
   * `RateLimit-Degraded` response header.
   */
  onDegraded?: (req: Req, info: DegradedInfo) => void;
  /**
   * This limiter's namespace: limiters with the same `name` share their
   * counters. Default: derived from what the limiter limits, so that two
   * limiters with different limits never share a counter. 1 to 64 letters,
   * digits, '_', '-' or '.'.
   */
  name?: string;
  /**
   * The IETF headers: 'draft-8' (the default: `RateLimit-Policy: "default";q=5;w=10`,
   * `RateLimit: "default";r=4;t=10`), 'draft-7' (`RateLimit-Policy: 5;w=10`,
   * `RateLimit: limit=5, remaining=4, reset=10`), 'draft-6' or true
   * (`RateLimit-Policy`, `RateLimit-Limit`, `RateLimit-Remaining`,
   * `RateLimit-Reset`), or false (none). `Retry-After` goes with every 429.
   */
  standardHeaders?: boolean | 'draft-6' | 'draft-7' | 'draft-8';
  /** `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (Unix seconds); default false. */
  legacyHeaders?: boolean;
  /** The body of a denial: a value for Express's `res.send`, or a function of the request (may be async); default `{ error: 'Rate limit exceeded' }`. */
  message?: unknown | ((req: Req, res: any) => unknown);
  /** The status of a denial; default 429. */
  statusCode?: number;
  /** Answers a denial in place of `message` and `statusCode` (`Retry-After` and the headers are already set). */
  handler?: (req: Req, res: any, next: (err?: unknown) => void, options: Readonly<Record<string, unknown>>) => unknown;
  /** Requests for which it returns true (may be async) are neither checked nor counted. */
  skip?: (req: Req, res: any) => boolean | Promise<boolean>;
  /** Whether a response counts as successful, for the two options below; default `res.statusCode < 400`. */
  requestWasSuccessful?: (req: Req, res: any) => boolean | Promise<boolean>;
  /** Count only successful responses: looks (cost 0) before the handler, spends after the response. Not atomic: see the README. */
  skipFailedRequests?: boolean;
  /** Count only failed responses: looks (cost 0) before the handler, spends after the response. Not atomic: see the README. */
  skipSuccessfulRequests?: boolean;
  /** Where the request's RateLimitInfo goes; default 'rateLimit' (`req.rateLimit`). */
  requestPropertyName?: string;
  /** Where warnings go; default `console`. */
  logger?: { warn(message: string): void };
}

/** Why a request went on without a full decision of ratelimitd's. */
export type DegradedInfo =
  | { reason: 'timeout' | 'unavailable' | 'error'; error: RateLimitError }
  | { reason: 'store'; decision: Decision | LimitsDecision };

/** What the middleware puts on `req.rateLimit`, as express-rate-limit does. */
export interface RateLimitInfo {
  /** The limit or capacity in force (the most restrictive limit's). */
  limit: number;
  /** limit - remaining. */
  used: number;
  remaining: number;
  /** When the key is back to its full quota. */
  resetTime: Date;
  /** The key ratelimitd counted on: prefix, namespace, then keyGenerator's. */
  key: string;
}

/** The middleware's counters, for your metrics. */
export interface RateLimiterStats {
  /** Requests ratelimitd decided (allowed or denied). */
  decided: number;
  /** Requests denied (429, or `statusCode`). */
  denied: number;
  /** Requests let through because ratelimitd could not decide (onServiceError 'allow'). */
  failOpen: number;
  /** Requests refused with 503 because ratelimitd could not decide (onServiceError 'deny'). */
  failClosed: number;
}

/** Exactly one of `address` and `client`, or neither: a client for $RATELIMITD_ADDRESS (default 127.0.0.1:50051). */
type Service = { client: Checker; address?: never } | { address: string; client?: never } | { address?: undefined; client?: undefined };

/** One of the middleware's `limits`: as the client's, but `key` may also be a function of the request. */
export type MiddlewareLimitsEntry<Req = any> = Limit &
  LimitsEntryOptions & {
    /**
     * The key this limit counts on: a string, or a function of the request
     * (may be async), prefixed and hashed as `keyGenerator`'s; default the
     * request's key.
     */
    key?: string | ((req: Req) => string | number | Promise<string | number>);
  };

/**
 * What is limited: one limit (`type` and its parameters), several decided
 * together, all or nothing (`limits`), or a policy of ratelimitd's policies
 * file (`policy`). With several, the headers describe the most restrictive.
 */
/** A limit whose `limit` (or `max`, its other name) may be a function of the request (may be async), for per-user tiers. */
type RequestLimit<Req> = number | ((req: Req, res: any) => number | Promise<number>);
type MiddlewareLimit<Req> =
  | Limit
  | (Omit<FixedWindowLimit | SlidingWindowLimit | GcraLimit | SlidingWindowCounterLimit, 'limit'> & { limit: RequestLimit<Req>; max?: never })
  | (Omit<FixedWindowLimit | SlidingWindowLimit | GcraLimit | SlidingWindowCounterLimit, 'limit'> & { max: RequestLimit<Req>; limit?: never })
  /** express-rate-limit's usage: no `type` is a fixed window, `limit` (or `max`) 5 and `windowMs` 60000 by default. */
  | ({ type?: undefined; limit?: RequestLimit<Req>; max?: RequestLimit<Req> } & Partial<Window>);

type Limits<Req> =
  | MiddlewareLimit<Req>
  | { limits: MiddlewareLimitsEntry<Req>[] }
  | {
      /** A policy of ratelimitd's policies file. One it does not know (NOT_FOUND) is handled as `onServiceError`. */
      policy: string;
    };

export type RateLimiterOptions<Req = any> = Limits<Req> & Service & MiddlewareOptions<Req>;

/** An Express (or Connect / node:http) middleware. */
export interface RateLimitMiddleware<Req = any, Res = any> {
  (req: Req, res: Res, next: (err?: unknown) => void): Promise<void>;
  /** The client the middleware asks: the one given, or the one it made for `address`. */
  readonly client: Checker & Partial<Pick<RateLimitClient, 'close'>>;
  /** Counters: decided, denied, failOpen, failClosed. */
  readonly stats: Readonly<RateLimiterStats>;
  /** The namespace put between `prefix` and each key: `name:` or the derived `rl-xxxxxxxx:`. */
  readonly namespace: string;
}

/**
 * A single-node Redis middleware's interface, on ratelimitd: `rateLimiter({ address, type, limit, windowMs })`,
 * or `rateLimiter({ address, policy: 'free-tier', keyGenerator })`, or
 * `rateLimiter({ address, limits: [...] })`.
 * Options are checked here; an invalid one throws a TypeError or RangeError.
 */
export declare function rateLimiter<Req = any, Res = any>(
  options: RateLimiterOptions<Req>,
): RateLimitMiddleware<Req, Res>;

export interface IpKeyOptions {
  /** IPv6 addresses are keyed by their network of this many bits, 1 to 128 (default 56); false: whole. */
  ipv6Subnet?: number | false;
}

/**
 * The middleware's default key of a client's address: an IPv4 address as
 * itself; an IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, however
 * written) as its IPv4 address; any other IPv6 address as its network in
 * RFC 5952's form, e.g. `'2001:db8:abcd:1200::/56'`, or with
 * `ipv6Subnet: false` as the whole address in that form; a zone id
 * dropped. Anything else (undefined, not an address) comes back as it is.
 * Throws a TypeError or RangeError for an invalid `ipv6Subnet`.
 */
export declare function ipKey(address: string, options?: IpKeyOptions): string;
export declare function ipKey(address: string | undefined, options?: IpKeyOptions): string | undefined;
