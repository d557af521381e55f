-- KEYS: the table's index. ARGV: the prefix of its entries' keys. Returns each member
-- whose entry is there, with the entry; removes the members whose entry is gone.
local out = {LISTED}
for _, reader in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local record = redis.pcall('GET', ARGV[1] .. reader)
  if type(record) == 'string' then
    table.insert(out, reader)
    table.insert(out, record)
  elseif not record then
    redis.call('ZREM', KEYS[1], reader)
  end
end
return out
