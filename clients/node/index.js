'use strict';

const { RateLimitClient, RateLimitError } = require('./lib/client');
const { rateLimiter } = require('./lib/middleware');
const { TYPES } = require('./lib/algorithms');
const { ipKey } = require('./lib/ip-key');

module.exports = { RateLimitClient, RateLimitError, rateLimiter, ipKey, TYPES };
