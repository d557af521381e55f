-- KEYS: head. ARGV: the version the reader holds (0: none), chunk key prefix, most bytes.
-- Reads only. The head's fields a pull reads first and, when the version is newer than
-- the reader's and its value one whole chunk of at most that many bytes, that chunk: read
-- in the same atomic step as the head, so a small pull takes one round trip, not two.
local h = redis.call('HMGET', KEYS[1], 'fmt', 'epoch', 'version', 'data', 'layout')
local chunk = false
local version = tonumber(h[3] or '')
if h[1] == '1' and h[4] and version and version > tonumber(ARGV[1]) then
  local total, chunks = string.match(h[5] or '', '^(%d+):%d+:(%d+)$')
  if chunks == '1' and tonumber(total) <= tonumber(ARGV[3]) then
    chunk = redis.call('GET', ARGV[2] .. h[4] .. ':0')
  end
end
return {HEAD, h[1], h[2], h[3], h[4], h[5], chunk}
