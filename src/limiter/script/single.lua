-- The tail of the single-call script: the call is the whole of KEYS and
-- ARGV, laid out as decide.lua's header says.
return decide_call(0, 0, #KEYS)
