-- A number as Redis must read it: decimal digits. Lua writes numbers above 1e14 as "1e+14".
local function int(n)
  return string.format('%d', n)
end
