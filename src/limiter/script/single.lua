-- The tail of the single-call script: the call is the whole of KEYS and
-- ARGV, laid out as decide.lua's header says.
return decide_call(KEYS, 0, 0, #KEYS)
