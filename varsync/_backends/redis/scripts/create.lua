-- KEYS: head, events, tables (not in a Redis Cluster: its own slot, added to apart).
-- ARGV: name, signature, epoch, format.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'sig', 'epoch')
if h[1] then
  if h[2] and h[3] then return {EXISTS, h[1], h[2], h[3]} end
  return {NOT_A_HEAD}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {NOT_A_HEAD} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'fmt', ARGV[4], 'sig', ARGV[2], 'epoch', ARGV[3], 'version', '0')
if KEYS[3] then redis.call('SADD', KEYS[3], ARGV[1]) end
return {CREATED, ARGV[4], ARGV[2], ARGV[3]}
