'use strict';

const { RateLimitClient, RateLimitError } = require('./lib/client');
const { rateLimiter } = require('./lib/middleware');
const { TYPES } = require('./lib/algorithms');

module.exports = { RateLimitClient, RateLimitError, rateLimiter, TYPES };
