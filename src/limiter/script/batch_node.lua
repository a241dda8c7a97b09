-- The tail of the batch script for one node of a Redis Cluster: every
-- call's keys are values (batch.lua's header), since one script may not
-- declare keys of several hash slots; KEYS[1], one of them, routes the
-- script to the node. The script runs with the flag
-- `allow-cross-slot-keys` (its first line), so that it may touch keys of
-- several slots on the node.
local calls, forms = tonumber(ARGV[1]), tonumber(ARGV[2])
local k0 = 2 + calls + 2 * forms
local a0 = k0
for j = 1, calls do
  a0 = a0 + tonumber(ARGV[2 + calls + tonumber(ARGV[2 + j])])
end
return decide_calls(ARGV, k0, a0, true)
