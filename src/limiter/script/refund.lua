-- Takes back what decide.lua spent: for a request whose limits live on
-- several Redis Cluster nodes and which another node denied after this one
-- had spent (see the limiter), and for a lease's release of units its
-- client did not use. Each spend is found by its mark, so units whose
-- window has passed are not given to the next one, and units already
-- refilled are not given back twice.
--
-- KEYS[i]  the key of limit i
-- ARGV     six values per limit, limit i's from 6 * (i - 1) + 1:
--          algorithm, three parameters (as decide.lua), cost, mark (the
--          fifth value decide.lua replied for it; 0 for the algorithms
--          that give units back without finding the spend)
-- Reply    the number of limits refunded
--
-- Every algorithm's Lua source, refund part included, is defined above
-- this part in the same script: each algorithm's `<name>_refund(key, p1,
-- p2, p3, cost, mark)` takes its parameters as sent and returns 1 if it
-- gave the units back.
local refunded = 0
for i = 1, #KEYS do
  local at = 6 * (i - 1)
  local key = KEYS[i]
  local algorithm = ARGV[at + 1]
  local cost = tonumber(ARGV[at + 5])
  local mark = ARGV[at + 6]
  local p1, p2, p3 = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  -- limiter::script puts one branch per registered algorithm here.
end
return refunded
