-- The tail of the batch script for a standalone Redis: every call's keys
-- are its KEYS (batch.lua's header).
return decide_calls(KEYS, 0, 2 + tonumber(ARGV[1]) + 2 * tonumber(ARGV[2]), false)
